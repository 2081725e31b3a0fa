"""The `rl-train` flow: take the run directory's lease, open (or resume) the run, start or re-attach its workers,
run the remaining steps (each its stage tasks), export the final policy, stop the workers.

Called in Python, `rl_train(cfg=...)` validates a dict `cfg` before Prefect creates the flow run (`ConfigFlow`);
a deployment run's parameters are checked by the server against the flow's schema before they are stored.
"""
from __future__ import annotations

import time

from prefect import Flow, get_client
from prefect.runtime import flow_run

from flows.batch_queue import BatchQueue
from flows.credentials import export_store_credentials, export_wandb_key
from flows.reporting import RunReport
from flows.rl_step import rl_step
from flows.run_names import default_run_id
from hybrid_core.config import RunConfig
from hybrid_core.flags import config_from_dict
from hybrid_core.types import RunRef, RunSummary, WorkersStarted
from tasks.stages import committed_rows, samples, step_tasks
from tasks.workers import (RunDirectoryLease, hold_run_dir, open_run, preflight, run_ref, save_model, start_workers,
                           stop_workers)


def tag_flow_run(tag: str) -> None:
    """Tag this flow run (not its task runs: a tagged task asks the server for concurrency slots before it starts,
    and on the embedded SQLite server that request met `database is locked` and a 2 s retry after every long stage:
    6 s of each 38 s iteration on the H200)."""
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, tags=[*flow_run.tags, tag])


def run_steps(cfg: RunConfig, run: RunRef, workers: WorkersStarted, lease: RunDirectoryLease) -> None:
    """Steps `workers.next_step`… as stage tasks of this flow run (committed ones replay), the UI's table starting
    from the store; in async mode with the batches generating ahead (`BatchQueue`)."""
    report = RunReport(run.run_id, workers.num_steps, committed_rows(run))
    if run.is_eval_due(0) and workers.next_step == 1:  # eval.at_start: the initial policy, as step 0
        stage = step_tasks(run)
        stage.eval(run, 0)
        report.initial_eval_done(stage.metrics(run, 0))
    queue = BatchQueue(run, step_tasks(run), workers.next_step, workers.num_steps,
                       is_partial=cfg.train.partial_rollout_enable) if run.async_queue_size else None
    try:
        for step in range(workers.next_step, workers.num_steps + 1):
            lease.check()
            row = rl_step(run, step, queue)
            show = step % cfg.logger.logging_steps == 0 or step == workers.num_steps
            report.step_done(row, samples.submit(run, step), print_line=show)
    finally:
        if queue is not None:
            queue.cancel()
        report.close()
    save_model(run, workers.model_uri)


class ConfigFlow(Flow):
    """A flow whose `cfg` is a RunConfig before Prefect creates the flow run. Prefect stores a call's parameters as
    given and, when its own validation refuses them, logs them whole, so a W&B key inside a dict would be kept in
    its database and printed: a dict is validated here instead (one ConfigError naming every problem, never the
    key), and a RunConfig is stored as its model_dump. Runs from a deployment do not pass through `__call__`."""

    def __call__(self, cfg: RunConfig | dict, *args, **kwargs):
        return super().__call__(config_from_dict(cfg) if isinstance(cfg, dict) else cfg, *args, **kwargs)


def train_run(cfg: RunConfig, run_id: str | None = None, resume: bool = False) -> RunSummary:
    """Train the policy on `cfg`; an existing `run_id` (or `resume`) continues that run without redoing its work."""
    run, started = run_ref(cfg, run_id or default_run_id(cfg)), time.perf_counter()
    if cfg.store.credentials_block:
        print(f"store credentials from Secret block {cfg.store.credentials_block!r}: "
              f"{', '.join(export_store_credentials(cfg.store.credentials_block))}")
    if cfg.logger.wandb.secret_block:
        print(f"W&B key from Secret block {cfg.logger.wandb.secret_block!r}: "
              f"{export_wandb_key(cfg.logger.wandb.secret_block)}")
    plan = preflight(cfg, run, must_exist=resume)
    with hold_run_dir(run) as lease:
        open_run(cfg, run, must_exist=resume)
        tag_flow_run(f"run:{run.run_id}")
        try:
            workers = start_workers(cfg, run, plan)
            print(f"run {run.run_id}: steps {workers.next_step}..{workers.num_steps} of {workers.num_steps}, data "
                  f"under {run.run_dir}")
            run_steps(cfg, run, workers, lease)
        finally:
            stop_workers(run)
    print(f"done in {time.perf_counter() - started:.0f}s; the run's data is in {run.run_dir}")
    return RunSummary(run_id=run.run_id, run_dir=run.run_dir, num_steps=workers.num_steps, model_uri=workers.model_uri)


rl_train = ConfigFlow(train_run, name="rl-train", log_prints=True)
