"""What a running job shows: the per-step terminal line and the Prefect UI artifacts (metrics table, progress with an
ETA, decoded samples). Prefect calls only; the figures arrive as records from the tasks, and the table starts from
the run's committed rows, so a resumed run shows all of its steps. The artifacts are written by one background
thread, in step order, so the next step does not wait for them (~0.1 s a step on the embedded server); `close`
waits until all are written."""
from __future__ import annotations

import contextvars
import logging
import re
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor

from prefect.artifacts import (create_markdown_artifact, create_progress_artifact, create_table_artifact,
                               update_progress_artifact)

from hybrid_core.step_contract import TIMED_STAGES
from hybrid_core.types import MetricsRow, Sample

log = logging.getLogger(__name__)


def artifact_key(prefix: str, run_id: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    return f"{prefix}-" + re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")


def step_line(step: int, num_steps: int, m: dict[str, float]) -> str:
    stages = " ".join(f"{s} {m[f'timing_s/{s}']:.2f}s" for s in TIMED_STAGES if f"timing_s/{s}" in m)
    line = (f"step {step}/{num_steps} | reward {m['reward/mean']:.3f} | response length "
            f"{m['rollout/response_length_mean']:.1f} | kl {m['actor/kl']:.5f} | {stages}")
    if "rollout/staleness" in m:  # async: the batch's lag, the wait for it and the step's own wall time
        line += (f" | staleness {m['rollout/staleness']:.0f}, waited {m.get('timing_s/rollout_wait', 0.0):.2f}s, "
                 f"step {m.get('timing_s/step_wall', 0.0):.2f}s")
    return line


def eval_summary_rows(step: int, figures: dict[str, float]) -> list[dict]:
    """One row per data source of an evaluation's figures (`eval/<source>_<figure>`, the UI's eval table):
    step, source, pass1, pass@k, response length, truncated share."""
    by_source: dict[str, dict] = defaultdict(dict)
    for key, value in figures.items():
        match = re.fullmatch(r"eval/(.+)_(pass\d+|response_length|truncated)", key)
        if match:
            by_source[match.group(1)][match.group(2)] = round(value, 6)
    return [{"step": step, "data_source": source} | values for source, values in sorted(by_source.items())]


def eval_line(step: int, m: dict[str, float]) -> str:
    figures = " | ".join(f"{k.removeprefix('eval/')} {v:.3f}" for k, v in m.items()
                         if k.startswith("eval/") and ("_pass" in k or k.endswith("_truncated")))
    return f"eval after step {step} | {figures} | {m.get('timing_s/eval', 0.0):.2f}s"


def samples_markdown(step: int, samples: list[Sample]) -> str:
    rows = ["| prompt | response | reward |", "|---|---|---|"]
    clean = lambda text: text.replace("|", "\\|").replace("\n", "⏎")[-200:]  # noqa: E731
    rows += [f"| {clean(s.prompt)} | {clean(s.response)} | {s.reward:.3f} |" for s in samples]
    return f"### Samples of step {step}\n\n" + "\n".join(rows)


class RunReport:
    """One per flow run: the progress artifact, the growing metrics table, and a line per step."""

    def __init__(self, run_id: str, num_steps: int, committed: list[MetricsRow]):
        self.run_id, self.num_steps = run_id, num_steps
        self.rows = {row.step: self._table_row(row) for row in committed}
        self.eval_rows = [r for row in committed for r in eval_summary_rows(row.step, row.values)]
        self.started, self.first_done = time.perf_counter(), len(self.rows)
        self.progress_id = create_progress_artifact(0.0, key=artifact_key("rl-progress", run_id),
                                                    description=f"{run_id}: 0/{num_steps} steps")
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rl-artifacts")
        self._written: list[Future] = []

    @staticmethod
    def _table_row(row: MetricsRow) -> dict:
        return {"step": row.step} | {k: round(v, 6) for k, v in row.values.items()}

    def _in_background(self, write, *args) -> None:
        """Run `write(*args)` on the artifact thread, in this flow run's context (artifacts link to it)."""
        self._written.append(self._writer.submit(contextvars.copy_context().run, write, *args))

    def step_done(self, row: MetricsRow, samples: Future, print_line: bool) -> None:
        """`samples`: the step's decoded samples, a future (the samples task, submitted)."""
        step = row.step
        self.rows[step] = self._table_row(row)
        elapsed = time.perf_counter() - self.started
        done_here = max(1, len(self.rows) - self.first_done)
        eta = elapsed / done_here * (self.num_steps - step)
        self._in_background(self._write_step, step, [self.rows[k] for k in sorted(self.rows)], samples, eta)
        if print_line:
            print(step_line(step, self.num_steps, row.values))
        self._eval_done(row)

    def _write_step(self, step: int, rows: list[dict], samples: Future, eta: float) -> None:
        create_table_artifact(rows, key=artifact_key("rl-metrics", self.run_id),
                              description=f"metrics of run {self.run_id}, one row per step")
        create_markdown_artifact(samples_markdown(step, samples.result()), key=artifact_key("rl-samples", self.run_id),
                                 description=f"decoded samples of step {step}")
        update_progress_artifact(self.progress_id, 100.0 * step / self.num_steps,
                                 description=f"{self.run_id}: {step}/{self.num_steps} steps, ETA {eta:.0f}s")

    def initial_eval_done(self, row: MetricsRow) -> None:
        """Step 0: the evaluation of the initial policy (eval.at_start)."""
        self.rows[0] = self._table_row(row)
        self._eval_done(row)

    def _eval_done(self, row: MetricsRow) -> None:
        """An evaluated step: its line, and the eval table (one row per step and data source) in the UI."""
        summary = eval_summary_rows(row.step, row.values)
        if not summary:
            return
        self.eval_rows = [r for r in self.eval_rows if r["step"] != row.step] + summary
        self._in_background(create_table_artifact, list(self.eval_rows), artifact_key("rl-eval", self.run_id),
                            f"evaluations of run {self.run_id}: pass@1 and pass@k per data source")
        print(eval_line(row.step, row.values))

    def close(self) -> None:
        """Wait until every artifact is written; a failed write is logged (the run's data is in its store)."""
        self._writer.shutdown(wait=True)
        for written in self._written:
            if written.exception() is not None:
                log.warning("a Prefect artifact of run %s was not written: %r", self.run_id, written.exception())
