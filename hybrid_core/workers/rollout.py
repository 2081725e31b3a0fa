"""RolloutWorker: the Ray actor owning one vLLM engine, the prompt sampler and the reward function.

Methods only delegate to `engines` and move datasets in and out of the run's store; the reward function runs here,
beside generation, as in OpenRLHF. It knows nothing about Prefect.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from hybrid_core.data.prompts import PromptSampler, load_prompt_rows
from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.engines.frozen_model import load_tokenizer
from hybrid_core.engines.rollout_step import GroupFilter, PromptFormat, filtered_rollout, generate_rows, reward_rows
from hybrid_core.engines.vllm_rollout import EngineSettings, SamplingSettings, VllmRolloutEngine
from hybrid_core.engines.weight_sync import Bucket, unflatten
from hybrid_core.rewards.reward_func import load_reward_func
from hybrid_core.types import RunRef, StageResult


@dataclass(frozen=True)
class PromptSource:
    dataset: str
    input_key: str
    label_key: str | None
    max_samples: int
    batch_size: int
    num_episodes: int
    max_steps: int | None


@dataclass(frozen=True)
class RolloutWorkerArgs:
    engine: EngineSettings
    prompts: PromptSource
    prompt_format: PromptFormat
    sampling: SamplingSettings
    reward_path: str
    seed: int
    group_filter: GroupFilter | None = None


class RolloutWorker:
    def __init__(self, run: RunRef, args: RolloutWorkerArgs):
        self.run, self.args = run, args
        self.store = RolloutStore(run.run_dir)
        self.tokenizer = load_tokenizer(args.engine.model_path)
        p = args.prompts
        rows = load_prompt_rows(p.dataset, p.input_key, p.label_key, max_samples=p.max_samples)
        self.sampler = PromptSampler(rows, p.batch_size, p.num_episodes, args.seed, p.max_steps)
        self.reward_func = load_reward_func(args.reward_path)
        self.engine = VllmRolloutEngine(args.engine)
        self.policy_version = 0
        if args.engine.enable_sleep:
            self.engine.sleep()

    def info(self) -> dict:
        return {"num_steps": self.sampler.num_steps, "policy_version": self.policy_version}

    def generate(self, step: int) -> StageResult:
        start = time.perf_counter()
        self.engine.wake_up(["weights", "kv_cache"])
        table, metrics = self._generate(step)
        if self.args.engine.enable_sleep:
            self.engine.sleep()
        path = self.store.write(step, "rollout", table)
        self.store.record_commit(step, "rollout", table.num_rows, self.policy_version)
        metrics["tokens"] = sum(len(r) for r in table.column("response_ids").to_pylist())
        return StageResult("rollout", step, time.perf_counter() - start, table.num_rows, path, metrics=metrics)

    def _generate(self, step: int):
        prompts = self.sampler.for_step(step)
        generate = lambda batch: generate_rows(self.engine, self.tokenizer, batch, self.args.prompt_format,  # noqa
                                               self.args.sampling, self.args.seed, step, self.policy_version)
        if self.args.group_filter is None:
            return generate(prompts), {}
        refill = self.sampler.refill_for_step(step, {p.index for p in prompts})
        score = lambda table: reward_rows(table, self.reward_func, self.args.reward_path)  # noqa: E731
        table, pass_rate = filtered_rollout(generate, score, prompts, refill, self.args.sampling.n,
                                            self.args.group_filter)
        return table, {"filter/pass_rate": pass_rate}

    def score(self, step: int) -> StageResult:
        start = time.perf_counter()
        table = reward_rows(self.store.read(step, "rollout"), self.reward_func, self.args.reward_path)
        path = self.store.write(step, "reward", table)
        self.store.record_commit(step, "reward", table.num_rows, self.policy_version)
        return StageResult("reward", step, time.perf_counter() - start, table.num_rows, path)

    def preview(self, step: int, num_samples: int = 4) -> list[dict]:
        """A few decoded samples of the step with their rewards (for the run's UI)."""
        ro, rw = self.store.read(step, "rollout"), self.store.read(step, "reward")
        rows = zip(ro.column("prompt_text").to_pylist(), ro.column("response_text").to_pylist(),
                   rw.column("reward").to_pylist())
        return [{"prompt": p, "response": r, "reward": x} for p, r, x in list(rows)[:num_samples]]

    def begin_weight_update(self) -> None:
        self.engine.wake_up(["weights"])  # weights only: never weights and KV cache together during a sync

    def load_bucket(self, bucket: Bucket) -> int:
        self.engine.load_weights(unflatten(bucket))
        return bucket.num_bytes

    def end_weight_update(self, policy_version: int) -> int:
        self.engine.finish_weight_update()
        self.policy_version = policy_version
        return policy_version

    def logprobs_of(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        self.engine.wake_up(["weights", "kv_cache"])
        return self.engine.score(prompt_ids, response_ids)
