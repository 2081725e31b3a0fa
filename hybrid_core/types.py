"""Small records that cross process and layer boundaries: run references and stage summaries.

Owns only plain data (no tensors, no handles), so Prefect can log them and Ray can pickle them cheaply.
It does not know how stages run or where datasets live beyond the run directory's URI.
"""
from __future__ import annotations

from dataclasses import dataclass, field

STAGES = ("rollout", "reward", "advantage", "train", "sync")
DATASET_STAGES = ("rollout", "reward", "advantage", "metrics")
ROLES = ("actor", "ref", "critic", "reward", "rollout")


@dataclass(frozen=True)
class RunRef:
    """Names a run: where its data lives and how its Ray actors are called."""

    run_id: str
    store_root: str
    stage_timeout_s: float = 3600.0
    roles: tuple[str, ...] = ("actor", "rollout")
    stage_retries: int = 2
    retry_delay_s: float = 5.0

    @property
    def namespace(self) -> str:
        return f"hybrid-{self.run_id}"

    @property
    def run_dir(self) -> str:
        return f"{self.store_root.rstrip('/')}/{self.run_id}"

    def actor_name(self, role: str, rank: int = 0) -> str:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}: got {role!r}")
        return f"{self.run_id}/{role}/{rank}"


@dataclass(frozen=True)
class StageResult:
    """What a stage reports back to the flow: counts, timing and a few scalar metrics."""

    stage: str
    step: int
    seconds: float
    rows: int = 0
    path: str = ""
    replayed: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    entered_at: float = 0.0  # wall clock (time.time()) when the worker began the call (workers.stage_clock)

    def row_metrics(self) -> dict[str, float]:
        """The metrics that go into the step's metrics row: the namespaced ones (`timing_s/...`, `memory_gib/...`)."""
        return {key: value for key, value in self.metrics.items() if "/" in key}
