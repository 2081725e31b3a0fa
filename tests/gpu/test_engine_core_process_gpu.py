"""An engine takes its weights back as CUDA IPC buckets from another process after a level-2 sleep and then gives
exactly its outputs of before, in each layout of a colocated TP-1 engine: its core in a process of its own
(`--vllm.engine_core_process`) with the model runner in the core's process (`uni`) or beneath it in another (`mp`),
and the default, the core in the rollout worker's process above an `mp` model runner (the control).

The engine lives in a spawned child (the rollout worker's place) and this process packs the weights (the actor's):
vLLM keeps the environment it read once an engine core ran in a process, and this session's other tests run theirs
in this one. The child reports, for requests sent one at a time and for the whole batch in one call, the response
logprobs of fixed sequences (bit-equal when the weights are) and how many tokens of each greedy output match. A core
apart needs `VllmRolloutEngine._run_batch`'s pause for the batched figures: without it vLLM schedules requests as
they reach the core, and the batch split over the first steps by timing (s39 on the H200, with bit-equal weights:
prompt logprobs 0.024 apart, greedy outputs parting after 4 tokens).
"""
from __future__ import annotations

import multiprocessing

import pytest
from gpu_helpers import fixed_sequence, send_buckets

pytestmark = pytest.mark.gpu

GREEDY_PROMPTS = [fixed_sequence(24, seed) for seed in range(4)]
SCORED_RESPONSES = [fixed_sequence(48, 100 + seed) for seed in range(4)]
NEW_TOKENS = 32
BUCKET_BYTES = 64 * 2**20
LAYOUTS = {"core-apart-uni": ("uni", True), "core-apart-mp": ("mp", True), "default-mp": ("mp", False)}


def _outputs(engine) -> dict[str, tuple[list[list[int]], list[list[float]]]]:
    """Greedy outputs and the logprobs of fixed responses, one request at a time ("alone") and in one call."""
    from hybrid_core.engines.vllm_rollout import SamplingSettings

    sampling = SamplingSettings(n=1, max_new_tokens=NEW_TOKENS, temperature=0.0)
    alone = ([engine.generate([prompt], sampling, seeds=[0])[0][0].token_ids for prompt in GREEDY_PROMPTS],
             [engine.score([prompt], [response])[0] for prompt, response in zip(GREEDY_PROMPTS, SCORED_RESPONSES)])
    together = engine.generate(GREEDY_PROMPTS, sampling, seeds=[0] * len(GREEDY_PROMPTS))
    batched = ([samples[0].token_ids for samples in together], engine.score(GREEDY_PROMPTS, SCORED_RESPONSES))
    return {"alone": alone, "batched": batched}


def _compared(before: tuple, after: tuple) -> dict:
    (greedy, scores), (greedy_after, scores_after) = before, after
    return {"score_max_abs_diff": max(abs(x - y) for a, b in zip(scores, scores_after) for x, y in zip(a, b)),
            "matching_prefix": [_matching_prefix(a, b) for a, b in zip(greedy_after, greedy)],
            "num_outputs": sum(len(ids) for ids in greedy)}


def _matching_prefix(a: list[int], b: list[int]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _engine_in_child(conn, standin: str, executor: str, core_apart: bool) -> None:
    """Child process: an engine in the layout; its outputs, a level-2 sleep, weights from IPC buckets, its outputs."""
    from hybrid_core.engines.vllm_rollout import EngineAsleepError, EngineSettings, VllmRolloutEngine

    engine = VllmRolloutEngine(EngineSettings(model_path=standin, param_dtype="bf16", seed=0,
                                              gpu_memory_utilization=0.3, enforce_eager=True, enable_sleep=True,
                                              sleep_level=2, max_model_len=1024, engine_core_process=core_apart,
                                              executor_backend=executor))
    report = {"client": type(engine.llm.llm_engine.engine_core).__name__}
    expected = _outputs(engine)
    engine.sleep()
    engine.wake_up(["weights", "kv_cache"])
    try:
        _outputs(engine)
    except EngineAsleepError as err:
        report["asleep_error"] = str(err)
    if core_apart:
        try:
            engine.load_weights([])
        except RuntimeError as err:
            report["load_weights_error"] = str(err)
    conn.send("ready")
    while (shared := conn.recv()) is not None:
        engine.load_shared_bucket(shared)
        conn.send("loaded")
    engine.finish_weight_update()
    outputs = _outputs(engine)
    report |= {how: _compared(expected[how], outputs[how]) for how in expected}
    conn.send(report)


def _send_buckets(conn, standin) -> None:
    """This process as the actor: the stand-in's weights in reused buffers, one bucket in flight at a time."""
    import torch
    from transformers import AutoModelForCausalLM

    module = AutoModelForCausalLM.from_pretrained(str(standin), dtype=torch.bfloat16).cuda()
    send_buckets(conn, module, BUCKET_BYTES)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_engine_reloads_its_weights_from_ipc_buckets_in_each_layout(cuda, standin, layout):
    executor, core_apart = LAYOUTS[layout]
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_engine_in_child, args=(child, str(standin), executor, core_apart))
    process.start()
    assert parent.poll(600) and parent.recv() == "ready"
    _send_buckets(parent, standin)
    report = parent.recv()
    process.join(timeout=120)
    print(layout, report)
    assert process.exitcode == 0
    assert report["client"] == ("SyncMPClient" if core_apart else "InprocClient")  # vLLM's client of the core
    assert "discarded the weights" in report["asleep_error"]
    if core_apart:
        assert "load_shared_bucket" in report["load_weights_error"]
    for how in ("alone", "batched"):  # alone: the weights came back exactly; batched: and so did the batching
        assert report[how] == {"score_max_abs_diff": 0.0, "matching_prefix": [NEW_TOKENS] * len(GREEDY_PROMPTS),
                               "num_outputs": len(GREEDY_PROMPTS) * NEW_TOKENS}, (how, report)
