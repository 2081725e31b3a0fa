"""Unit tests for hybrid_core.data.run_lease: one run per run directory, on a local folder (flock) and on `s3://`
served by a real moto server (conditional writes and a heartbeat); a lease whose holder is gone is taken over."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hybrid_core.data import run_lease
from hybrid_core.data.run_lease import LEASE, RunLease, RunLockedError
from hybrid_core.types import PermanentError
from tests.unit.moto_fixtures import moto_url, s3_options  # noqa: F401  (pytest fixtures)

HOLDER_SCRIPT = ("import sys, time\nfrom hybrid_core.data.run_lease import RunLease\n"
                 "lease = RunLease(sys.argv[1], 'held').acquire()\nprint('held', flush=True)\ntime.sleep(600)\n")


@pytest.fixture(params=["local", "s3"])
def lease_dir(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "run1"), {}
    name = request.node.name.replace("[", "-").rstrip("]")
    return f"s3://bucket/leases/{name}/run1", request.getfixturevalue("s3_options")


def _holder(run_dir: str, env: dict) -> subprocess.Popen:
    """Another process that takes the lease and keeps it until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER_SCRIPT, run_dir], stdout=subprocess.PIPE, text=True,
                            env=os.environ | env, cwd=os.getcwd(), start_new_session=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_is_refused_naming_the_live_holder_then_admitted_after_release(lease_dir):
    run_dir, options = lease_dir
    first = RunLease(run_dir, "r1", options).acquire()
    with pytest.raises(RunLockedError, match=rf"run directory .*run1 is in use by another run: pid {os.getpid()} on "
                                             rf"host '{socket.gethostname()}' \(run 'r1', last heartbeat \d+s ago\)"
                                             r"; wait for it to end, stop it, or choose another --run_id") as err:
        RunLease(run_dir, "r1", options).acquire()
    assert isinstance(err.value, PermanentError)
    first.release()
    with RunLease(run_dir, "r1", options) as again:
        again.check()


def test_a_killed_holder_on_this_host_is_taken_over_at_once(lease_dir, moto_url):
    run_dir, options = lease_dir
    env = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_ENDPOINT_URL": moto_url}
    holder = _holder(run_dir, env)
    try:
        with pytest.raises(RunLockedError, match=rf"pid {holder.pid} on host"):
            RunLease(run_dir, "r1", options).acquire()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # as a killed driver ends: no release
        holder.wait(timeout=30)
    started = time.monotonic()
    with RunLease(run_dir, "r1", options):
        assert time.monotonic() - started < 5  # no waiting for the heartbeat to go stale


def _put_lease(options: dict, run_dir: str, **holder) -> None:
    lease = RunLease(run_dir, "r1", options)
    lease.fs.pipe_file(lease.path, json.dumps({"run_id": "r0", "token": "t"} | holder).encode())


def test_on_s3_a_stale_lease_of_another_host_is_taken_over_and_a_fresh_one_is_not(s3_options):
    run_dir = "s3://bucket/leases/other-host/run1"
    _put_lease(s3_options, run_dir, host="gpu-node-7", pid=4242, heartbeat=time.time() - 10)
    with pytest.raises(RunLockedError, match=r"pid 4242 on host 'gpu-node-7' \(run 'r0', last heartbeat \d+s ago\)"):
        RunLease(run_dir, "r1", s3_options).acquire()
    _put_lease(s3_options, run_dir, host="gpu-node-7", pid=4242, heartbeat=time.time() - run_lease.STALE_AFTER_S - 5)
    with RunLease(run_dir, "r1", s3_options) as lease:
        held = json.loads(lease.fs.cat_file(lease.path))
        assert (held["pid"], held["host"], held["run_id"]) == (os.getpid(), socket.gethostname(), "r1")
    assert not lease.fs.exists(lease.path)  # released: the object is gone


def test_on_s3_the_heartbeat_renews_the_lease_and_a_lost_lease_fails_the_check(s3_options, monkeypatch):
    monkeypatch.setattr(run_lease, "HEARTBEAT_S", 0.2)
    lease = RunLease("s3://bucket/leases/beat/run1", "r1", s3_options).acquire()
    try:
        first = json.loads(lease.fs.cat_file(lease.path))["heartbeat"]
        time.sleep(0.8)
        assert json.loads(lease.fs.cat_file(lease.path))["heartbeat"] > first
        lease.check()
        lease.fs.pipe_file(lease.path, b'{"run_id": "thief"}')  # another run took it over
        deadline = time.monotonic() + 5
        while lease.lost is None and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(RunLockedError, match=r"the lease of .*beat/run1 was lost"):
            lease.check()
    finally:
        lease.release()
    assert lease.fs.cat_file(lease.path) == b'{"run_id": "thief"}'  # a lost lease is not deleted by its old holder


def test_the_local_lease_file_keeps_its_name(tmp_path):
    with RunLease(str(tmp_path / "run1"), "r1"):
        assert (tmp_path / "run1" / LEASE).is_file()
