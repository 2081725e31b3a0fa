"""`rollout.seed_per_prompt` on the real vLLM CPU build: per-prompt seeds make a rollout independent of batching and
repeatable (what retries and resumes rely on); without them the engine's own generator draws the noise. The same
seeds make an engine of two tensor-parallel workers (vLLM's CPU build runs them as child processes, gloo between
them) generate the samples of one worker, as does one worker in a child process (`vllm.executor_backend mp`), also
beneath an engine core in a process of its own (`vllm.engine_core_process`), and engines taking contiguous shares of
the prompts generate what one engine does with all of them; a weight update changes the TP engine's and the
child-process engine's samples exactly as the one-worker engine's. An fp8 KV cache (`vllm.kv_cache_dtype`) moves the
logprobs of the same tokens a little off the model's."""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import ray
import torch

from hybrid_core.data.prompts import Prompt
from hybrid_core.engines.rollout_step import PromptFormat, generate_rows
from hybrid_core.engines.vllm_rollout import SamplingSettings

pytestmark = pytest.mark.integration

PROMPTS = [Prompt(0, "abc", ""), Prompt(1, "hello", ""), Prompt(2, "xyz", "")]
FORMAT = PromptFormat(apply_chat_template=False, input_template=None, max_len=64)


def engine_actor(ray_session, model_path: str, tensor_parallel_size: int, executor_backend: str | None = None,
                 engine_core_process: bool = False, kv_cache_dtype: str = "auto"):
    """One vLLM CPU engine in a Ray actor of its own, with a rollout worker's environment (its core in that actor's
    process unless `engine_core_process`; its TP workers, if any, are child processes of that actor)."""
    from hybrid_core.workers.placement import role_env

    @ray_session.remote(num_cpus=0)
    class SeedingEngine:
        def __init__(self, model_path: str, tensor_parallel_size: int, executor_backend: str | None,
                     engine_core_process: bool, kv_cache_dtype: str):
            from hybrid_core.engines.vllm_rollout import EngineSettings, VllmRolloutEngine

            # 0.1 of the memory node (0.05 left a negative KV cache once the worker's own ~0.9 GiB was counted)

            self.engine = VllmRolloutEngine(EngineSettings(model_path=model_path, param_dtype="fp32",
                                                           gpu_memory_utilization=0.1, seed=0, enforce_eager=True,
                                                           max_model_len=64, tensor_parallel_size=tensor_parallel_size,
                                                           executor_backend=executor_backend,
                                                           engine_core_process=engine_core_process,
                                                           kv_cache_dtype=kv_cache_dtype))

        def generate(self, prompts, sampling: SamplingSettings, step: int) -> list[dict]:
            return generate_rows(self.engine, self.engine.tokenizer, prompts, FORMAT, sampling, seed=7, step=step,
                                 policy_version=0).to_pylist()

        def score(self, prompt_ids: list, response_ids: list) -> list:
            return self.engine.score(prompt_ids, response_ids)

        def load_weights(self, named: list) -> None:
            self.engine.load_weights(named)
            self.engine.finish_weight_update()

        def cache_dtype(self) -> str:  # the KV cache's element type as vLLM configured it
            return self.engine.llm.llm_engine.vllm_config.cache_config.cache_dtype

        def processes(self) -> tuple[int, list[int]]:  # this actor's pid and its descendants'
            return os.getpid(), [child.pid for child in psutil.Process().children(recursive=True)]

        def core_client(self) -> str:  # vLLM's client of the engine core: in this process or another
            return type(self.engine.llm.llm_engine.engine_core).__name__

        def scheduler_paused_as_the_batch_went_in(self, prompts, sampling: SamplingSettings) -> list[bool]:
            """Whether vLLM's scheduler was paused right after a generate's requests went into the engine core
            (each time they did), then after the generate."""
            llm, seen = self.engine.llm, []
            client = llm.llm_engine.engine_core  # InprocClient holds the core; SyncMPClient asks the core's process

            def core_paused() -> bool:
                if hasattr(client, "call_utility"):
                    return client.call_utility("is_scheduler_paused")
                return client.engine_core.is_scheduler_paused()

            enqueue = llm.enqueue

            def enqueue_and_look(*args, **kwargs):
                request_ids = enqueue(*args, **kwargs)
                seen.append(core_paused())
                return request_ids
            llm.enqueue = enqueue_and_look
            try:
                self.generate(prompts, sampling, step=1)
            finally:
                del llm.enqueue
            return [*seen, core_paused()]

    env = {"env_vars": role_env("rollout", on_cpu=True)}
    return SeedingEngine.options(runtime_env=env).remote(model_path, tensor_parallel_size, executor_backend,
                                                         engine_core_process, kv_cache_dtype)


