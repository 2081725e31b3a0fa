"""Tasks that open a run, start (or re-attach to) its Ray workers and stop them, checkpoint and export the policy,
and the one way tasks call a worker method: by name, with a timeout, failing with the role, step and stage named."""
from __future__ import annotations

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from hybrid_core.config import RunConfig
from hybrid_core.types import RunRef
from hybrid_core.workers import launch, placement


class WorkerCallError(RuntimeError):
    """A worker died, hung past the stage timeout, or raised: names the role, rank, step and stage."""


def call(run: RunRef, role: str, method: str, *args, step: int | None = None):
    """Call `method` on the run's named `role` actor and wait at most the stage timeout."""
    where = f"{role} worker {run.actor_name(role)} (rank 0) in {method}" + (f" of step {step}" if step else "")
    try:
        worker = placement.get_worker(run, role)
        return ray.get(getattr(worker, method).remote(*args), timeout=run.stage_timeout_s)
    except ValueError as err:
        raise WorkerCallError(f"{where}: no such actor ({err}); resume the run to recreate it") from err
    except ray.exceptions.GetTimeoutError as err:
        raise WorkerCallError(f"{where}: no answer within {run.stage_timeout_s:.0f}s (train.stage_timeout_s)") from err
    except ray.exceptions.RayActorError as err:
        raise WorkerCallError(f"{where}: the actor died ({type(err).__name__}); resume the run to recreate it "
                              "from the newest checkpoint") from err
    except ray.exceptions.RayTaskError as err:
        raise WorkerCallError(f"{where} failed: {err.cause!r}") from err


@task(name="open-run", cache_policy=NO_CACHE, timeout_seconds=300)
def open_run(cfg: RunConfig, run: RunRef) -> bool:
    """Save the configuration of a new run, or check it against the saved one; True when the run existed."""
    return launch.open_run(cfg, run)


@task(name="start-workers", cache_policy=NO_CACHE, timeout_seconds=1800)
def start_workers(cfg: RunConfig, run: RunRef) -> dict:
    """Re-attach to the run's live actors or create them from the newest checkpoint; see launch.start_workers."""
    info = launch.start_workers(cfg, run)
    get_run_logger().info("workers of %s ready in namespace %s: %s", run.run_id, run.namespace, info)
    return info


@task(name="checkpoint", task_run_name="checkpoint-step-{step}", cache_policy=NO_CACHE, retries=1)
def checkpoint(run: RunRef, step: int) -> str:
    """DeepSpeed checkpoints of the critic and the actor after step `step` (rotation to ckpt.max_num)."""
    if "critic" in run.roles:
        call(run, "critic", "save_checkpoint", step, step=step)
    return call(run, "actor", "save_checkpoint", step, step=step)


@task(name="save-model", cache_policy=NO_CACHE, retries=1)
def save_model(run: RunRef, out_uri: str) -> str:
    """The final policy as HF weights (ckpt.output_dir, default <run dir>/model)."""
    return call(run, "actor", "save_model", out_uri)


@task(name="stop-workers", cache_policy=NO_CACHE, timeout_seconds=300)
def stop_workers(run: RunRef) -> None:
    launch.stop_workers(run)
