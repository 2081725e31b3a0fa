"""`rollout.seed_per_prompt` on the real vLLM CPU build: per-prompt seeds make a rollout independent of batching and
repeatable (what retries and resumes rely on); without them the engine's own generator draws the noise."""
from __future__ import annotations

import pytest
import ray

from hybrid_core.data.prompts import Prompt
from hybrid_core.engines.rollout_step import PromptFormat, generate_rows
from hybrid_core.engines.vllm_rollout import SamplingSettings

pytestmark = pytest.mark.integration

PROMPTS = [Prompt(0, "abc", ""), Prompt(1, "hello", ""), Prompt(2, "xyz", "")]
FORMAT = PromptFormat(apply_chat_template=False, input_template=None, max_len=64)


@pytest.fixture(scope="module")
def engine(tiny_model, ray_session):
    """One vLLM CPU engine in a Ray actor of its own, with a rollout worker's environment (in-process engine, as in
    a run); `responses` generates on it. Killed at the end of the module."""
    from hybrid_core.workers.placement import role_env

    @ray_session.remote(num_cpus=0)
    class SeedingEngine:
        def __init__(self, model_path: str):
            from hybrid_core.engines.vllm_rollout import EngineSettings, VllmRolloutEngine

            self.engine = VllmRolloutEngine(EngineSettings(model_path=model_path, param_dtype="fp32",
                                                           gpu_memory_utilization=0.05, seed=0, enforce_eager=True,
                                                           max_model_len=64))

        def generate(self, prompts, sampling: SamplingSettings, step: int) -> list[dict]:
            return generate_rows(self.engine, self.engine.tokenizer, prompts, FORMAT, sampling, seed=7, step=step,
                                 policy_version=0).to_pylist()

    actor = SeedingEngine.options(runtime_env={"env_vars": role_env("rollout", on_cpu=True)}).remote(str(tiny_model))
    yield actor
    ray_session.kill(actor)


def responses(engine, prompts, seed_per_prompt: bool, step: int = 1) -> dict[tuple[int, int], list[int]]:
    sampling = SamplingSettings(n=2, max_new_tokens=12, temperature=1.0, seed_per_prompt=seed_per_prompt)
    rows = ray.get(engine.generate.remote(prompts, sampling, step), timeout=300)
    return {(r["prompt_index"], r["sample_index"]): r["response_ids"] for r in rows}


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
