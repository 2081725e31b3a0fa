"""What a running job shows: the per-step terminal line and the Prefect UI artifacts (metrics table, progress with an
ETA, decoded samples). Prefect calls only; the figures arrive as records from the tasks, and the table starts from
the run's committed rows, so a resumed run shows all of its steps."""
from __future__ import annotations

import re
import time
from collections import defaultdict

from prefect.artifacts import (create_markdown_artifact, create_progress_artifact, create_table_artifact,
                               update_progress_artifact)

from hybrid_core.step_contract import TIMED_STAGES
from hybrid_core.types import MetricsRow, Sample


def artifact_key(prefix: str, run_id: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    return f"{prefix}-" + re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")


def step_line(step: int, num_steps: int, m: dict[str, float]) -> str:
    stages = " ".join(f"{s} {m[f'timing_s/{s}']:.2f}s" for s in TIMED_STAGES if f"timing_s/{s}" in m)
    return (f"step {step}/{num_steps} | reward {m['reward/mean']:.3f} | response length "
            f"{m['rollout/response_length_mean']:.1f} | kl {m['actor/kl']:.5f} | {stages}")


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

    @staticmethod
    def _table_row(row: MetricsRow) -> dict:
        return {"step": row.step} | {k: round(v, 6) for k, v in row.values.items()}

    def step_done(self, row: MetricsRow, samples: list[Sample], print_line: bool) -> None:
        step = row.step
        self.rows[step] = self._table_row(row)
        create_table_artifact([self.rows[k] for k in sorted(self.rows)], key=artifact_key("rl-metrics", self.run_id),
                              description=f"metrics of run {self.run_id}, one row per step")
        create_markdown_artifact(samples_markdown(step, samples), key=artifact_key("rl-samples", self.run_id),
                                 description=f"decoded samples of step {step}")
        elapsed = time.perf_counter() - self.started
        done_here = max(1, len(self.rows) - self.first_done)
        eta = elapsed / done_here * (self.num_steps - step)
        update_progress_artifact(self.progress_id, 100.0 * step / self.num_steps,
                                 description=f"{self.run_id}: {step}/{self.num_steps} steps, ETA {eta:.0f}s")
        if print_line:
            print(step_line(step, self.num_steps, row.values))
        self._eval_done(row)

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
        create_table_artifact(self.eval_rows, key=artifact_key("rl-eval", self.run_id),
                              description=f"evaluations of run {self.run_id}: pass@1 and pass@k per data source")
        print(eval_line(row.step, row.values))