@pytest.fixture(scope="module")
def engine(tiny_model, ray_session):
    """The one-worker engine; killed at the end of the module."""
    actor = engine_actor(ray_session, str(tiny_model), 1)
    yield actor
    ray_session.kill(actor)


@pytest.fixture(scope="module")
def tp_engine(tiny_model, ray_session):
    """The same engine with two TP workers (each holds one of the tiny model's two attention heads and half of
    every MLP and vocabulary matrix); killed with its workers at the end of the module. Started only when the first
    TP test needs it: building it beside the first engine's tests only made both slower on 2 cores."""
    actor = engine_actor(ray_session, str(tiny_model), 2)
    yield actor
    ray_session.kill(actor)


@pytest.fixture(scope="module")
def mp_engine(tiny_model, ray_session):
    """The one-worker engine with its model runner in a child process (vLLM's `mp` executor beside the scheduler)."""
    actor = engine_actor(ray_session, str(tiny_model), 1, executor_backend="mp")
    yield actor
    ray_session.kill(actor)


def generated(engine, prompts, seed_per_prompt: bool = True, step: int = 1,
              logprobs: bool = True) -> dict[tuple[int, int], dict]:
    sampling = SamplingSettings(n=2, max_new_tokens=12, temperature=1.0, seed_per_prompt=seed_per_prompt,
                                logprobs=logprobs)
    rows = ray.get(engine.generate.remote(prompts, sampling, step), timeout=300)
    return {(r["prompt_index"], r["sample_index"]): r for r in rows}


def responses(engine, prompts, seed_per_prompt: bool, step: int = 1) -> dict[tuple[int, int], list[int]]:
    return {key: row["response_ids"] for key, row in generated(engine, prompts, seed_per_prompt, step).items()}


def test_per_prompt_seeds_repeat_and_ignore_the_batch(engine):
    first = responses(engine, PROMPTS, seed_per_prompt=True)
    assert responses(engine, PROMPTS, seed_per_prompt=True) == first  # a retried rollout regenerates the same rows
    alone = responses(engine, PROMPTS[1:2], seed_per_prompt=True)
    assert alone == {key: ids for key, ids in first.items() if key[0] == 1}  # same samples in another batch
    assert responses(engine, PROMPTS, seed_per_prompt=True, step=2) != first  # the step is part of the seed
    assert first[(0, 0)] != first[(0, 1)]  # a prompt's n samples differ from each other


def test_without_per_prompt_seeds_the_engine_generator_moves_on(engine):
    first = responses(engine, PROMPTS, seed_per_prompt=False)
    second = responses(engine, PROMPTS, seed_per_prompt=False)
    assert len(first) == len(second) == 6 and all(len(ids) == 12 for ids in first.values())
    assert first != second  # 6 samples x 12 tokens over a 100-token vocabulary: a repeat is practically impossible


def test_without_logprobs_the_engine_samples_the_same_tokens(engine):
    """rollout.logprobs false: the engine is asked for no logprob, and its seeded samples stay what they were."""
    with_logprobs, without = generated(engine, PROMPTS), generated(engine, PROMPTS, logprobs=False)
    tokens = lambda rows: {key: row["response_ids"] for key, row in rows.items()}  # noqa: E731
    assert tokens(without) == tokens(with_logprobs)
    assert all(r["rollout_logprobs"] is None for r in without.values())
    assert all(len(r["rollout_logprobs"]) == len(r["response_ids"]) == 12 for r in with_logprobs.values())


