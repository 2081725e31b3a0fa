"""One RL iteration: the stages of the step contract, in order, each a Prefect task of the `rl-train` flow run that
commits its output (task runs `rollout-step-<k>`, `reward-step-<k>`, …).

The step is not a subflow of its own: on Prefect's embedded (SQLite) server a subflow cost 1.2 s a step against
0.08 s for its seven tasks (measured on the 2-core machine, 2026-12-02): its heartbeat thread is joined at its end
(up to a second), and its parent task run is created through the API, a write that waited about 2 s behind the
server's recording of the previous tasks' events. The task runs, their retries and the run's artifacts are the same.
"""
from __future__ import annotations

from hybrid_core.types import MetricsRow, RunRef
from tasks.stages import step_tasks


def rl_step(run: RunRef, step: int) -> MetricsRow:
    """rollout → reward → advantage → train → sync, then, when due, the evaluation of the synced policy, the step's
    metrics row and, when due, its checkpoint. A stage already committed for this step's policy is replayed from
    the store, not done again."""
    stage = step_tasks(run)
    stage.rollout(run, step)
    stage.reward(run, step)
    stage.advantage(run, step)
    stage.train(run, step)
    stage.sync(run, step)
    if run.is_eval_due(step):
        stage.eval(run, step)
    row = stage.metrics(run, step)
    if run.is_checkpoint_due(step):
        stage.checkpoint(run, step)
    return row
