"""Helpers for fault tests: a Ray head in its own process group (actors outlive a killed driver), `hybrid train`
as a subprocess with its own PREFECT_HOME, waiting on events.jsonl, and dataset/weight fingerprints."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from prefect_server import free_port

from tests.conftest import REPO_ROOT

BIN = Path(sys.executable).parent
MICRO = ["--config", str(REPO_ROOT / "data" / "demo.yaml"), "--rollout.batch_size", "2",
         "--rollout.n_samples_per_prompt", "2", "--rollout.micro_batch_size", "4", "--train.batch_size", "4",
         "--train.micro_batch_size", "2", "--train.max_steps", "6", "--ckpt.save_steps", "2"]


class RayHead:
    """`ray start --head --block` in its own session, killed as a group at the end (never `ray stop`)."""

    def __init__(self, home: Path):
        self.port, self.temp = free_port(), Path(f"/tmp/rh-{uuid.uuid4().hex[:6]}")
        self.env = os.environ | {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                                 "RAY_ADDRESS": f"127.0.0.1:{self.port}", "PREFECT_HOME": str(home),
                                 "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONUNBUFFERED": "1"}
        self.env.pop("PREFECT_API_URL", None)
        self.proc = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--block", "--port", str(self.port), "--temp-dir", str(self.temp),
             "--num-cpus", "4", "--num-gpus", "0", "--include-dashboard=false", "--disable-usage-stats",
             "--object-store-memory", str(200 * 2**20)], env=self.env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(8)

    def train(self, *args: str, log: Path) -> subprocess.Popen:
        out = open(log, "w")
        return subprocess.Popen([sys.executable, "-m", "flows.cli", "train", *args], cwd=REPO_ROOT, env=self.env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=20)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        subprocess.run(["pkill", "-9", "-f", str(self.temp)], check=False)


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_event(run_dir: Path, step: int, stage: str, event: str, proc: subprocess.Popen, timeout_s: float = 600):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if any((e["step"], e["stage"], e["event"]) == (step, stage, event) for e in events(run_dir)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"hybrid train exited ({proc.returncode}) before {step}/{stage}/{event}")
        time.sleep(0.05)
    raise AssertionError(f"no {step}/{stage}/{event} event within {timeout_s}s")


def fingerprint(run_dir: Path) -> dict:
    """Content hashes of every committed stage dataset of every step, and of the final weights."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    hashes = {f"{k}/{stage}": entry["hash"] for k, stages in manifest["steps"].items()
              for stage, entry in stages.items() if isinstance(entry, dict) and "hash" in entry}
    weights = run_dir / "model" / "model.safetensors"
    return hashes | {"weights": hashlib.sha256(weights.read_bytes()).hexdigest()}
