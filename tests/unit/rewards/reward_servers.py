"""Real reward servers on loopback for the tests: `hybrid serve-reward` as a subprocess, the same ASGI app on uvicorn
in a thread of the test process, and a raw http.server whose answers a test scripts (non-JSON, 500s, a server that
dies after some requests)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

from tests.conftest import REPO_ROOT

LETTERS_REWARD = REPO_ROOT / "data" / "letters_reward.py"


def dead_url() -> str:
    """A loopback URL nobody listens on (a port just bound and closed): connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/get_reward"


class AppInThread:
    """The `hybrid serve-reward` app for `reward_file` on uvicorn, in a thread of this process."""

    def __init__(self, reward_file: str | Path, path: str = "/get_reward", max_body_mib: float = 16.0):
        from hybrid_core.rewards.reward_server import ServeOptions, bind, file_app, served_url, uvicorn_server

        sock = bind("127.0.0.1", 0)
        self.url = served_url(sock, path)
        self.server = uvicorn_server(file_app(str(reward_file), ServeOptions(path=path, max_body_mib=max_body_mib)))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


class ScriptedServer:
    """http.server on loopback; `respond(payload, n)` (n: the request's number, from 1) returns (status, body bytes),
    or None to drop the connection without an answer (a server that died). Counts the requests. `port` 0: a free
    port."""

    def __init__(self, respond: Callable[[dict, int], tuple[int, bytes] | None], port: int = 0):
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with server.lock:
                    server.requests.append(payload)
                    n = len(server.requests)
                answer = respond(payload, n)
                if answer is None:
                    self.close_connection = True
                    return
                status, body = answer
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/get_reward"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def answer_with(reward_func: Callable) -> Callable[[dict, int], tuple[int, bytes]]:
    """A ScriptedServer answer computed by `reward_func`, as `hybrid serve-reward` would send it."""
    from hybrid_core.rewards.reward_server import jsonable

    def respond(payload: dict, n: int) -> tuple[int, bytes]:
        out = reward_func(payload["query"], payload["prompts"], payload["labels"])
        return 200, json.dumps(jsonable(out)).encode()

    return respond


def start_serve_reward(reward_file: str | Path, *options: str, timeout_s: float = 60) -> tuple[subprocess.Popen, str]:
    """`hybrid serve-reward --reward-func FILE --port 0 [options]` as a subprocess; returns (process, the URL it
    printed)."""
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve-reward", "--reward-func", str(reward_file),
                             "--port", "0", *options], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def drain():
        for line in proc.stdout:  # the first line is the URL (or the refusal); the rest is drained
            lines.append(line)

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not lines and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not lines or "serving" not in lines[0]:
        stop(proc)
        raise AssertionError(f"hybrid serve-reward did not start within {timeout_s} s: {''.join(lines)}")
    return proc, lines[0].split(" on ", 1)[1].split()[0]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
