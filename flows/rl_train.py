"""The `rl-train` flow: start a run's workers, run its steps as subflows, report each, stop the workers."""
from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

from prefect import flow, tags

from flows.rl_step import rl_step
from hybrid_core.config import RunConfig
from hybrid_core.types import RunRef
from tasks.workers import start_workers, stop_workers

STAGE_NAMES = ("rollout", "reward", "advantage", "train", "sync")


def default_run_id(cfg: RunConfig) -> str:
    name = Path(cfg.actor.model_name_or_path or "run").name.lower().replace("_", "-")
    return f"{name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"


def step_line(step: int, num_steps: int, m: dict[str, float]) -> str:
    stages = " ".join(f"{s} {m.get(f'timing_s/{s}', 0.0):.2f}s" for s in STAGE_NAMES)
    return (f"step {step}/{num_steps} | reward {m['reward/mean']:.3f} | response length "
            f"{m['rollout/response_length_mean']:.1f} | kl {m['actor/kl']:.5f} | {stages}")


@flow(name="rl-train", log_prints=True)
def rl_train(cfg: RunConfig, run_id: str | None = None, resume: bool = False) -> dict:
    """Train the policy on `cfg` for every step the data gives (or `train.max_steps`)."""
    if resume:
        raise NotImplementedError("resume=True is not implemented yet (TODO(#4)); start a new run_id")
    run = RunRef(run_id or default_run_id(cfg), cfg.store.root, cfg.train.stage_timeout_s)
    started = time.perf_counter()
    with tags(f"run:{run.run_id}"):
        info = start_workers(cfg, run)
        print(f"run {run.run_id}: {info['num_steps']} steps, data under {run.run_dir}")
        try:
            for step in range(1, info["num_steps"] + 1):
                metrics = rl_step(run, step)
                if step % cfg.logger.logging_steps == 0 or step == info["num_steps"]:
                    print(step_line(step, info["num_steps"], metrics))
        finally:
            stop_workers(run)
    print(f"done in {time.perf_counter() - started:.0f}s; the run's data is in {run.run_dir}")
    return {"run_id": run.run_id, "run_dir": run.run_dir, "num_steps": info["num_steps"]}
