"""Tasks that start and stop a run's Ray workers, and the one way tasks call a worker method (by name, with a timeout)."""
from __future__ import annotations

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from hybrid_core.config import RunConfig
from hybrid_core.types import RunRef
from hybrid_core.workers import launch, placement


def call(run: RunRef, role: str, method: str, *args):
    """Call `method` on the run's named `role` actor and wait at most the stage timeout."""
    worker = placement.get_worker(run, role)
    return ray.get(getattr(worker, method).remote(*args), timeout=run.stage_timeout_s)


@task(name="start-workers", cache_policy=NO_CACHE, timeout_seconds=1800)
def start_workers(cfg: RunConfig, run: RunRef) -> dict:
    """Create the run's placement group and named actors; returns {"num_steps", "policy_version"}."""
    info = launch.start_workers(cfg, run)
    get_run_logger().info("workers of %s ready in namespace %s: %s", run.run_id, run.namespace, info)
    return info


@task(name="stop-workers", cache_policy=NO_CACHE, timeout_seconds=300)
def stop_workers(run: RunRef) -> None:
    launch.stop_workers(run)
