"""The run's checkpoints as the actor's rank 0 keeps them: the critic's and every policy rank's DeepSpeed state, the
manifest's checkpoint record of each step, and rotation to `ckpt.max_num`.

A checkpoint is a committed part of its step (the step is not complete without it when it is due); one saved before
(kept or rotated away) is never saved again by a replayed step. It knows nothing about Prefect.
"""
from __future__ import annotations

from hybrid_core.engines.checkpoint import remove_checkpoints, tag_of
from hybrid_core.step_contract import CHECKPOINT
from hybrid_core.types import StageResult
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
        entry = w.ledger.record(step, CHECKPOINT.name, w.clock, {}, tag=tag_of(step), kept=True)
        self._rotate()
        return result_from_entry(CHECKPOINT.name, step, entry)

    def _rotate(self) -> None:
        """Keep the newest `ckpt.max_num` checkpoints; older ones are deleted and their records marked not kept."""
        w = self.worker
        steps = w.store.manifest()["steps"]
        kept = sorted(int(k) for k, v in steps.items() if (v.get(CHECKPOINT.name) or {}).get("kept"))
        old = kept[:-w.args.max_num]
        if not old:
            return
        remove_checkpoints(w.args.ckpt_root, old)
        for k in old:
            w.store.update_manifest(k, {CHECKPOINT.name: steps[str(k)][CHECKPOINT.name] | {"kept": False}})

    def restore_critic(self, step: int) -> None:
        w = self.worker
        if "critic" in w.args.roles:
            critic = rank_group.all_ranks(w.run, "critic", 1)[0]
            rank_group.gather("critic", [(0, critic.restore.remote(step))], w.run.stage_timeout_s)
