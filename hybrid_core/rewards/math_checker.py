"""The sympy comparison of two normalised answers, run in a child process so that a per-sample time limit holds.

sympy can run for hours on adversarial input (9^{9^{9^{9}}}), and math-verify's own timeout is signal.alarm, which
works only in the main thread. So the comparison runs in one child process: the caller waits on a pipe for at most
`timeout_s`, and on a timeout kills the child and starts a fresh one. No signals, so it works from any thread (a Ray
actor's, a thread pool's). The child is a plain `python -c` subprocess rather than a multiprocessing one, which
would re-import the caller's `__main__`. Knows nothing of responses or the text rules: `math.py` does those.
"""
from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

CHILD_MEMORY_BYTES = 4 * 2**30  # address space: 10^{10^{10}} would take 4 GB before the time limit hits
STARTUP_TIMEOUT_S = 120.0  # importing sympy and math-verify in a fresh process; only a broken install takes longer
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # where `hybrid_core` imports from, for the child


@dataclass(kw_only=True)
class _Child:
    process: subprocess.Popen
    requests: Connection
    replies: Connection
    owner_pid: int
    is_ready: bool = False

    def wait_ready(self) -> None:
        if self.is_ready:
            return
        try:
            is_ready = self.replies.poll(STARTUP_TIMEOUT_S) and self.replies.recv_bytes() == b"ready"
        except EOFError:  # it exited while starting: its traceback is on stderr
            is_ready = False
        if not is_ready:
            raise RuntimeError(f"math checker child did not start within {STARTUP_TIMEOUT_S} s; check that "
                               f"sympy and math-verify import in this environment: {sys.executable} -c "
                               f"'import hybrid_core.rewards.math_symbolic'")
        self.is_ready = True

    def is_usable(self) -> bool:
        return self.owner_pid == os.getpid() and self.process.poll() is None

    def stop(self) -> None:
        if self.owner_pid == os.getpid():  # a forked copy of the parent does not own its parent's child
            self.process.kill()
            self.process.wait()
            self.requests.close()
            self.replies.close()


def _spawn() -> _Child:
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    code = (f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); from hybrid_core.rewards.math_checker import "
            f"serve; serve({request_read}, {reply_write})")
    process = subprocess.Popen([sys.executable, "-c", code], pass_fds=(request_read, reply_write),
                               stdin=subprocess.DEVNULL)
    os.close(request_read)
    os.close(reply_write)
    return _Child(process=process, requests=Connection(request_write, readable=False),
                  replies=Connection(reply_read, writable=False), owner_pid=os.getpid())


class SymbolicChecker:
    """Owns the child process that answers `is this answer equal to this label?` with sympy and math-verify.

    Thread-safe (one question at a time). The child starts on first use; the time to start it is not charged to
    any sample's limit. After the first timeout a spare child is kept warm, so a timeout costs `timeout_s` and
    not also a restart (importing sympy and math-verify takes about a second).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: _Child | None = None
        self._spare: _Child | None = None
        self.num_timeouts = 0
        self.num_starts = 0
        atexit.register(self.close)

    def is_equal(self, answer: str, label: str, timeout_s: float) -> bool | None:
        """True/False, or None when the comparison ran past `timeout_s` or the child died (it is then replaced)."""
        with self._lock:
            child = self._ready_child()
            child.requests.send_bytes(json.dumps([answer, label]).encode())
            if child.replies.poll(timeout_s):
                try:
                    return json.loads(child.replies.recv_bytes())
                except EOFError:
                    pass  # the child died (killed from outside, out of memory): no verdict, as for a timeout
            self.num_timeouts += 1
            child.stop()
            self._child = self._spare
            self._spare = None
            return None

    def close(self) -> None:
        with self._lock:
            for child in (self._child, self._spare):
                if child is not None:
                    child.stop()
            self._child = None
            self._spare = None

    def _ready_child(self) -> _Child:
        if self._child is None or not self._child.is_usable():
            if self._child is not None:
                self._child.stop()
            self._child = self._new_child()
        try:
            self._child.wait_ready()
        except RuntimeError:
            self._child.stop()
            self._child = None
            raise
        if self.num_timeouts and self._spare is None:
            self._spare = self._new_child()  # started once this one is ready, so the two never import at once
        return self._child

    def _new_child(self) -> _Child:
        self.num_starts += 1
        return _spawn()


def serve(request_fd: int, reply_fd: int) -> None:
    """The child's loop: one [answer, label] in, one bool out, until the parent closes its end."""
    import resource

    from hybrid_core.rewards.math_symbolic import symbolic_equal, warm_up

    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))
    requests = Connection(request_fd, writable=False)
    replies = Connection(reply_fd, readable=False)
    warm_up()
    replies.send_bytes(b"ready")
    while True:
        try:
            answer, label = json.loads(requests.recv_bytes())
        except EOFError:
            return
        try:
            verdict = symbolic_equal(answer, label)
        except Exception:  # MemoryError, RecursionError, a library bug on odd input: the answer is not shown equal
            verdict = False
        replies.send_bytes(json.dumps(verdict).encode())