def tokens_and_logprobs(rows: dict) -> dict:
    return {key: (row["response_ids"], row["rollout_logprobs"]) for key, row in rows.items()}


def assert_same_samples(got: dict, want: dict) -> None:
    """The same tokens for every (prompt, sample), and their logprobs equal to fp32 rounding: two TP workers sum
    each row-parallel matmul's halves in another order than one worker does."""
    assert {k: r["response_ids"] for k, r in got.items()} == {k: r["response_ids"] for k, r in want.items()}
    for key, row in want.items():
        assert got[key]["rollout_logprobs"] == pytest.approx(row["rollout_logprobs"], rel=0, abs=1e-5), key


def perturbed_weights(model_path) -> list[tuple[str, torch.Tensor]]:
    """Every weight of the tiny model moved by seeded noise as large as its initialisation (std 0.02)."""
    from safetensors.torch import load_file

    generator = torch.Generator().manual_seed(11)
    weights = load_file(str(model_path / "model.safetensors"))
    return [(name, tensor + 0.02 * torch.randn(tensor.shape, generator=generator)) for name, tensor in weights.items()]


def logprobs_of(model, row: dict) -> list[float]:
    """transformers' logprobs of a generated row's response tokens (an independent forward of the same weights)."""
    ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(row["prompt_ids"]) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(row["response_ids"])[:, None])[:, 0].tolist()


def test_tp_workers_and_shared_out_engines_generate_one_engines_samples(engine, tp_engine):
    one = generated(engine, PROMPTS)
    assert_same_samples(generated(tp_engine, PROMPTS), one)
    # two engines of different shapes taking contiguous shares, as a run's engines do (rank_group.share_bounds)
    assert_same_samples(generated(engine, PROMPTS[:2]) | generated(tp_engine, PROMPTS[2:]), one)


def test_a_model_runner_in_a_child_process_generates_the_in_process_engines_samples(engine, mp_engine):
    """The same worker's maths in another process: the same tokens and bit-equal logprobs."""
    assert tokens_and_logprobs(generated(mp_engine, PROMPTS)) == tokens_and_logprobs(generated(engine, PROMPTS))


def test_an_engine_core_apart_generates_the_in_process_engines_samples_and_ends_with_its_actor(
        engine, tiny_model, ray_session):
    """vLLM's scheduler in a process of its own above a model runner in another (`--vllm.engine_core_process` with
    the `mp` executor): the same tokens and bit-equal logprobs, the batch in the core before it schedules; killed
    outright, its actor leaves neither behind."""
    apart = engine_actor(ray_session, str(tiny_model), 1, executor_backend="mp", engine_core_process=True)
    try:
        assert tokens_and_logprobs(generated(apart, PROMPTS)) == tokens_and_logprobs(generated(engine, PROMPTS))
        assert ray.get([apart.core_client.remote(), engine.core_client.remote()], timeout=60) == [
            "SyncMPClient", "InprocClient"]
        sampling = SamplingSettings(n=2, max_new_tokens=4, temperature=1.0)
        # the whole batch goes in before the core apart schedules any of it; the core in the actor never pauses
        assert ray.get([apart.scheduler_paused_as_the_batch_went_in.remote(PROMPTS, sampling),
                        engine.scheduler_paused_as_the_batch_went_in.remote(PROMPTS, sampling)],
                       timeout=120) == [[True, False], [False]]
        pid, children = ray.get(apart.processes.remote(), timeout=60)
        assert len(children) >= 2  # the engine core and, beneath it, the model runner
        assert survivors_of_a_kill(pid, children) == []
    finally:
        ray_session.kill(apart)


