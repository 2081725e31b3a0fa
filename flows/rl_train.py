"""The `rl-train` flow: open (or resume) a run, start or re-attach its workers, run the remaining steps as subflows
with checkpoints, export the final policy, stop the workers."""
from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

from prefect import flow, get_client
from prefect.runtime import flow_run

from flows.credentials import export_store_credentials
from flows.reporting import RunReport
from flows.rl_step import rl_step
from hybrid_core.config import RunConfig
from hybrid_core.types import RunRef
from tasks.stages import samples
from tasks.workers import checkpoint, open_run, save_model, start_workers, stop_workers


def default_run_id(cfg: RunConfig) -> str:
    name = Path(cfg.actor.model_name_or_path or "run").name.lower().replace("_", "-")
    return f"{name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"


def tag_flow_run(tag: str) -> None:
    """Tag this flow run (not its task runs: a tagged task asks the server for concurrency slots before it starts,
    and on the embedded SQLite server that request met `database is locked` and a 2 s retry after every long stage:
    6 s of each 38 s iteration on the H200)."""
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, tags=[*flow_run.tags, tag])


def run_ref(cfg: RunConfig, run_id: str) -> RunRef:
    t = cfg.train
    return RunRef(run_id, cfg.store.root, t.stage_timeout_s, cfg.roles, t.stage_retries, t.retry_delay_s)


@flow(name="rl-train", log_prints=True)
def rl_train(cfg: RunConfig, run_id: str | None = None, resume: bool = False) -> dict:
    """Train the policy on `cfg`; an existing `run_id` (or `resume`) continues that run without redoing its work."""
    run, started = run_ref(cfg, run_id or default_run_id(cfg)), time.perf_counter()
    if cfg.store.credentials_block:
        print(f"store credentials from Secret block {cfg.store.credentials_block!r}: "
              f"{', '.join(export_store_credentials(cfg.store.credentials_block))}")
    if not open_run(cfg, run) and resume:
        raise ValueError(f"resume: no run to resume at {run.run_dir}; start it without --resume")
    tag_flow_run(f"run:{run.run_id}")
    info = start_workers(cfg, run)
    num_steps, first = info["num_steps"], info["resume_from"] + 1
    print(f"run {run.run_id}: steps {first}..{num_steps} of {num_steps}, data under {run.run_dir}")
    report = RunReport(run.run_id, num_steps)
    try:
        for step in range(first, num_steps + 1):
            metrics = rl_step(run, step)
            if cfg.ckpt.save_steps > 0 and step % cfg.ckpt.save_steps == 0:
                checkpoint(run, step)
            show = step % cfg.logger.logging_steps == 0 or step == num_steps
            report.step_done(step, metrics, samples(run, step), print_line=show)
        save_model(run, info["model_uri"])
    finally:
        stop_workers(run)
    print(f"done in {time.perf_counter() - started:.0f}s; the run's data is in {run.run_dir}")
    return {"run_id": run.run_id, "run_dir": run.run_dir, "num_steps": num_steps, "model": info["model_uri"]}
