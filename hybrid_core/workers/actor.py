"""ActorWorker: the Ray actor owning the DeepSpeed policy: experience (advantage stage), training and weight sync.

Methods only delegate to `engines` and move data between the run's store and the other workers (reference and
rollout workers are looked up by name). It knows nothing about Prefect.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import ray

from hybrid_core.algorithms.experience import ActorLossSettings, AdvantageSettings
from hybrid_core.config import ActorConfig, DsConfig, TrainConfig
from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.data.stage_tables import metrics_table, step_metrics
from hybrid_core.engines.actor_trainer import BatchPlan, TrainSamples, fit_actor
from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine, clear_stale_build_locks
from hybrid_core.engines.experience_maker import make_advantage_table
from hybrid_core.engines.frozen_model import load_tokenizer
from hybrid_core.engines.weight_sync import iter_buckets
from hybrid_core.types import RunRef, StageResult


@dataclass(frozen=True)
class ActorWorkerArgs:
    model_path: str
    actor: ActorConfig
    ds: DsConfig
    train: TrainConfig
    advantage: AdvantageSettings
    loss: ActorLossSettings
    experience_micro_batch_size: int
    total_optimizer_steps: int
    sync_bucket_bytes: int
    uses_ref: bool
    extensions_dir: str


class ActorWorker:
    def __init__(self, run: RunRef, args: ActorWorkerArgs):
        clear_stale_build_locks(args.extensions_dir)
        self.run, self.args = run, args
        self.store = RolloutStore(run.run_dir)
        self.tokenizer = load_tokenizer(args.model_path)
        self.engine = DeepSpeedTrainEngine(args.model_path, args.actor, args.ds, args.train,
                                           args.total_optimizer_steps, self.tokenizer.pad_token_id)
        self.engine.sleep()
        self.policy_version, self.step_stats = 0, {}

    def ready(self) -> dict:
        return {"policy_version": self.policy_version}

    def make_experience(self, step: int) -> StageResult:
        start = time.perf_counter()
        ref = self._ref_logprobs if self.args.uses_ref else None
        table, stats = make_advantage_table(self.engine, self.store.read(step, "rollout"),
                                            self.store.read(step, "reward"), ref, self.args.advantage,
                                            self.args.experience_micro_batch_size)
        path = self.store.write(step, "advantage", table)
        self.store.record_commit(step, "advantage", table.num_rows, self.policy_version)
        self.step_stats[step] = stats
        return StageResult("advantage", step, time.perf_counter() - start, table.num_rows, path, metrics=stats)

    def _ref_logprobs(self, prompt_ids, response_ids):
        ref = ray.get_actor(self.run.actor_name("ref"), namespace=self.run.namespace)
        return ray.get(ref.logprobs.remote(prompt_ids, response_ids), timeout=self.run.stage_timeout_s)

    def train(self, step: int) -> StageResult:
        start = time.perf_counter()
        self.engine.wake_up()
        stats = fit_actor(self.engine, self._train_samples(step), self.args.loss, self._batch_plan(step))
        self.engine.sleep()
        self.step_stats[step] = self.step_stats.get(step, {}) | stats
        return StageResult("train", step, time.perf_counter() - start, metrics=stats)

    def _train_samples(self, step: int) -> TrainSamples:
        ro, adv = self.store.read(step, "rollout"), self.store.read(step, "advantage")
        ref = adv.column("ref_logprobs").to_pylist()
        return TrainSamples(ro.column("prompt_ids").to_pylist(), ro.column("response_ids").to_pylist(),
                            adv.column("old_logprobs").to_pylist(), ref if self.args.uses_ref else None,
                            adv.column("advantages").to_pylist())

    def _batch_plan(self, step: int) -> BatchPlan:
        t = self.args.train
        return BatchPlan(t.batch_size, t.micro_batch_size, t.max_epochs, seed=t.seed * 100003 + step)

    def sync(self, step: int) -> StageResult:
        """Push the trained weights to the rollout engine bucket by bucket; the engines then hold version `step`."""
        start = time.perf_counter()
        rollout = ray.get_actor(self.run.actor_name("rollout"), namespace=self.run.namespace)
        ray.get(rollout.begin_weight_update.remote(), timeout=self.run.stage_timeout_s)
        sent = sum(ray.get(rollout.load_bucket.remote(b), timeout=self.run.stage_timeout_s)
                   for b in iter_buckets(self.engine.module, self.args.sync_bucket_bytes, self.engine.is_zero3))
        self.policy_version = ray.get(rollout.end_weight_update.remote(step), timeout=self.run.stage_timeout_s)
        return StageResult("sync", step, time.perf_counter() - start, metrics={"bytes": float(sent)})

    def write_metrics(self, step: int, timings: dict[str, float]) -> dict[str, float]:
        """Commit the step's metrics row (needs every stage's timing, so it runs after sync)."""
        tables = [self.store.read(step, s) for s in ("rollout", "reward", "advantage")]
        metrics = step_metrics(*tables, self.step_stats.pop(step, {}), timings)
        self.store.write(step, "metrics", metrics_table(step, metrics))
        self.store.record_commit(step, "metrics", 1, self.policy_version)
        return metrics

    def logprobs_of(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        return self.engine.logprobs(prompt_ids, response_ids, self.args.experience_micro_batch_size)

    def save_model(self, out_dir: str) -> str:
        self.engine.save_hf(out_dir, self.tokenizer)
        return out_dir
