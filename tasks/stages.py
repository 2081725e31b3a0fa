"""The stages of a step as Prefect tasks: each calls the worker method the step contract names and returns a small
record; `step_tasks(run)` gives them the run's retry settings.

Retries come only from the run's configuration (`train.stage_retries`, `train.retry_delay_s`), only for stages whose
attempts are idempotent (the contract's `is_retried`), and never for an error a retry cannot fix (a
`PermanentError`: bad reward output, altered committed data, a replay that did not reproduce). Tasks hold no tensors
and do no maths.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from hybrid_core.step_contract import (ADVANTAGE, CHECKPOINT, EVAL, METRICS, REWARD, ROLLOUT, SYNC, TRAIN, Stage,
                                       retry_policy)
from hybrid_core.types import MetricsRow, PermanentError, RunRef, Sample, StageResult
from tasks.workers import call

STAGE_OPTIONS = dict(cache_policy=NO_CACHE)


def _stage_call(run: RunRef, stage: Stage, step: int) -> StageResult:
    """Call the stage's worker method and log its result with the call's wall time beside the worker's own and the
    dispatch (from the call to the worker beginning it); the worker records both with the stage."""
    started = time.perf_counter()
    result = call(run, stage.role, stage.method, step, stage=stage.name, step=step, called_at=time.time())
    extra = " ".join(f"{k}={v:.4g}" for k, v in result.metrics.items() if isinstance(v, (int, float)))
    verb = "replayed" if result.replayed else "committed"
    get_run_logger().info("%s step %d: %s, %d rows in %.2fs (call %.2fs) %s", result.stage, result.step, verb,
                          result.rows, result.seconds, time.perf_counter() - started, extra)
    return result


@task(name="rollout", task_run_name="rollout-step-{step}", **STAGE_OPTIONS)
def rollout(run: RunRef, step: int) -> StageResult:
    """Wake the engines, generate n samples per prompt of step `step`, sleep them, commit `rollout`."""
    return _stage_call(run, ROLLOUT, step)


@task(name="reward", task_run_name="reward-step-{step}", **STAGE_OPTIONS)
def reward(run: RunRef, step: int) -> StageResult:
    """Score the committed rollouts with the run's reward source; commit `reward`. The advantage stage's reference
    and critic forwards of the same rollouts start first and run on the GPU meanwhile (`ActorWorker.start_forwards`:
    not when a reward model needs the GPU)."""
    call(run, ADVANTAGE.role, "start_forwards", step, stage=REWARD.name, step=step)
    return _stage_call(run, REWARD, step)


@task(name="advantage", task_run_name="advantage-step-{step}", **STAGE_OPTIONS)
def advantage(run: RunRef, step: int) -> StageResult:
    """Old and reference logprobs, critic values, KL, baselines, returns, whitening; commit `advantage`."""
    return _stage_call(run, ADVANTAGE, step)


@task(name="train", task_run_name="train-step-{step}", **STAGE_OPTIONS)
def train(run: RunRef, step: int) -> StageResult:
    """Wake DeepSpeed, update the critic (gae) then the policy on the step's samples, sleep; record `train`."""
    return _stage_call(run, TRAIN, step)


@task(name="sync", task_run_name="sync-step-{step}", **STAGE_OPTIONS)
def sync(run: RunRef, step: int) -> StageResult:
    """Push the new weights to the rollout engines (bucketed); record `sync` (the engines hold version `step`)."""
    return _stage_call(run, SYNC, step)


@task(name="eval", task_run_name="eval-step-{step}", **STAGE_OPTIONS)
def evaluate(run: RunRef, step: int) -> StageResult:
    """Sample the eval prompts with the policy step `step` synced (0: the initial one), score them; commit `eval`."""
    return _stage_call(run, EVAL, step)


@task(name="metrics", task_run_name="metrics-step-{step}", **STAGE_OPTIONS)
def metrics(run: RunRef, step: int) -> MetricsRow:
    """Commit the step's metrics row, built by the actor from what the step committed."""
    return call(run, METRICS.role, METRICS.method, step, stage=METRICS.name, step=step, called_at=time.time())


@task(name="checkpoint", task_run_name="checkpoint-step-{step}", **STAGE_OPTIONS)
def checkpoint(run: RunRef, step: int) -> StageResult:
    """DeepSpeed checkpoints of the critic and the actor after step `step` (rotation to ckpt.max_num)."""
    return _stage_call(run, CHECKPOINT, step)


@task(name="samples", task_run_name="samples-step-{step}", retries=1, **STAGE_OPTIONS)
def samples(run: RunRef, step: int) -> list[Sample]:
    """A few decoded samples of the step with their rewards, for the run's UI."""
    return call(run, "rollout", "preview", step, stage="preview", step=step)


@task(name="committed-rows", retries=1, **STAGE_OPTIONS)
def committed_rows(run: RunRef) -> list[MetricsRow]:
    """The run's committed metrics rows (the UI's table starts from them after a resume)."""
    return call(run, "actor", "committed_rows", stage="committed-rows")


def is_retryable(task: Task, task_run, state) -> bool:
    """Prefect's retry condition: an attempt is retried unless its error is one a retry cannot fix."""
    return not isinstance(state.data, PermanentError)


@dataclass(frozen=True, kw_only=True)
class StepTasks:
    """The tasks of one step with the run's retry settings."""

    rollout: Task
    reward: Task
    advantage: Task
    train: Task
    sync: Task
    eval: Task
    metrics: Task
    checkpoint: Task


def step_tasks(run: RunRef) -> StepTasks:
    """Each stage's task with its retry policy from the step contract and the run's configuration."""
    def configured(stage_task: Task, stage: Stage) -> Task:
        policy = retry_policy(stage, run.stage_retries, run.retry_delay_s)
        return stage_task.with_options(retries=policy.retries, retry_delay_seconds=policy.delay_s,
                                       retry_condition_fn=is_retryable)

    return StepTasks(rollout=configured(rollout, ROLLOUT), reward=configured(reward, REWARD),
                     advantage=configured(advantage, ADVANTAGE), train=configured(train, TRAIN),
                     sync=configured(sync, SYNC), eval=configured(evaluate, EVAL),
                     metrics=configured(metrics, METRICS), checkpoint=configured(checkpoint, CHECKPOINT))
