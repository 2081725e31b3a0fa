"""The `eval` stage as the rollout worker's rank 0 serves it: every engine samples its share of the eval prompts with
the policy the step's sync gave it, the run's reward source scores them, and the rows and their pass@1 / pass@k
figures are committed through the step ledger (an evaluation already committed for that policy is replayed).

It knows nothing about Prefect; the figures reach the step's metrics row through the stage's committed record.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa

from hybrid_core.data.eval_tables import eval_figures, eval_table
from hybrid_core.data.prompts import Prompt, load_prompt_rows
from hybrid_core.engines.rollout_step import reward_rows
from hybrid_core.engines.vllm_rollout import SamplingSettings
from hybrid_core.step_contract import EVAL, evaluated_version
from hybrid_core.types import StageResult
from hybrid_core.workers import rank_group

EVAL_SEED_KEY = "eval"  # prompt i's seed is derive_seed(run seed, "eval", i) at every evaluation


@dataclass(frozen=True, kw_only=True)
class EvalSettings:
    """`eval.*`: the dataset (same input/label keys as the prompts), its split, and k samples at eval.temperature."""

    dataset: str
    split: str
    input_key: str
    label_key: str | None
    sampling: SamplingSettings


def load_eval_prompts(settings: EvalSettings) -> list[Prompt]:
    """Every eval prompt, indexed by its row (a comma list of datasets concatenated, none left out), with the
    dataset it came from."""
    rows = load_prompt_rows(settings.dataset, settings.input_key, settings.label_key, split=settings.split)
    if not rows:
        raise ValueError(f"eval.dataset {settings.dataset!r} has no rows (split {settings.split!r}): give it prompts "
                         "or drop --eval.dataset")
    return [Prompt(index=i, text=row.text, label=row.label, source=row.source) for i, row in enumerate(rows)]


class Evaluator:
    """Used by a `RolloutWorker` (`worker`): rank 0 runs the stage, every rank generates its share."""

    def __init__(self, worker, settings: EvalSettings):
        self.worker, self.settings = worker, settings
        self.prompts = load_eval_prompts(settings) if worker.rank == 0 else []

    def run(self, step: int) -> StageResult:
        w, version = self.worker, evaluated_version(step)
        if entry := w.ledger.replay(step, EVAL.name, version=version):
            return StageResult(stage=EVAL.name, step=step, seconds=0.0, rows=entry["rows"], replayed=True,
                               path=w.store.stage_uri(step, EVAL.name), metrics=entry["metrics"])
        self.check_version(step)
        w.ledger.begin(step, EVAL.name)
        start = time.perf_counter()
        w.engine.wake_up(["weights", "kv_cache"])
        wake_s = time.perf_counter() - start
        samples = self._generate_shared_out(step)
        if w.args.engine.enable_sleep:  # level 1 keeps the synced weights (in host memory) for the next rollout
            w.engine.sleep(level=1)
        table = eval_table(samples, reward_rows(samples, w.reward_source_for(samples)))
        figures = eval_figures(table, self.settings.sampling.n) | {"timing_s/eval_vllm_wake": wake_s}
        entry = w.ledger.commit(step, EVAL.name, table, w.clock, figures, version=version)
        return StageResult(stage=EVAL.name, step=step, seconds=entry["seconds"], rows=table.num_rows,
                           path=w.store.stage_uri(step, EVAL.name), metrics=entry["metrics"])

    def check_version(self, step: int) -> None:
        w = self.worker
        if w.policy_version != evaluated_version(step):
            raise RuntimeError(f"rollout engine {w.rank} holds policy version {w.policy_version}; the evaluation "
                               f"after step {step} measures version {evaluated_version(step)}: sync it first")

    def _generate_shared_out(self, step: int) -> pa.Table:
        """Engine r samples the r-th contiguous share of the eval prompts; rows keep prompt order."""
        w, prompts = self.worker, self.prompts
        engines = rank_group.peers(w.run, "rollout", w.args.num_engines)
        bounds = rank_group.share_bounds(len(prompts), w.args.num_engines)
        pending = [(rank, peer.evaluate_share.remote(prompts[a:b], step))
                   for rank, (peer, (a, b)) in enumerate(zip(engines, bounds[1:]), start=1) if b > a]
        own = self.share(prompts[bounds[0][0]:bounds[0][1]], step)
        shares = rank_group.gather("rollout", pending, w.run.stage_timeout_s)
        return pa.concat_tables([own, *shares])

    def share(self, prompts: list[Prompt], step: int) -> pa.Table:
        """This engine's samples of `prompts` (ranks ≥ 1 wake for it and sleep again afterwards)."""
        w = self.worker
        if w.rank:
            self.check_version(step)
            w.engine.wake_up(["weights", "kv_cache"])
        table = w.rows_of(prompts, self.settings.sampling, EVAL_SEED_KEY)
        if w.rank and w.args.engine.enable_sleep:
            w.engine.sleep(level=1)
        return table