def test_an_fp8_kv_cache_moves_the_engines_logprobs_a_little_off_the_models(engine, tiny_model, ray_session):
    """`--vllm.kv_cache_dtype fp8`: vLLM keeps keys and values in one byte each (e4m3, scale 1), so its logprobs of
    the same tokens leave the model's fp32 ones by about 1e-2 (the default cache: within 1e-5), and stay close."""
    from transformers import AutoModelForCausalLM

    from hybrid_core.plan.refusals import cpu_has_fp8_attention

    fp8 = engine_actor(ray_session, str(tiny_model), 1, kv_cache_dtype="fp8")
    if not cpu_has_fp8_attention():  # vLLM's CPU attention has no fp8 path here, which `hybrid train` refuses first
        with pytest.raises(Exception, match="FP8 KV cache on CPU requires x86 with AVX-512 or AMX"):
            ray.get(fp8.cache_dtype.remote(), timeout=300)
        return
    try:
        assert ray.get([fp8.cache_dtype.remote(), engine.cache_dtype.remote()], timeout=300) == ["fp8", "auto"]
        rows = list(generated(engine, PROMPTS).values())
        prompts, answers = [r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows]
        exact, quantized = ray.get([engine.score.remote(prompts, answers), fp8.score.remote(prompts, answers)],
                                   timeout=300)
    finally:
        ray_session.kill(fp8)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    reference = [logprobs_of(model, row) for row in rows]
    assert [len(q) for q in quantized] == [len(r) for r in reference]
    for default_row, model_row in zip(exact, reference):
        assert default_row == pytest.approx(model_row, rel=0, abs=1e-5)
    off = [abs(q - r) for q_row, r_row in zip(quantized, reference) for q, r in zip(q_row, r_row)]
    assert sum(off) / len(off) > 1e-3  # 7.9e-3 on the CPU build (2026-12-07), the largest 0.033
    assert max(off) < 0.1


def test_a_weight_update_moves_the_tp_engine_like_one_worker(engine, tp_engine, mp_engine, tiny_model):
    """After the other tests that generate: the engines keep the moved weights."""
    from transformers import AutoModelForCausalLM

    before = generated(engine, PROMPTS)
    named = perturbed_weights(tiny_model)
    ray.get([e.load_weights.remote(named) for e in (engine, tp_engine, mp_engine)], timeout=300)
    one, tp = generated(engine, PROMPTS), generated(tp_engine, PROMPTS)
    assert sum(one[k]["response_ids"] != before[k]["response_ids"] for k in one) >= 5  # of 6: the weights moved
    assert_same_samples(tp, one)
    assert_same_samples(generated(mp_engine, PROMPTS), one)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    model.load_state_dict(dict(named))
    for key, row in tp.items():  # each worker kept its shard of the full tensors it was sent
        assert row["rollout_logprobs"] == pytest.approx(logprobs_of(model, row), rel=0, abs=1e-5), key
    # the engines' own scoring of a response (how weight-sync checks read an engine) agrees too
    row = {"prompt_ids": one[(0, 0)]["prompt_ids"], "response_ids": [17, 18, 19, 20, 21, 22]}
    scored = ray.get(tp_engine.score.remote([row["prompt_ids"]], [row["response_ids"]]), timeout=300)[0]
    assert scored == pytest.approx(logprobs_of(model, row), rel=0, abs=1e-5)


def test_a_killed_engine_takes_its_model_runners_process_with_it(mp_engine):
    """After the module's other tests: a rollout worker killed outright (as the OOM killer would) leaves no model
    runner behind to hold its GPU memory (vLLM's child notices its parent's end through a pipe)."""
    pid, children = ray.get(mp_engine.processes.remote(), timeout=60)
    assert children  # the model runner, at least
    assert survivors_of_a_kill(pid, children) == []


def survivors_of_a_kill(pid: int, children: list[int]) -> list[int]:
    """SIGKILL `pid` (an engine's actor), then wait up to 60 s for it and its `children` to end; those still alive."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(alive(child) for child in [pid, *children]):
        time.sleep(0.5)
    return [child for child in [pid, *children] if alive(child)]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
