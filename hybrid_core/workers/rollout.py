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
from hybrid_core.engines.rollout_step import PromptFormat, generate_rows, reward_rows
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
        table = generate_rows(self.engine, self.tokenizer, self.sampler.for_step(step), self.args.prompt_format,
                              self.args.sampling, self.args.seed, step, self.policy_version)
        if self.args.engine.enable_sleep:
            self.engine.sleep()
        path = self.store.write(step, "rollout", table)
        self.store.record_commit(step, "rollout", table.num_rows, self.policy_version)
        tokens = sum(len(r) for r in table.column("response_ids").to_pylist())
        return StageResult("rollout", step, time.perf_counter() - start, table.num_rows, path, metrics={"tokens": tokens})

    def score(self, step: int) -> StageResult:
        start = time.perf_counter()
        table = reward_rows(self.store.read(step, "rollout"), self.reward_func, self.args.reward_path)
        path = self.store.write(step, "reward", table)
        self.store.record_commit(step, "reward", table.num_rows, self.policy_version)
        return StageResult("reward", step, time.perf_counter() - start, table.num_rows, path)

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
