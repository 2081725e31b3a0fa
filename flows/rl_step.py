"""One RL iteration as a Prefect subflow: rollout → reward → advantage → train → sync."""
from __future__ import annotations

from prefect import flow

from hybrid_core.types import RunRef
from tasks.stages import advantage, reward, rollout, sync, train


@flow(name="rl-step", flow_run_name="step-{step}")
def rl_step(run: RunRef, step: int) -> dict[str, float]:
    """Run the five stages of step `step`; returns the committed metrics row."""
    timings, extra = {}, {}
    retried = dict(retries=run.stage_retries, retry_delay_seconds=run.retry_delay_s)
    for stage in (rollout.with_options(**retried), reward.with_options(**retried), advantage, train):
        result = stage(run, step)
        timings[stage.name] = result.seconds
        extra |= result.row_metrics()
    return sync.with_options(**retried)(run, step, timings, extra)
