"""Reward curves of the CPU demo, trained (data/demo.yaml) and with `--actor.adam.lr 0`; prints one JSON line.

Writes benchmarks/results/demo-curves-<date>.json and docs/demo_curves.png. Gain = mean reward of the last 5 steps
minus that of the first 5. Usage: python benchmarks/demo_curves.py [STORE_ROOT]
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


def reward_curve(run_dir: str, num_steps: int) -> list[float]:
    import pyarrow.dataset as pds

    return [pds.dataset(f"{run_dir}/steps/{k}/metrics", format="parquet").to_table()
            .column("reward/mean")[0].as_py() for k in range(1, num_steps + 1)]


def train(name: str, store_root: str, *flags: str) -> tuple[list[float], float]:
    from flows.rl_train import rl_train
    from hybrid_core.flags import parse_cli

    cfg = parse_cli(["--config", str(REPO_ROOT / "data" / "demo.yaml"), "--store.root", store_root, *flags])
    start = time.perf_counter()
    result = rl_train(cfg, run_id=name)
    return reward_curve(result.run_dir, result.num_steps), time.perf_counter() - start


def gain(curve: list[float]) -> float:
    return sum(curve[-5:]) / 5 - sum(curve[:5]) / 5


def plot(curves: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, curve in curves.items():
        ax.plot(range(1, len(curve) + 1), curve, marker="o", markersize=3, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward (0-1)")
    ax.set_title("CPU demo: tiny Qwen3-style model, letters task")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="demo-curves-")
    trained, trained_s = train("demo-trained", root)
    frozen, frozen_s = train("demo-lr0", root, "--actor.adam.lr", "0")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
    result = {"date": str(date.today()), "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
              "git_sha": sha, "steps": len(trained), "gain_trained": round(gain(trained), 4),
              "gain_lr0": round(gain(frozen), 4), "wall_s_trained": round(trained_s, 1),
              "wall_s_lr0": round(frozen_s, 1), "reward_trained": [round(r, 4) for r in trained],
              "reward_lr0": [round(r, 4) for r in frozen]}
    out = REPO_ROOT / "benchmarks" / "results" / f"demo-curves-{result['date']}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot({"trained (lr 2e-3)": trained, "lr 0": frozen}, REPO_ROOT / "docs" / "demo_curves.png")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
