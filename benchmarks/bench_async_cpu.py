"""Steps per minute of the CPU demo in distributed mode, sync against async with train.async_queue_size 1 and 2, on
one seed and one machine, as ratios from one run of this script; prints one JSON line.

Each mode trains the demo (data/demo.yaml, vLLM without sleep, the engine on a bundle of its own) for STEPS steps in
one Ray session and Prefect server. Steps per minute counts from the first step's metrics commit to the last's
(start-up excluded), from the run's events.jsonl. On 2 cores no speed-up is expected (the engine and the trainer
share the cores): the figure is there to be read on GPUs. Also recorded: each run's reward gain (last 5 steps' mean
minus the first 5's) and its staleness per step.

Writes benchmarks/results/cpu-async-<date>.json. Usage: python benchmarks/bench_async_cpu.py [STORE_ROOT]
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
STEPS = 20
# the same placement in every mode: actor and reference share a bundle, the engine has its own
MODES = {"sync": ("--train.colocate_all=false", "--train.colocate_actor_ref"),
         "async_q1": ("--train.async_enable", "--train.async_queue_size", "1"),
         "async_q2": ("--train.async_enable", "--train.async_queue_size", "2")}


def metrics_commit_times(run_dir: str) -> list[float]:
    lines = (Path(run_dir) / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    return sorted(e["time"] for e in events if e["stage"] == "metrics" and e["event"] == "commit")


def rows(run_dir: str, num_steps: int) -> list[dict]:
    import pyarrow.dataset as pds

    return [pds.dataset(f"{run_dir}/steps/{k}/metrics", format="parquet").to_table().to_pylist()[0]
            for k in range(1, num_steps + 1)]


def train(name: str, store_root: str, *flags: str) -> dict:
    from flows.rl_train import rl_train
    from hybrid_core.flags import parse_cli

    cfg = parse_cli(["--config", str(REPO_ROOT / "data" / "demo.yaml"), "--store.root", store_root,
                     "--vllm.enable_sleep=false", "--train.max_steps", str(STEPS), *flags])
    start = time.perf_counter()
    result = rl_train(cfg, run_id=name)
    wall_s = time.perf_counter() - start
    times = metrics_commit_times(result.run_dir)
    per_minute = 60 * (len(times) - 1) / (times[-1] - times[0])
    curve = rows(result.run_dir, result.num_steps)
    rewards = [row["reward/mean"] for row in curve]
    return {"steps": result.num_steps, "steps_per_minute": round(per_minute, 2), "wall_s": round(wall_s, 1),
            "gain": round(sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5, 4),
            "staleness": [row.get("rollout/staleness", 0.0) for row in curve],
            "rollout_wait_s": [round(row.get("timing_s/rollout_wait", 0.0), 3) for row in curve]}


def main() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="bench-async-")
    runs = {}
    for mode, flags in MODES.items():
        runs[mode] = train(f"bench-{mode}", root, *flags)
        print(mode, json.dumps(runs[mode]), flush=True)
    sync_rate = runs["sync"]["steps_per_minute"]
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
    result = {"date": str(date.today()), "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
              "git_sha": sha, "runs": runs,
              "ratio_to_sync": {mode: round(run["steps_per_minute"] / sync_rate, 3) for mode, run in runs.items()}}
    out = REPO_ROOT / "benchmarks" / "results" / f"cpu-async-{result['date']}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["ratio_to_sync"]))


if __name__ == "__main__":
    main()
