"""Where a step's metrics row goes besides the store: TensorBoard event files and Weights & Biases.

Owns the two writers (`--logger.tensorboard_dir`; W&B, online when WANDB_API_KEY is in the process's environment,
local files with `--logger.wandb.key offline`) and their `train/`- and `eval/`-prefixed keys with the step as x-axis,
as OpenRLHF logs them. The API key never passes through here: W&B reads it from the environment. It knows nothing
about how metrics are made.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class SinkSettings:
    run_id: str
    tensorboard_dir: str | None = None
    wandb_project: str | None = None  # None: W&B off
    wandb_mode: str | None = None     # "offline": files under wandb_dir; None: W&B's own (WANDB_MODE, else online)
    wandb_org: str | None = None
    wandb_group: str | None = None
    wandb_run_name: str | None = None
    wandb_dir: str | None = None


class MetricSinks:
    """Opened once per run in the process that writes metrics rows; `log` per step, `close` at the end."""

    def __init__(self, s: SinkSettings):
        self.tb = self.wandb_run = None
        if s.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=os.path.join(s.tensorboard_dir, s.run_id))
        if s.wandb_project:
            self.wandb_run = _start_wandb(s)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        scalars = {_logged_key(k): float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(key, value, global_step=step)
            self.tb.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(scalars | {"train/global_step": step}, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def _logged_key(key: str) -> str:
    """OpenRLHF's names: evaluation figures under `eval/`, everything else under `train/`."""
    return key if key.startswith("eval/") else f"train/{key}"


def _start_wandb(s: SinkSettings):
    import wandb

    return wandb.init(project=s.wandb_project, entity=s.wandb_org, group=s.wandb_group,
                      name=s.wandb_run_name or s.run_id, id=s.run_id, dir=s.wandb_dir, resume="allow",
                      mode=s.wandb_mode, reinit="finish_previous")
