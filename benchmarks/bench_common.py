"""What the GPU benchmarks share: a synchronised wall-clock timer and a single-rank DeepSpeed trainer of a
stand-in model built the way the actor worker builds it (`load_policy` → `DeepSpeedTrainEngine`)."""
from __future__ import annotations

import os
import time
from pathlib import Path


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn) -> tuple[float, object]:
    """(seconds, result) of `fn()`, with the device's queued work finished before and after."""
    synchronize()
    start = time.perf_counter()
    out = fn()
    synchronize()
    return time.perf_counter() - start, out


def single_rank_engine(model_dir: Path, actor, ds, train, total_steps: int, seed: int = 0, sleep_buffer=None):
    """A one-rank DeepSpeed engine of `model_dir` from ActorConfig/DsConfig/TrainConfig blocks, as the actor worker
    builds it (`load_policy` → `DeepSpeedTrainEngine`); the process group variables default to one local rank."""
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531", "RANK": "0", "LOCAL_RANK": "0",
                       "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine, load_policy

    return DeepSpeedTrainEngine(load_policy(str(model_dir), actor, ds, seed), actor, ds, train, total_steps, 0,
                                sleep_buffer)


def single_rank_trainer(model_dir: Path, *, lr: float, ds: dict, train: dict, total_steps: int,
                        gradient_checkpointing: bool = False, with_sleep_buffer: bool = False):
    """A one-rank DeepSpeed engine of `model_dir`; `ds`/`train` are DsConfig/TrainConfig fields. The sleep buffer
    (with ds enable_sleep) starts allocating before the model loads, as in the actor worker."""
    from hybrid_core.config import ActorConfig, DsConfig, TrainConfig
    from hybrid_core.engines.deepspeed_train import start_sleep_buffer

    actor = ActorConfig(model_name_or_path=str(model_dir), lr_scheduler="constant", adam={"lr": lr},
                        gradient_checkpointing_enable=gradient_checkpointing)
    ds_config, train_config = DsConfig(**ds), TrainConfig(**train)
    buffer = start_sleep_buffer(str(model_dir), ds_config) if with_sleep_buffer else None
    return single_rank_engine(model_dir, actor, ds_config, train_config, total_steps, sleep_buffer=buffer)


def bench_config(config: Path, model_dir: Path, flags=()):
    """The RunConfig of a benchmark config file with `model_dir` as the actor's model and `flags` on top."""
    from hybrid_core.flags import parse_cli

    return parse_cli(["--config", str(config), "--actor.model_name_or_path", str(model_dir), *flags])
