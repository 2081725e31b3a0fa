"""GPU fixtures: a random-weight Qwen3-0.6B-shaped stand-in, one in-process vLLM engine and DeepSpeed trainers.

Every test here carries the `gpu` marker and is skipped without CUDA (CPU CI deselects them with -m "not gpu").
No Ray or Prefect imports: these tests also run with the smaller GPU payload (vLLM + DeepSpeed only).
Set HYBRID_GPU_STANDIN to a prebuilt stand-in directory to skip building one.
"""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDIN_SHAPE = "Qwen/Qwen3-0.6B"


@pytest.fixture(scope="session")
def cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    return torch


@pytest.fixture(scope="session")
def standin(cuda, tmp_path_factory) -> Path:
    prebuilt = os.environ.get("HYBRID_GPU_STANDIN")
    if prebuilt:
        return Path(prebuilt)
    builder = runpy.run_path(str(REPO_ROOT / "data" / "build_tiny_model.py"))["build_standin"]
    return builder(STANDIN_SHAPE, tmp_path_factory.mktemp("standin"), device="cuda")


@pytest.fixture(scope="session")
def rollout_engine(cuda, standin):
    """(engine, bytes the engine took on the GPU): eager, sleep mode on, level 1 by default."""
    from hybrid_core.engines.vllm_rollout import EngineSettings, VllmRolloutEngine

    cuda.cuda.synchronize()
    free_before = cuda.cuda.mem_get_info()[0]
    engine = VllmRolloutEngine(EngineSettings(model_path=str(standin), param_dtype="bf16", seed=0,
                                              gpu_memory_utilization=0.3, enforce_eager=True, enable_sleep=True,
                                              sleep_level=1, max_model_len=1024))
    cuda.cuda.synchronize()
    return engine, free_before - cuda.cuda.mem_get_info()[0]


@pytest.fixture(scope="session")
def make_trainer(cuda, standin):
    """Factory of DeepSpeed ZeRO-2 bf16 trainers of the stand-in (sleep on; lr given per trainer)."""
    sys.path.insert(0, str(REPO_ROOT))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    from hybrid_core.config import ActorConfig, DsConfig, TrainConfig
    from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine, load_policy, start_sleep_buffer

    def make(lr: float, enable_sleep: bool = True):
        actor = ActorConfig(model_name_or_path=str(standin), lr_scheduler="constant", adam={"lr": lr})
        ds = DsConfig(zero_stage=2, param_dtype="bf16", enable_sleep=enable_sleep)
        train = TrainConfig(batch_size=1, micro_batch_size=1, device="cuda")
        buffer = start_sleep_buffer(str(standin), ds)
        return DeepSpeedTrainEngine(load_policy(str(standin), actor, ds), actor, ds, train, 10, pad_id=0,
                                    sleep_buffer=buffer)
    return make
