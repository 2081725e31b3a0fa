"""The five stages of a step as Prefect tasks: each calls one worker method and returns a small StageResult.

Retries only where a stage is idempotent (seeded generation and scoring, committed atomically; weight pushes);
`train` never retries blindly. Tasks hold no tensors and do no maths.
"""
from __future__ import annotations

import time
from dataclasses import replace

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from hybrid_core.types import RunRef, StageResult
from tasks.workers import call

STAGE_OPTIONS = dict(cache_policy=NO_CACHE, retry_delay_seconds=5)


def _stage_call(run: RunRef, role: str, method: str, step: int) -> StageResult:
    """Call the worker's stage method and log its result with the call's wall time beside the worker's own, and the
    dispatch: from the call to the worker beginning it (Ray's queue, or the worker still busy after its last call),
    which also goes into the step's metrics row as `timing_s/dispatch_<stage>`."""
    started, started_wall = time.perf_counter(), time.time()
    result = call(run, role, method, step, step=step)
    call_s, dispatch_s = time.perf_counter() - started, max(0.0, result.entered_at - started_wall)
    extra = " ".join(f"{k}={v:.4g}" for k, v in result.metrics.items())
    get_run_logger().info("%s step %d: %d rows in %.2fs (call %.2fs, dispatch %.2fs) %s", result.stage, result.step,
                          result.rows, result.seconds, call_s, dispatch_s, extra)
    return replace(result, metrics=result.metrics | {f"timing_s/dispatch_{result.stage}": dispatch_s})


@task(name="rollout", task_run_name="rollout-step-{step}", retries=2, **STAGE_OPTIONS)
def rollout(run: RunRef, step: int) -> StageResult:
    """Wake the engines, generate n samples per prompt of step `step`, sleep them, commit `rollout`."""
    return _stage_call(run, "rollout", "generate", step)


@task(name="reward", task_run_name="reward-step-{step}", retries=2, **STAGE_OPTIONS)
def reward(run: RunRef, step: int) -> StageResult:
    """Score the committed rollouts with the reward function; commit `reward`."""
    return _stage_call(run, "rollout", "score", step)


@task(name="advantage", task_run_name="advantage-step-{step}", retries=1, **STAGE_OPTIONS)
def advantage(run: RunRef, step: int) -> StageResult:
    """Old and reference logprobs, KL, baselines, returns, whitening; commit `advantage`."""
    return _stage_call(run, "actor", "make_experience", step)


@task(name="train", task_run_name="train-step-{step}", retries=0, **STAGE_OPTIONS)
def train(run: RunRef, step: int) -> StageResult:
    """Wake DeepSpeed, update the critic (gae) then the policy on the step's samples, put them back to sleep."""
    critic = _stage_call(run, "critic", "train", step) if "critic" in run.roles else None
    actor = _stage_call(run, "actor", "train", step)
    if critic is None:
        return actor
    return StageResult("train", step, critic.seconds + actor.seconds, metrics=critic.metrics | actor.metrics)


@task(name="sync", task_run_name="sync-step-{step}", retries=2, **STAGE_OPTIONS)
def sync(run: RunRef, step: int, timings: dict[str, float], extra: dict[str, float]) -> dict[str, float]:
    """Push the new weights to the rollout engines (bucketed), then commit the step's metrics row."""
    result = _stage_call(run, "actor", "sync", step)
    extra = extra | result.row_metrics()
    return call(run, "actor", "write_metrics", step, timings | {"sync": result.seconds}, extra, step=step)


@task(name="samples", task_run_name="samples-step-{step}", retries=1, **STAGE_OPTIONS)
def samples(run: RunRef, step: int) -> list[dict]:
    """A few decoded samples of the step with their rewards, for the run's UI."""
    return call(run, "rollout", "preview", step, step=step)
