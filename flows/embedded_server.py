"""Prefect's embedded API server for `hybrid train`, tied to the life of the process that started it.

Prefect starts its temporary server as a child process and stops it at a normal exit, but a parent killed with
SIGKILL leaves it running, orphaned, for as long as the machine lives. Here `hybrid train` starts a small watchdog
process first, then that same server (Prefect's own `SubprocessASGIServer`) with a marker in its environment; as
soon as `hybrid train` is gone, however it ended (during the server's start-up included), the watchdog stops every
Prefect server process carrying the marker. With PREFECT_API_URL set (a real server) nothing is started.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid

import psutil

POLL_S = 0.5
STOP_GRACE_S = 10.0
DRAIN_TIMEOUT_S = 30.0  # sending what is queued takes well under a second
STARTUP_TIMEOUT_S = 120  # Prefect's default (20 s) was too short on a busy 2-core machine
MARKER_ENV = "HYBRID_EMBEDDED_SERVER"  # set in the server process's environment only: which watchdog owns it
SERVER_APP = "prefect.server.api.server:create_app"


@contextlib.contextmanager
def embedded_api():
    """Point this process's Prefect client at a temporary server for the duration (unless PREFECT_API_URL is set),
    with a watchdog that stops the server if this process dies without stopping it."""
    if os.environ.get("PREFECT_API_URL"):
        yield None
        return
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    marker = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    subprocess.Popen([sys.executable, "-m", "flows.embedded_server", str(os.getpid()), marker],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    server = SubprocessASGIServer()
    os.environ[MARKER_ENV] = marker  # inherited by the server process (and its restarts) only
    try:
        server.start(timeout=STARTUP_TIMEOUT_S)
    finally:
        os.environ.pop(MARKER_ENV, None)
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            try:
                yield server.api_url
            finally:  # a failed run's logs too
                _send_queued_logs_and_events()
    finally:
        server.stop()


def _send_queued_logs_and_events() -> None:
    """Send the run's queued logs and events while the server still answers. Prefect sends them at interpreter
    exit, when this server is already gone: that cost ~80 s of retries and "All connection attempts failed"."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        service.drain_all(timeout=DRAIN_TIMEOUT_S)


def _marked_servers(marker: str) -> list:
    """The Prefect server processes whose environment carries `marker`."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if SERVER_APP in (proc.info["cmdline"] or []) and proc.environ().get(MARKER_ENV) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def watch(parent_pid: int, marker: str) -> None:
    """Wait for the parent to end; then stop the servers it started, if they still run (SIGTERM, then SIGKILL)."""
    while psutil.pid_exists(parent_pid):
        time.sleep(POLL_S)
    servers = _marked_servers(marker)
    for server in servers:
        with contextlib.suppress(psutil.NoSuchProcess):
            server.terminate()
    _, alive = psutil.wait_procs(servers, timeout=STOP_GRACE_S)
    for server in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            server.kill()


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
