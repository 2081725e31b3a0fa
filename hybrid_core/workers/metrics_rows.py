"""The step's metrics row as the policy's rank 0 commits it: built from what the step committed (nothing from the
driver's or a worker's memory), committed like a stage, and logged to the run's metric sinks; and the run's
committed rows, for the UI's table after a resume.

It knows nothing about training, the other workers or Prefect.
"""
from __future__ import annotations

import time

from hybrid_core.data.eval_tables import eval_only_row
from hybrid_core.data.metric_sinks import MetricSinks, SinkSettings
from hybrid_core.data.stage_tables import METRIC_COLUMNS, metrics_table, row_from_records
from hybrid_core.step_contract import ADVANTAGE, METRICS, ROLLOUT
from hybrid_core.types import MetricsRow
from hybrid_core.workers.step_ledger import VOLATILE_METRICS, StepLedger


class MetricsRows:
    """The metrics rows of the run whose stages `ledger` records, logged to the sinks of `sinks`."""

    def __init__(self, ledger: StepLedger, sinks: SinkSettings):
        self.ledger, self.store, self.sinks = ledger, ledger.store, MetricSinks(sinks)

    def write(self, step: int, step_started_at: float | None = None) -> MetricsRow:
        """Commit step `step`'s row (replayed when committed already) and log it; with `step_started_at` (async
        mode: the driver's wall clock when the step began) its wall time, `timing_s/step_wall`, is in it (the
        stages' seconds no longer add up to it: generation overlaps them)."""
        if self.ledger.replay(step, METRICS.name):
            return MetricsRow(step=step, values=self.committed(step), replayed=True)
        self.ledger.begin(step, METRICS.name)
        entries = self.store.manifest()["steps"][str(step)]
        if step == 0:  # the evaluation before training (eval.at_start)
            values = eval_only_row(entries)
        else:
            tables = [self.store.read(step, s, METRIC_COLUMNS[s]) for s in (ROLLOUT.name, "reward", ADVANTAGE.name)]
            values = row_from_records(*tables, entries)
        if step_started_at is not None:
            values["timing_s/step_wall"] = max(0.0, time.time() - step_started_at)
        self.ledger.commit(step, METRICS.name, metrics_table(step, values), None, {},
                           drop_from_hash=[k for k in values if k.startswith(VOLATILE_METRICS)])
        self.sinks.log(step, values)
        return MetricsRow(step=step, values=values)

    def committed(self, step: int) -> dict[str, float]:
        """Step `step`'s committed row, without its step number."""
        row = self.store.read(step, METRICS.name).to_pylist()[0]
        return {k: v for k, v in row.items() if k != "step"}

    def every(self) -> list[MetricsRow]:
        """Every committed row of the run, in step order."""
        steps = sorted(int(k) for k, v in self.store.manifest()["steps"].items() if METRICS.name in v)
        return [MetricsRow(step=k, values=self.committed(k), replayed=True) for k in steps]

    def close(self) -> None:
        """Flush the sinks before the run's actors are killed."""
        self.sinks.close()
