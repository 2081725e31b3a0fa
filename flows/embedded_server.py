"""Prefect's embedded API server for `hybrid train`, tied to the life of the process that started it.

Prefect starts its temporary server as a child process and stops it at a normal exit, but a parent killed with
SIGKILL leaves it running, orphaned, for as long as the machine lives. Here `hybrid train` starts that same server up
front (Prefect's own `SubprocessASGIServer`) and a small watchdog process stops it as soon as `hybrid train` is
gone, however it ended. With PREFECT_API_URL set (a real server) nothing is started.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5
STOP_GRACE_S = 10.0
STARTUP_TIMEOUT_S = 120  # Prefect's default (20 s) was too short on a busy 2-core machine


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def embedded_api():
    """Point this process's Prefect client at a temporary server for the duration (unless PREFECT_API_URL is set),
    with a watchdog that stops the server if this process dies without stopping it."""
    if os.environ.get("PREFECT_API_URL"):
        yield None
        return
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = SubprocessASGIServer()
    server.start(timeout=STARTUP_TIMEOUT_S)
    subprocess.Popen([sys.executable, "-m", "flows.embedded_server", str(os.getpid()), str(server.server_process.pid)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            yield server.api_url
    finally:
        server.stop()


def watch(parent_pid: int, server_pid: int) -> None:
    """Wait for the parent to end; then stop the server if it still runs (SIGTERM, then SIGKILL)."""
    while _alive(parent_pid) and _alive(server_pid):
        time.sleep(POLL_S)
    if not _alive(server_pid):
        return
    os.kill(server_pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if _alive(server_pid):
        os.kill(server_pid, signal.SIGKILL)


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
