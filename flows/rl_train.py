"""The `rl-train` flow: start a run's workers, run its steps as subflows, report each, stop the workers."""
from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

from prefect import flow, tags

from flows.reporting import RunReport
from flows.rl_step import rl_step
from hybrid_core.config import RunConfig
from hybrid_core.types import RunRef
from tasks.stages import samples
from tasks.workers import start_workers, stop_workers


def default_run_id(cfg: RunConfig) -> str:
    name = Path(cfg.actor.model_name_or_path or "run").name.lower().replace("_", "-")
    return f"{name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"


@flow(name="rl-train", log_prints=True)
def rl_train(cfg: RunConfig, run_id: str | None = None, resume: bool = False) -> dict:
    """Train the policy on `cfg` for every step the data gives (or `train.max_steps`)."""
    if resume:
        raise NotImplementedError("resume=True is not implemented yet (TODO(#4)); start a new run_id")
    run = RunRef(run_id or default_run_id(cfg), cfg.store.root, cfg.train.stage_timeout_s, cfg.roles)
    started = time.perf_counter()
    with tags(f"run:{run.run_id}"):
        info = start_workers(cfg, run)
        num_steps = info["num_steps"]
        print(f"run {run.run_id}: {num_steps} steps, data under {run.run_dir}")
        report = RunReport(run.run_id, num_steps)
        try:
            for step in range(1, num_steps + 1):
                metrics = rl_step(run, step)
                show = step % cfg.logger.logging_steps == 0 or step == num_steps
                report.step_done(step, metrics, samples(run, step), print_line=show)
        finally:
            stop_workers(run)
    print(f"done in {time.perf_counter() - started:.0f}s; the run's data is in {run.run_dir}")
    return {"run_id": run.run_id, "run_dir": run.run_dir, "num_steps": num_steps}
