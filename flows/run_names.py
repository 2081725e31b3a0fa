"""A new run's default id: the model's directory name and the UTC time, e.g. `tiny-qwen3-20261201-094531`.

Shared by `hybrid train` (which names the run before anything starts, to check its directory) and the flow.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from hybrid_core.config import RunConfig


def default_run_id(cfg: RunConfig) -> str:
    name = Path(cfg.actor.model_name_or_path or "run").name.lower().replace("_", "-")
    return f"{name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
