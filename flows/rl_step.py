"""One RL iteration: the stages of the step contract, in order, each a Prefect task of the `rl-train` flow run that
commits its output (task runs `rollout-step-<k>`, `reward-step-<k>`, …).

The step is not a subflow of its own: on Prefect's embedded (SQLite) server a subflow cost 1.2 s a step against
0.08 s for its seven tasks (measured on the 2-core machine, 2026-12-02): its heartbeat thread is joined at its end
(up to a second), and its parent task run is created through the API, a write that waited about 2 s behind the
server's recording of the previous tasks' events. The task runs, their retries and the run's artifacts are the same.
"""
from __future__ import annotations

import time

from flows.batch_queue import BatchQueue
from hybrid_core.types import MetricsRow, RunRef
from tasks.stages import step_tasks


def rl_step(run: RunRef, step: int, queue: BatchQueue | None = None) -> MetricsRow:
    """rollout → reward → advantage → train → sync, then, when due, the evaluation of the synced policy, the step's
    metrics row and, when due, its checkpoint. A stage already committed for this step's policy is replayed from
    the store, not done again. Async mode (`queue`): the rollout commits the batch generated ahead, and the sync
    waits for the last batch of the version it replaces, then starts the next one."""
    stage = step_tasks(run)
    if queue is None:
        stage.rollout(run, step)
    else:
        started_at = time.time()
        waited_s, generated = queue.wait(step)
        stage.rollout(run, step, waited_s, wait_for=generated)
    stage.reward(run, step)
    stage.advantage(run, step)
    stage.train(run, step)
    if queue is not None:
        queue.before_sync(step)
    stage.sync(run, step)
    if queue is not None:
        queue.after_sync(step)
    if run.is_eval_due(step):
        stage.eval(run, step)
    row = stage.metrics(run, step) if queue is None else stage.metrics(run, step, started_at)
    if run.is_checkpoint_due(step):
        stage.checkpoint(run, step)
    return row
