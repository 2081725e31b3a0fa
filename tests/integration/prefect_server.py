"""A real Prefect server on a free loopback port with its own SQLite database, a process work pool and a worker,
for tests that drive the product the way CI does (`prefect deploy`, `prefect deployment run ... --watch`)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.conftest import REPO_ROOT

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrefectServer:
    def __init__(self, home: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.env = os.environ | {
            "PREFECT_HOME": str(home), "PREFECT_API_URL": self.url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_API_DATABASE_CONNECTION_URL":
                f"sqlite+aiosqlite:///{home}/prefect.db", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        self.env.pop("RAY_ADDRESS", None)
        self.procs: list[subprocess.Popen] = []
        self.logs = home

    def start(self) -> "PrefectServer":
        self._spawn("server", [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port",
                               str(self.port)])
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=2)
                return self
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"Prefect server did not become healthy: {(self.logs / 'server.log').read_text()[-2000:]}")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.logs / f"{name}.log", "w")
        self.procs.append(subprocess.Popen(argv, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "prefect"), *args], cwd=REPO_ROOT, env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """`python <args>` with the server's environment (e.g. `-m flows.cli deploy`)."""
        return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def start_worker(self, pool: str) -> None:
        self._spawn(f"worker-{pool}", [str(BIN / "prefect"), "worker", "start", "--pool", pool, "--type", "process"])

    def stop(self) -> None:
        """Workers first, all at once (SIGTERM, then SIGKILL for any still up after 15 s), then the server: a
        worker outliving its server hangs."""
        server, workers = self.procs[0], self.procs[1:]
        _terminate(workers)
        _terminate([server])


def _terminate(procs: list[subprocess.Popen], grace_s: float = 15) -> None:
    """SIGTERM every process group in `procs` together, wait up to `grace_s` for all, SIGKILL those still up."""
    for proc in procs:
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
