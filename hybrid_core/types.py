"""Small records that cross process and layer boundaries: run references, stage and step summaries, and the error
family that tells a retry it cannot help.

Owns only plain data (no tensors, no handles), so Prefect can log them and Ray can pickle them cheaply.
It does not know how stages run or where datasets live beyond the run directory's URI.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hybrid_core.step_contract import ROLES, is_checkpoint_due, is_eval_due


class PermanentError(Exception):
    """An error that running the same call again cannot fix: bad user data or code (a reward function's output),
    a damaged or altered run store, a replay that does not reproduce. Prefect does not retry these."""


def run_dir_of(store_root: str, run_id: str) -> str:
    """`<store.root>/<run_id>`: where a run's data lives."""
    return f"{store_root.rstrip('/')}/{run_id}"


@dataclass(frozen=True, kw_only=True)
class RunRef:
    """Names a run: where its data lives, how its Ray actors are called, and the run's stage settings."""

    run_id: str
    store_root: str
    stage_timeout_s: float
    roles: tuple[str, ...]
    stage_retries: int
    retry_delay_s: float
    save_steps: int
    eval_steps: int
    eval_at_start: bool
    async_queue_size: int = 0  # train.async_queue_size with train.async_enable; 0: sync mode
    is_oversampling: bool = False  # async, rollout.vllm_generate_batch_size > rollout.batch_size (config.py)

    @property
    def namespace(self) -> str:
        return f"hybrid-{self.run_id}"

    @property
    def run_dir(self) -> str:
        return run_dir_of(self.store_root, self.run_id)

    def is_checkpoint_due(self, step: int) -> bool:
        return is_checkpoint_due(step, self.save_steps)

    def is_eval_due(self, step: int) -> bool:
        """After step k (k ≥ 1) every `eval.steps`; step 0 (before training) with `eval.at_start`."""
        return self.eval_at_start if step == 0 else is_eval_due(step, self.eval_steps)

    def actor_name(self, role: str, rank: int = 0) -> str:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}: got {role!r}")
        return f"{self.run_id}/{role}/{rank}"


@dataclass(frozen=True, kw_only=True)
class StageResult:
    """What a stage reports back to the flow: counts, timing and a few scalar metrics (all of it is also recorded in
    the run's store by the worker, so nothing here is needed to finish the step)."""

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


@dataclass(frozen=True, kw_only=True)
class MetricsRow:
    """A step's committed metrics row (the `metrics` dataset's one row, without its `step` column)."""

    step: int
    values: dict[str, float]
    replayed: bool = False


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One decoded sample of a step with its reward, for the run's UI."""

    prompt: str
    response: str
    reward: float


@dataclass(frozen=True, kw_only=True)
class WorkersStarted:
    """How a run's workers came up: re-attached (weights still loaded) or created and restored from a checkpoint."""

    num_steps: int
    next_step: int      # where the flow continues: the first incomplete step, or the one after the restored checkpoint
    restored_step: int  # the version the workers hold: the checkpoint loaded (0: the model's own weights)
    is_attached: bool
    model_uri: str


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """What `rl-train` returns."""

    run_id: str
    run_dir: str
    num_steps: int
    model_uri: str
