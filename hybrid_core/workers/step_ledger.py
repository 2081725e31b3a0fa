"""A worker's side of the step contract: replay what is committed (after checking its files), or start the stage,
invalidate what the step committed after it, and commit its output with the stage's own seconds and figures.

Every stage method of every worker goes through one `StepLedger`, so the rules (which policy version a stage must
come from, what regenerating invalidates, which events are logged, where fault tests stop) live here once. It knows
nothing about what the stages compute or about Prefect.
"""
from __future__ import annotations

import time

import pyarrow as pa

from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.step_contract import generating_version, stage_named
from hybrid_core.types import PermanentError, StageResult
from hybrid_core.workers.faults import FaultPoints
from hybrid_core.workers.stage_clock import CallClock

# wall-clock and device-memory figures: excluded from content hashes and from replay checks
VOLATILE_METRICS = ("timing_s/", "rollout/tokens_per_s", "memory_gib/")


class ReplayMismatchError(PermanentError):
    """A stage run again (after a restore) did not reproduce the figures it committed before."""


class StepLedger:
    """Opened once per worker over the run's store; `clock` is the stage call being served (set by `stamped`)."""

    def __init__(self, store: RolloutStore, faults: FaultPoints):
        self.store, self.faults = store, faults
        self.started: dict[tuple[int, str], float] = {}

    def entry(self, step: int, name: str) -> dict | None:
        return self.store.manifest()["steps"].get(str(step), {}).get(name)

    def replay(self, step: int, stage: str, version: int | None = None) -> dict | None:
        """The committed record of a dataset stage made by the policy step `step` uses (`version`: another, e.g.
        an evaluation's), its files checked; None when the stage must be generated."""
        version = generating_version(step) if version is None else version
        entry = self.store.replayable(step, stage, version)
        if entry is not None:
            self.store.log_event(step, stage, "replay")
        return entry

    def begin(self, step: int, stage: str) -> None:
        """The stage runs (again): a dataset stage first invalidates what the step committed after it."""
        if stage_named(stage).is_dataset:
            self.store.clean_leftovers(step)
            self.store.invalidate_after(step, stage)
        self.store.log_event(step, stage, "start")
        self.started[(step, stage)] = time.perf_counter()
        self.faults.reach(step, stage, "start")

    def seconds(self, step: int, stage: str) -> float:
        return time.perf_counter() - self.started.pop((step, stage))

    def _record(self, step: int, stage: str, clock: CallClock | None, metrics: dict) -> dict:
        figures = clock.figures(stage) if clock is not None else {}
        return {"seconds": self.seconds(step, stage), "metrics": dict(metrics) | figures}

    def commit(self, step: int, stage: str, table: pa.Table, clock: CallClock | None, metrics: dict,
               drop_from_hash=(), version: int | None = None, beside: dict | None = None) -> dict:
        """Commit a dataset stage begun with `begin` (made by policy `version`: by default the one step `step`
        generates with), and the datasets `beside` it in the same manifest write (`RolloutStore.commit`); returns
        its manifest entry."""
        record = self._record(step, stage, clock, metrics)
        version = generating_version(step) if version is None else version
        self.store.commit(step, stage, table, version, record, drop_from_hash,
                          on_written=lambda: self.faults.reach(step, stage, "written"), beside=beside)
        self.faults.reach(step, stage, "committed")
        return self.entry(step, stage)

    def record(self, step: int, stage: str, clock: CallClock | None, metrics: dict, **fields) -> dict:
        """Commit a stage without a dataset (train, sync, checkpoint): its record in the manifest."""
        entry = self._record(step, stage, clock, metrics) | fields
        self.faults.reach(step, stage, "written")
        self.store.record(step, stage, entry)
        self.faults.reach(step, stage, "committed")
        return entry


def check_reproduced(step: int, stage: str, committed: dict, metrics: dict, atol: float = 1e-6) -> None:
    """Fail when a stage run again produced other figures than it committed (wall-clock figures excepted)."""
    differing = {k: (committed.get(k), v) for k, v in metrics.items()
                 if not k.startswith(VOLATILE_METRICS) and isinstance(v, float)
                 and abs((committed.get(k) or 0.0) - v) > atol * max(1.0, abs(v))}
    if differing:
        raise ReplayMismatchError(f"step {step} {stage} run again did not reproduce its committed figures: "
                                  f"{differing}; the restored policy is not the one that produced the committed "
                                  "datasets")


def result_from_entry(stage: str, step: int, entry: dict | None, replayed: bool = False) -> StageResult:
    """The StageResult of a stage whose record is `entry` (its seconds and figures as committed)."""
    entry = entry or {}
    return StageResult(stage=stage, step=step, seconds=0.0 if replayed else entry.get("seconds", 0.0),
                       rows=entry.get("rows", 0), replayed=replayed, metrics=dict(entry.get("metrics", {})))
