"""A peer run's results file, in the layout of run_all.py's (`meta`, `figures`, `trials`, `notes`, `errors`), with
the figures our iteration benchmark writes: `iteration_steps_committed`, `iteration_wall_s` (mean of steps 2 and
later, each step's wall in its trials) and `iteration_stage_s` (the peer's own stages, mean of the same steps, plus
`other` = wall − stages; each step's stages in its trials). Rewritten after every step, so a run cut off keeps the
steps it finished.

Owns the arithmetic and the metadata; knows nothing about how a peer is run or where its stage times come from.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import asdict
from datetime import date
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

FIRST_TIMED_STEP = 2  # step 1 warms up (first CUDA graphs, allocator, JIT), as in bench_iteration


def mean_step_figures(walls: dict[int, float], stages: dict[int, dict[str, float]]) -> tuple[float, dict] | None:
    """(mean wall, mean seconds per stage with `other`) over the timed steps that have both a wall and stages;
    None before the first timed step."""
    timed = [k for k in sorted(walls) if k >= FIRST_TIMED_STEP and k in stages]
    if not timed:
        return None
    wall = statistics.fmean(walls[k] for k in timed)
    names = list(dict.fromkeys(name for k in timed for name in stages[k]))
    mean_stages = {name: statistics.fmean(stages[k].get(name, 0.0) for k in timed) for name in names}
    mean_stages["other"] = wall - sum(mean_stages.values())
    return wall, mean_stages


def record_steps(results, walls: dict[int, float], stages: dict[int, dict[str, float]]) -> None:
    """Write the iteration figures for the steps seen so far (called after every step)."""
    results.figure("iteration_steps_committed", len(stages))
    means = mean_step_figures(walls, stages)
    if means is None:
        return
    wall, mean_stages = means
    results.figure("iteration_wall_s", wall, trials={k: walls[k] for k in sorted(walls)})
    results.figure("iteration_stage_s", mean_stages, trials={k: stages[k] for k in sorted(stages)})


def open_results(out: Path, *, peer: str, how: str, model_dir: Path, shape, git_sha: str, packages: tuple[str, ...]):
    """A run_all.Results for `peer`, its meta saying how the peer ran (`how`), with which packages and shape."""
    from run_all import Results, machine, model_shape

    meta = {"peer": peer, "how": how, "git_sha": git_sha, "command": " ".join(sys.argv), "date": str(date.today()),
            "versions": installed_versions(packages), "machine": machine(), "model": str(model_dir),
            "shape": model_shape(model_dir),
            "iteration_shape": {key: str(value) if isinstance(value, Path) else value
                                for key, value in asdict(shape).items()}}
    return Results(out, meta)


def installed_versions(packages: tuple[str, ...]) -> dict:
    """run_all.versions()'s fields plus `packages`, read from the installed distributions and nvidia-smi: no
    import of vLLM or DeepSpeed and no CUDA context in a wrapper process (time and GPU memory the peer would lose)."""
    import platform
    import subprocess

    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    found |= {name: package_version(name) for name in ("vllm", "deepspeed", "transformers", *packages)}
    try:
        gpu = subprocess.run(["nvidia-smi", "--id=0", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        name, total_mib = gpu.rsplit(",", 1)
        found["gpu"], found["gpu_total_gib"] = name.strip(), round(int(total_mib) / 1024, 2)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        found["gpu"] = None  # no NVIDIA GPU here
    return found


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
