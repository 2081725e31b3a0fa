"""Helpers for fault tests: a Ray head in its own process group (actors outlive a killed driver), `hybrid train`
as a subprocess with its own PREFECT_HOME, waiting on events.jsonl, and dataset/weight fingerprints."""
from __future__ import annotations

import hashlib
import json
import os
import re
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
         "--train.micro_batch_size", "2", "--train.max_steps", "7", "--ckpt.save_steps", "2"]


class RayHead:
    """`ray start --head --block` in its own session, killed as a group at the end (never `ray stop`)."""

    def __init__(self, home: Path, s3_endpoint: str, api_url: str | None = None):
        """`api_url`: the Prefect server every `hybrid train` of this head talks to (the test session's, which no
        killed driver takes down); None: each starts its own embedded server."""
        self.port, self.temp = free_port(), Path(f"/tmp/rh-{uuid.uuid4().hex[:6]}")
        self.env = os.environ | S3_ENV | {"AWS_ENDPOINT_URL": s3_endpoint} | {
            "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": f"127.0.0.1:{self.port}",
            "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONUNBUFFERED": "1"}
        self.env.pop("PREFECT_API_URL", None)
        if api_url:
            self.env["PREFECT_API_URL"] = api_url
        self.proc = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--block", "--port", str(self.port), "--temp-dir", str(self.temp),
             "--num-cpus", "4", "--num-gpus", "0", "--include-dashboard=false", "--disable-usage-stats",
             "--object-store-memory", str(200 * 2**20)], env=self.env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(8)

    def train(self, *args: str, log: Path, faults: str = "", release: Path | None = None) -> subprocess.Popen:
        """`hybrid train ARGS` against this head; `faults` is the run's HYBRID_FAULTS and `release` the file a
        `hold` fault waits for (see workers.faults)."""
        out = open(log, "w")
        env = self.env | ({"HYBRID_FAULTS": faults} if faults else {}) | \
            ({"HYBRID_FAULTS_RELEASE": str(release)} if release else {})
        return subprocess.Popen([sys.executable, "-m", "flows.cli", "train", *args], cwd=REPO_ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        """SIGKILL the head's process group, then every process of its temp dir (Ray's workers run in sessions of
        their own). `ray start --block` did not end within 20 s of a SIGTERM, and the head keeps nothing to save."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        subprocess.run(["pkill", "-9", "-f", str(self.temp)], check=False)


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class MotoServer:
    """A real S3-compatible server on loopback (moto's), for stores on s3://."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(3)

    def filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": self.url},
                                 use_listings_cache=False, skip_instance_cache=True)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=20)


def _read(run_dir, name: str, fs=None) -> bytes | None:
    if fs is None:
        path = Path(run_dir) / name
        return path.read_bytes() if path.exists() else None
    path = f"{str(run_dir).removeprefix('s3://')}/{name}"
    return fs.cat_file(path) if fs.exists(path) else None


def events(run_dir, fs=None) -> list[dict]:
    text = _read(run_dir, "events.jsonl", fs)
    return [json.loads(line) for line in text.decode().splitlines()] if text else []


def wait_for_event(run_dir, step: int, stage: str, event: str, proc: subprocess.Popen, timeout_s: float = 600,
                   fs=None):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if any((e["step"], e["stage"], e["event"]) == (step, stage, event) for e in events(run_dir, fs)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"hybrid train exited ({proc.returncode}) before {step}/{stage}/{event}")
        # a micro step's train and sync take ~80 ms: a kill aimed between them must land fast (local files are
        # cheap to poll; the S3 server is asked less often)
        time.sleep(0.005 if fs is None else 0.05)
    raise AssertionError(f"no {step}/{stage}/{event} event within {timeout_s}s")


VOLATILE = ("timing_s/", "rollout/tokens_per_s", "memory_gib/")


def fingerprint(run_dir, fs=None) -> dict:
    """What two runs of one configuration must share: the content hash of every committed stage dataset of every
    step (metrics rows without their timings), the train and sync records' figures (timings excluded), the kept
    checkpoints and the final weights."""
    manifest = json.loads(_read(run_dir, "manifest.json", fs))
    steps = manifest["steps"]
    hashes = {f"{k}/{stage}": entry["hash"] for k, stages in steps.items()
              for stage, entry in stages.items() if isinstance(entry, dict) and "hash" in entry}
    records = {f"{k}/{stage}": {key: v for key, v in stages[stage]["metrics"].items() if not key.startswith(VOLATILE)}
               | {key: v for key, v in stages[stage].items() if key in ("policy_version",)}
               for k, stages in steps.items() for stage in ("train", "sync")}
    kept = sorted(int(k) for k, stages in steps.items() if (stages.get("checkpoint") or {}).get("kept"))
    return hashes | records | {"checkpoints": kept,
                               "weights": hashlib.sha256(_read(run_dir, "model/model.safetensors", fs)).hexdigest()}


def head_workers(head: RayHead, pattern: str) -> list[tuple[int, str]]:
    """(pid, title) of the processes below the head's `ray start` whose title matches `pattern` (Ray puts its
    worker processes in sessions of their own, so the process tree is the way to tell them from other Rays')."""
    table = [line.split(None, 2) for line in subprocess.run(["ps", "-e", "-o", "pid=,ppid=,args="],
                                                            capture_output=True, text=True).stdout.splitlines()]
    children: dict[int, list[int]] = {}
    titles = {}
    for pid, ppid, *args in (row for row in table if len(row) >= 2):
        children.setdefault(int(ppid), []).append(int(pid))
        titles[int(pid)] = args[0] if args else ""
    found, todo = [], [head.proc.pid]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            if re.search(pattern, titles[child]):
                found.append((child, titles[child]))
    return found


def kill_worker(head: RayHead, role_class: str) -> None:
    """SIGKILL the head's Ray worker process running `role_class` (e.g. "ActorWorker")."""
    found = head_workers(head, rf"^ray::{role_class}")
    assert found, f"no {role_class} process found"
    for pid, _ in found:
        os.kill(pid, signal.SIGKILL)


def assert_no_run_actors(head: RayHead) -> None:
    """No worker process of a run is alive in the head's process group (runs kill their actors when they end)."""
    alive = head_workers(head, r"^ray::(ActorWorker|RolloutWorker|RefWorker|CriticWorker)")
    assert not alive, f"actors left behind: {alive}"
