"""What GPUs this machine has, asked of nvidia-smi: how many are visible and the smallest one's memory.

Owns the only nvidia-smi calls (`hybrid plan` and `hybrid train` read them before anything starts); it imports no
torch and touches no network, so it answers without initialising CUDA. It knows nothing about a run's
configuration: `plan.placement` compares what a run needs with what this finds.
"""
from __future__ import annotations

import os
import shutil
import subprocess


def count_gpus() -> int:
    """GPUs visible to this process, from `nvidia-smi -L` (no torch import, no network); 0 without a driver."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    found = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return found if visible is None else min(found, len([d for d in visible.split(",") if d.strip()]))


def gpu_memory_gib() -> float | None:
    """Memory of the smallest visible GPU in GiB as CUDA reports it (nvidia-smi's total less what the driver
    reserves), without importing torch; None without a driver."""
    if not shutil.which("nvidia-smi"):
        return None
    for query in ("memory.total,memory.reserved", "memory.total"):  # older drivers lack memory.reserved
        try:
            proc = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=20)
            rows = [[float(v) for v in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired):
            return None
        except ValueError:  # "[N/A]" or an error message instead of numbers
            continue
        if proc.returncode == 0 and rows:
            return min(row[0] - sum(row[1:]) for row in rows) / 1024  # MiB → GiB
    return None
