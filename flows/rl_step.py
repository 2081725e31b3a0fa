"""One RL iteration as a Prefect subflow: rollout → reward → advantage → train → sync."""
from __future__ import annotations

from prefect import flow

from hybrid_core.types import RunRef
from tasks.stages import advantage, reward, rollout, sync, train


@flow(name="rl-step", flow_run_name="step-{step}")
def rl_step(run: RunRef, step: int) -> dict[str, float]:
    """Run the five stages of step `step`; returns the committed metrics row."""
    timings = {}
    for stage in (rollout, reward, advantage, train):
        timings[stage.name] = stage(run, step).seconds
    return sync(run, step, timings)
