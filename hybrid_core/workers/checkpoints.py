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

from hybrid_core.data.eval_tables import metric_key_name
from hybrid_core.engines.checkpoint import remove_checkpoints, tag_of
from hybrid_core.step_contract import CHECKPOINT
from hybrid_core.types import PermanentError, StageResult
from hybrid_core.workers import rank_group
from hybrid_core.workers.step_ledger import result_from_entry


class CheckpointKeeper:
    """Used by `ActorWorker` rank 0 (`worker`), which leads the policy's other ranks and the critic."""

    def __init__(self, worker):
        self.worker = worker

    def save(self, step: int) -> StageResult:
        w = self.worker
        if w.ledger.entry(step, CHECKPOINT.name):  # saved before (kept or rotated away): nothing to redo
            w.store.log_event(step, CHECKPOINT.name, "replay")
            return StageResult(stage=CHECKPOINT.name, step=step, seconds=0.0, replayed=True)
        w.ledger.begin(step, CHECKPOINT.name)
        timeout = w.run.stage_timeout_s
        if "critic" in w.args.roles:
            critic = rank_group.all_ranks(w.run, "critic", 1)[0]
            rank_group.gather("critic", [(0, critic.save_checkpoint.remote(step))], timeout)
        peer_calls = rank_group.started_on_peers(w._peers(), "save_share", step)  # DeepSpeed saves collectively
        rank_group.with_peers("actor", peer_calls, lambda: w.save_own(step), timeout)
        metric = best_metric_of(w.args.best_metric_key, w._committed_row(step))
        entry = w.ledger.record(step, CHECKPOINT.name, w.clock, {}, tag=tag_of(step), kept=True, metric=metric)
        self._rotate()
        return result_from_entry(CHECKPOINT.name, step, entry)

    def _rotate(self) -> None:
        """Delete the checkpoints rotation evicts, mark their records not kept, and mark the best one."""
        w = self.worker
        steps = w.store.manifest()["steps"]
        records = {int(k): v[CHECKPOINT.name] for k, v in steps.items() if (v.get(CHECKPOINT.name) or {}).get("kept")}
        metrics = {k: r["metric"] for k, r in records.items() if r.get("metric") is not None}
        best = best_step(metrics)
        old = steps_to_evict(sorted(records), metrics, w.args.max_num, best)
        if old:
            remove_checkpoints(w.args.ckpt_root, old)
        for k, record in records.items():
            changes = {"kept": False} if k in old else {}
            if record.get("best", False) != (k == best):
                changes["best"] = k == best
            if changes:
                w.store.update_manifest(k, {CHECKPOINT.name: record | changes})

    def restore_critic(self, step: int) -> None:
        w = self.worker
        if "critic" in w.args.roles:
            critic = rank_group.all_ranks(w.run, "critic", 1)[0]
            rank_group.gather("critic", [(0, critic.restore.remote(step))], w.run.stage_timeout_s)


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
