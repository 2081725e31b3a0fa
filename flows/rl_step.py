"""One RL iteration as a Prefect subflow: the stages of the step contract, in order, each committing its output."""
from __future__ import annotations

from prefect import flow

from hybrid_core.types import MetricsRow, RunRef
from tasks.stages import step_tasks


@flow(name="rl-step", flow_run_name="step-{step}")
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
