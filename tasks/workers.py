"""Tasks that open a run, start (or re-attach to) its Ray workers and stop them, and export the policy; the run
directory's lease; and the one way tasks call a worker method: by name, within the stage timeout, failing with the
real role, rank, step, stage and cause (and telling Prefect whether a retry can help).
"""
from __future__ import annotations

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from hybrid_core.config import RunConfig
from hybrid_core.plan.gpu_probe import count_gpus, gpu_memory_gib
from hybrid_core.plan.preflight import PreflightError, check_run
from hybrid_core.plan.run_plan import RunPlan
from hybrid_core.types import PermanentError, RunRef, WorkersStarted
from hybrid_core.workers import launch, placement
from hybrid_core.workers.rank_group import RankFailure
from hybrid_core.workers.worker_args import run_ref  # noqa: F401  (the flow names its run through the tasks)


class WorkerCallError(RuntimeError):
    """A worker died, hung past the stage timeout, or raised: names the role, rank, step and stage."""


class PermanentWorkerError(WorkerCallError, PermanentError):
    """A worker failed in a way that calling it again cannot fix (its cause is a PermanentError)."""


def _where(run: RunRef, role: str, rank: int, stage: str, step: int | None) -> str:
    return f"{role} rank {rank} ({run.actor_name(role, rank)}) in {stage}" + (f" of step {step}" if step else "")


def _failure(run: RunRef, role: str, stage: str, step: int | None, err: ray.exceptions.RayTaskError) -> Exception:
    """The worker's own error, named by the rank it happened on (a peer that rank 0 led, or rank 0 itself)."""
    cause = getattr(err, "cause", None) or err
    if isinstance(cause, RankFailure):
        where = _where(run, cause.role, cause.rank, stage, step) + f" (led by {role} rank 0)"
        is_permanent, text = cause.is_permanent, cause.what
    else:
        where = _where(run, role, 0, stage, step)
        is_permanent, text = isinstance(cause, PermanentError), f"failed: {type(cause).__name__}: {cause}"
    return (PermanentWorkerError if is_permanent else WorkerCallError)(f"{where} {text}")


def call(run: RunRef, role: str, method: str, *args, stage: str | None = None, step: int | None = None,
         group: str | None = None, **kwargs):
    """Call `method` on rank 0 of the run's `role` (in its Ray concurrency `group`, when given) and wait at most the
    stage timeout."""
    stage = stage or method
    try:
        worker = placement.get_worker(run, role)
    except ValueError as err:
        raise WorkerCallError(f"{_where(run, role, 0, stage, step)}: no such actor ({err}); resume the run to "
                              "recreate it") from err
    try:
        bound = getattr(worker, method)
        bound = bound.options(concurrency_group=group) if group else bound
        return ray.get(bound.remote(*args, **kwargs), timeout=run.stage_timeout_s)
    except ray.exceptions.GetTimeoutError as err:
        raise WorkerCallError(f"{_where(run, role, 0, stage, step)}: no answer within {run.stage_timeout_s:.0f}s "
                              "(train.stage_timeout_s); the worker is hung or the stage needs a longer "
                              "timeout") from err
    except ray.exceptions.RayActorError as err:
        raise WorkerCallError(f"{_where(run, role, 0, stage, step)}: the actor died ({type(err).__name__}); resume "
                              "the run to recreate it from the newest checkpoint") from err
    except ray.exceptions.RayTaskError as err:
        raise _failure(run, role, stage, step, err) from err


class RunDirectoryLease:
    """The run directory's lease for the flow's lifetime (`with hold_run_dir(run) as lease:`)."""

    def __init__(self, run: RunRef):
        self.lease = launch.lease_run_dir(run)

    def __enter__(self) -> RunDirectoryLease:
        self.lease.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.lease.release()

    def check(self) -> None:
        """Fail the run if another run took the lease over (its heartbeat stopped for too long)."""
        self.lease.check()


def hold_run_dir(run: RunRef) -> RunDirectoryLease:
    return RunDirectoryLease(run)


@task(name="preflight", cache_policy=NO_CACHE, timeout_seconds=300)
def preflight(cfg: RunConfig, run: RunRef, must_exist: bool = False) -> RunPlan:
    """Every check `hybrid train` makes before it starts anything, so every entry point refuses the same problems:
    the flow run fails here, before any worker, listing them all. Returns the run's plan, which the workers start
    on."""
    num_gpus = placement.cluster_gpus()  # a Ray cluster's GPUs, else this machine's
    plan, problems = check_run(cfg, run.run_dir, count_gpus() if num_gpus is None else num_gpus, gpu_memory_gib(),
                               must_exist=must_exist)
    if problems:
        raise PreflightError(problems)
    return plan


@task(name="open-run", cache_policy=NO_CACHE, timeout_seconds=300)
def open_run(cfg: RunConfig, run: RunRef, must_exist: bool = False) -> bool:
    """Save the configuration of a new run, or check it against the saved one; True when the run existed."""
    return launch.open_run(cfg, run, must_exist)


# log_prints off: counting the prompts hashes them with `datasets`' dill, which captures `dis.dis` output to read a
# function's globals, and the flow's print capture would log those lines (and leave dill's capture empty) instead
@task(name="start-workers", cache_policy=NO_CACHE, timeout_seconds=1800, log_prints=False)
def start_workers(cfg: RunConfig, run: RunRef, plan: RunPlan) -> WorkersStarted:
    """Re-attach to the run's live actors or create them on `plan` from the newest checkpoint; see
    launch.start_workers."""
    started = launch.start_workers(cfg, run, plan)
    get_run_logger().info("workers of %s ready in namespace %s: %s", run.run_id, run.namespace, started)
    return started


@task(name="save-model", cache_policy=NO_CACHE, retries=1)
def save_model(run: RunRef, out_uri: str) -> str:
    """The final policy as HF weights (ckpt.output_dir, default <run dir>/model)."""
    return call(run, "actor", "save_model", out_uri, stage="save-model")


@task(name="stop-workers", cache_policy=NO_CACHE, timeout_seconds=300)
def stop_workers(run: RunRef) -> None:
    launch.stop_workers(run)
