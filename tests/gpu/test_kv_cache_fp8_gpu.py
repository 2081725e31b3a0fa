"""An fp8 KV cache on the GPU (`--vllm.kv_cache_dtype fp8`): vLLM configures it, the engine's logprobs of fixed
sequences move off the default cache's a little, and through the colocated cycle (a level-2 sleep, a wake, the
weights back as CUDA IPC buckets from another process) it scores them exactly as before, as the default cache does.

Each engine lives in a spawned child (the rollout worker's place), one after the other; this process packs the
weights (the actor's).
"""
from __future__ import annotations

import multiprocessing

import pytest
from gpu_helpers import fixed_sequence, mean_abs_diff, send_buckets

pytestmark = pytest.mark.gpu

PROMPTS = [fixed_sequence(24, seed) for seed in range(4)]
RESPONSES = [fixed_sequence(200, 100 + seed) for seed in range(4)]
BUCKET_BYTES = 64 * 2**20


def _engine_in_child(conn, standin: str, kv_cache_dtype: str) -> None:
    """Child process: the engine's scores of the fixed sequences, then a level-2 sleep, a wake, the weights from
    IPC buckets and its scores again; with the cache type vLLM configured."""
    from hybrid_core.engines.vllm_rollout import EngineSettings, VllmRolloutEngine

    engine = VllmRolloutEngine(EngineSettings(model_path=standin, param_dtype="bf16", seed=0,
                                              gpu_memory_utilization=0.3, enforce_eager=True, enable_sleep=True,
                                              sleep_level=2, max_model_len=1024, kv_cache_dtype=kv_cache_dtype))
    report = {"cache_dtype": engine.llm.llm_engine.vllm_config.cache_config.cache_dtype,
              "before": engine.score(PROMPTS, RESPONSES)}
    engine.sleep()
    engine.wake_up(["weights", "kv_cache"])
    conn.send("ready")
    while (shared := conn.recv()) is not None:
        engine.load_shared_bucket(shared)
        conn.send("loaded")
    engine.finish_weight_update()
    conn.send(report | {"after": engine.score(PROMPTS, RESPONSES)})


def _scores(standin, kv_cache_dtype: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_engine_in_child, args=(child, str(standin), kv_cache_dtype))
    process.start()
    assert parent.poll(600) and parent.recv() == "ready"
    module = AutoModelForCausalLM.from_pretrained(str(standin), dtype=torch.bfloat16).cuda()
    send_buckets(parent, module, BUCKET_BYTES)
    del module
    report = parent.recv()
    process.join(timeout=120)
    assert process.exitcode == 0
    return report


def test_an_fp8_kv_cache_scores_a_little_off_the_default_and_keeps_its_scores_through_sleep_and_sync(cuda, standin):
    default, fp8 = _scores(standin, "auto"), _scores(standin, "fp8")
    print({"default": default["cache_dtype"], "fp8": fp8["cache_dtype"]})
    assert (default["cache_dtype"], fp8["cache_dtype"]) == ("auto", "fp8")
    for report in (default, fp8):  # the weights came back exactly, into either cache
        assert report["after"] == report["before"]
    apart = [mean_abs_diff(a, b) for a, b in zip(default["before"], fp8["before"])]
    print("mean |Δ logprob| fp8 vs default cache, per sequence:", apart)
    assert min(apart) > 0.0  # the keys and values went through one byte each
    assert max(apart) < 0.1
