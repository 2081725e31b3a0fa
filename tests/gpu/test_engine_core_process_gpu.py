"""An engine whose core runs in a process of its own (`--vllm.engine_core_process`, with the colocated CUDA IPC
sync), its model runner in the core's process (`uni`) or beneath it in another (`mp`, the colocated default): it
generates, sleeps at level 2, takes its weights back as CUDA IPC buckets from another process and then gives exactly
its greedy outputs of before.

The engine lives in a spawned child (the rollout worker's place) and this process packs the weights (the actor's):
vLLM keeps the environment it read once an engine core ran in a process, and this session's other tests run theirs
in this one.
"""
from __future__ import annotations

import multiprocessing

import pytest
from gpu_helpers import fixed_sequence

pytestmark = pytest.mark.gpu

GREEDY_PROMPTS = [fixed_sequence(24, seed) for seed in range(4)]
BUCKET_BYTES = 64 * 2**20


def _greedy(engine) -> list[list[int]]:
    from hybrid_core.engines.vllm_rollout import SamplingSettings

    out = engine.generate(GREEDY_PROMPTS, SamplingSettings(n=1, max_new_tokens=32, temperature=0.0),
                          seeds=range(len(GREEDY_PROMPTS)))
    return [samples[0].token_ids for samples in out]


def _engine_in_child(conn, standin: str, executor: str) -> None:
    """Child process: an engine with its core apart; greedy outputs, level-2 sleep, weights from IPC buckets."""
    from hybrid_core.engines.vllm_rollout import EngineAsleepError, EngineSettings, VllmRolloutEngine

    engine = VllmRolloutEngine(EngineSettings(model_path=standin, param_dtype="bf16", seed=0,
                                              gpu_memory_utilization=0.3, enforce_eager=True, enable_sleep=True,
                                              sleep_level=2, max_model_len=1024, engine_core_process=True,
                                              executor_backend=executor))
    report = {"client": type(engine.llm.llm_engine.engine_core).__name__}
    expected = _greedy(engine)
    engine.sleep()
    engine.wake_up(["weights", "kv_cache"])
    try:
        _greedy(engine)
    except EngineAsleepError as err:
        report["asleep_error"] = str(err)
    try:
        engine.load_weights([])
    except RuntimeError as err:
        report["load_weights_error"] = str(err)
    conn.send("ready")
    while (shared := conn.recv()) is not None:
        engine.load_shared_bucket(shared)
        conn.send("loaded")
    engine.finish_weight_update()
    report["same_outputs"] = _greedy(engine) == expected
    report["num_outputs"] = sum(len(ids) for ids in expected)
    conn.send(report)


@pytest.mark.parametrize("executor", ["uni", "mp"])
def test_an_engine_core_apart_reloads_its_weights_from_ipc_buckets(cuda, standin, executor):
    from transformers import AutoModelForCausalLM

    from hybrid_core.engines.weight_sync import BucketBuffers, iter_buckets, largest_bucket_bytes, share_bucket

    torch = cuda
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_engine_in_child, args=(child, str(standin), executor))
    process.start()
    assert parent.poll(600) and parent.recv() == "ready"
    module = AutoModelForCausalLM.from_pretrained(str(standin), dtype=torch.bfloat16).cuda()
    buffers = BucketBuffers(largest_bucket_bytes(module, BUCKET_BYTES), torch.device("cuda"))
    for bucket in iter_buckets(module, BUCKET_BYTES, buffers=buffers):
        torch.cuda.synchronize()
        parent.send(share_bucket(bucket))
        assert parent.recv() == "loaded"  # the buffer comes round again only after the engine loaded it
    parent.send(None)
    report = parent.recv()
    process.join(timeout=120)
    assert process.exitcode == 0
    assert report["client"] == "SyncMPClient"  # vLLM's client of an engine core in another process
    assert "discarded the weights" in report["asleep_error"]
    assert "load_shared_bucket" in report["load_weights_error"]
    assert report["same_outputs"] and report["num_outputs"] == 4 * 32
