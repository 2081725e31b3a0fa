"""The run's checkpoints as the actor's rank 0 keeps them: the critic's and every policy rank's DeepSpeed state, the
manifest's checkpoint record of each step, and rotation to `ckpt.max_num`, keeping the best by `ckpt.best_metric_key`.

A checkpoint is a committed part of its step (the step is not complete without it when it is due); one saved before
(kept or rotated away) is never saved again by a replayed step. Its record holds its step's value of the best
metric (from the step's committed metrics row, when the step was evaluated), so the rotation is decided from the
manifest alone. Rotation follows OpenRLHF: the best checkpoint is exempt, the newest always stays, and of the others
those without the metric go first, then the worst, then the oldest, until `ckpt.max_num` regular ones remain.
It knows nothing about Prefect.
"""
from __future__ import annotations

import re
from typing import Callable

from hybrid_core.data.eval_tables import metric_key_name
from hybrid_core.engines.checkpoint import remove_checkpoints, tag_of
from hybrid_core.step_contract import CHECKPOINT
from hybrid_core.types import PermanentError, StageResult
from hybrid_core.workers.metrics_rows import MetricsRows
from hybrid_core.workers.policy_lead import PolicyLead
from hybrid_core.workers.stage_clock import CallClock
from hybrid_core.workers.step_ledger import StepLedger, result_from_entry


class CheckpointKeeper:
    """The checkpoints of the actor whose arguments are `args` (`ActorWorkerArgs`: ckpt_root, max_num,
    best_metric_key), saved by its rank 0 through `lead` (the policy's other ranks and the critic), recorded in
    `ledger`, the best judged from the committed metrics `rows`."""

    def __init__(self, args, ledger: StepLedger, lead: PolicyLead, rows: MetricsRows):
        self.args, self.ledger, self.store, self.lead, self.rows = args, ledger, ledger.store, lead, rows

    def save(self, step: int, clock: CallClock | None, own: Callable[[], str]) -> StageResult:
        """Checkpoint step `step` (rank 0's part: `own`), unless saved before; then rotate."""
        if self.ledger.entry(step, CHECKPOINT.name):  # saved before (kept or rotated away): nothing to redo
            self.store.log_event(step, CHECKPOINT.name, "replay")
            return StageResult(stage=CHECKPOINT.name, step=step, seconds=0.0, replayed=True)
        self.ledger.begin(step, CHECKPOINT.name)
        self.lead.save_critic(step)
        self.lead.save(step, own)  # DeepSpeed saves collectively
        metric = best_metric_of(self.args.best_metric_key, self.rows.committed(step))
        entry = self.ledger.record(step, CHECKPOINT.name, clock, {}, tag=tag_of(step), kept=True, metric=metric)
        self._rotate()
        return result_from_entry(CHECKPOINT.name, step, entry)

    def _rotate(self) -> None:
        """Delete the checkpoints rotation evicts, mark their records not kept, and mark the best one."""
        steps = self.store.manifest()["steps"]
        records = {int(k): v[CHECKPOINT.name] for k, v in steps.items() if (v.get(CHECKPOINT.name) or {}).get("kept")}
        metrics = {k: r["metric"] for k, r in records.items() if r.get("metric") is not None}
        best = best_step(metrics)
        old = steps_to_evict(sorted(records), metrics, self.args.max_num, best)
        if old:
            remove_checkpoints(self.args.ckpt_root, old)
        for k, record in records.items():
            changes = {"kept": False} if k in old else {}
            if record.get("best", False) != (k == best):
                changes["best"] = k == best
            if changes:
                self.store.update_manifest(k, {CHECKPOINT.name: record | changes})


def best_metric_of(key: str, row: dict[str, float]) -> float | None:
    """A checkpoint's value of `ckpt.best_metric_key` in its step's metrics row: None for "none" or a step that was
    not evaluated; "" takes the first `eval/*_pass1` (OpenRLHF's default); OpenRLHF's `eval_<source>_pass1`
    spelling names `eval/<source>_pass1`."""
    figures = {k: v for k, v in row.items() if k.startswith("eval/")}
    if key == "none" or not figures:
        return None
    if key == "":
        pass1 = sorted(k for k in figures if re.fullmatch(r"eval/.+_pass1", k))
        return figures[pass1[0]] if pass1 else None
    name = metric_key_name(key)
    if name not in figures:
        raise PermanentError(f"ckpt.best_metric_key {key!r} is not a figure of the evaluation: it has "
                             f"{sorted(figures)}; pass one of them (or none)")
    return figures[name]


def best_step(metrics: dict[int, float]) -> int | None:
    """The checkpoint with the highest metric (the earlier one on a tie); None when none has it."""
    return max(sorted(metrics), key=metrics.__getitem__, default=None)


def steps_to_evict(kept: list[int], metrics: dict[int, float], max_num: int, best: int | None) -> list[int]:
    """Which kept checkpoints rotation deletes. Every checkpoint is a regular one, `max_num` of them stay: the newest,
    then the others in the reverse of the eviction order (without the metric first, then the lowest metric, then
    the oldest). The best one stays besides them (OpenRLHF's separate best copy)."""
    newest = max(kept)
    order = sorted((k for k in kept if k != newest), key=lambda k: (k in metrics, metrics.get(k, 0.0), k))
    evicted = order[:max(0, len(kept) - max_num)]
    return sorted(k for k in evicted if k != best)
