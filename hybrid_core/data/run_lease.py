"""One run per run directory: the lease a run holds on `<run dir>/_lease.json` for as long as it lives.

On a local store the lease is an exclusive `flock` on that file, which the kernel releases when the holder ends,
however it ends; the holder (host, pid) is written into it for the refusal message. On an object store it is an
object created by a conditional PUT (If-None-Match) and renewed by a heartbeat thread with If-Match; another run
takes it over once its heartbeat is older than `STALE_AFTER_S`, or at once when the holder ran on this host and its
process is gone. It knows nothing about what a run does.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid

import fsspec

from hybrid_core.types import PermanentError

log = logging.getLogger(__name__)
LEASE = "_lease.json"
HEARTBEAT_S = 15.0
STALE_AFTER_S = 120.0


class RunLockedError(PermanentError):
    """Another live run holds the run directory."""


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a reused pid from the original), if readable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _holder_is_gone(holder: dict) -> bool:
    """True when the holder ran on this host and its process no longer exists."""
    if holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, ValueError, TypeError):
        return False
    return _process_start(int(holder["pid"])) not in (None, holder.get("process_start"))


def _refusal(run_dir: str, holder: dict) -> RunLockedError:
    age = time.time() - float(holder.get("heartbeat", holder.get("since", time.time())))
    return RunLockedError(
        f"run directory {run_dir} is in use by another run: pid {holder.get('pid')} on host {holder.get('host')!r} "
        f"(run {holder.get('run_id')!r}, last heartbeat {age:.0f}s ago); wait for it to end, stop it, or choose "
        f"another --run_id. A lease whose run is gone is taken over: at once on this host, after "
        f"{STALE_AFTER_S:.0f}s without heartbeat elsewhere")


class RunLease:
    """Held from `acquire` to `release` (also a context manager). `check()` raises once the lease was lost."""

    def __init__(self, run_dir: str, run_id: str, storage_options: dict | None = None):
        self.run_dir, self.run_id = run_dir.rstrip("/"), run_id
        options = dict(storage_options or {})
        if self.run_dir.startswith(("s3://", "s3a://")):  # another run's lease must never be served from a cache
            options |= {"use_listings_cache": False, "skip_instance_cache": True}
        self.fs, root = fsspec.core.url_to_fs(self.run_dir, **options)
        self.path = f"{root}/{LEASE}"
        self.is_local = "file" in self.fs.protocol
        self.holder = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
                       "process_start": _process_start(os.getpid()), "token": uuid.uuid4().hex, "since": time.time()}
        self._file = None
        self._etag: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None

    def __enter__(self) -> RunLease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def _body(self) -> bytes:
        return json.dumps(self.holder | {"heartbeat": time.time()}, sort_keys=True).encode()

    def acquire(self) -> RunLease:
        if self.is_local:
            self._acquire_file()
        else:
            self._acquire_object()
            self._thread = threading.Thread(target=self._beat, name=f"lease-{self.run_id}", daemon=True)
            self._thread.start()
        return self

    def _acquire_file(self) -> None:
        import fcntl

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        handle = open(self.path, "a+b")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = json.loads(handle.read() or b"{}")
            handle.close()
            raise _refusal(self.run_dir, holder) from None
        handle.truncate(0)
        handle.write(self._body())
        handle.flush()
        self._file = handle

    def _acquire_object(self) -> None:
        try:
            self._etag = self.fs.pipe_file(self.path, self._body(), mode="create")["ETag"]
            return
        except FileExistsError:
            pass
        info = self.fs.info(self.path)
        holder = json.loads(self.fs.cat_file(self.path) or b"{}")
        stale = time.time() - float(holder.get("heartbeat", 0.0)) > STALE_AFTER_S
        if not (stale or _holder_is_gone(holder)):
            raise _refusal(self.run_dir, holder)
        try:  # only one of several runs taking over the same stale lease wins
            self._etag = self._put_if_match(info["ETag"])
        except OSError:
            raise _refusal(self.run_dir, json.loads(self.fs.cat_file(self.path) or b"{}")) from None
        log.warning("took over the lease of %s from pid %s on %s (gone)", self.run_dir, holder.get("pid"),
                    holder.get("host"))

    def _put_if_match(self, etag: str) -> str:
        bucket, key, _ = self.fs.split_path(self.path)
        return self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=self._body(), IfMatch=etag)["ETag"]

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._etag = self._put_if_match(self._etag)
            except OSError as err:  # a precondition failure: another run took the lease over
                self.lost = f"the lease of {self.run_dir} was lost ({err}); another run may have taken it over"
                log.error(self.lost)
                return

    def check(self) -> None:
        if self.lost:
            raise RunLockedError(self.lost)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._file is not None:
            self._file.close()  # closing the descriptor releases the flock
            self._file = None
        elif self._etag is not None and not self.lost:
            self.fs.rm(self.path)
            self._etag = None
