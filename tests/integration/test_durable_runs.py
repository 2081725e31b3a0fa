"""Runs survive faults with nothing lost and nothing repeated: determinism, a driver SIGKILLed at each point of a
step's contract and resumed, a killed worker recreated, a second run on a held directory refused (local and S3), a
failing reward function fixed and resumed, an edited config refused. All against a Ray head of its own, so the
workers outlive the driver as they do on a cluster."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from durable_runs import (MICRO, MotoServer, RayHead, assert_no_run_actors, events, fingerprint, kill_worker,
                          wait_for_event)

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration
DATASETS = ("rollout", "reward", "advantage", "metrics")


@pytest.fixture(scope="module")
def s3():
    server = MotoServer()
    server.filesystem().mkdir("runs-bucket")
    yield server
    server.stop()


@pytest.fixture
def head(tmp_path_factory, tiny_model, s3):
    """Each test its own Ray head and PREFECT_HOME; the run's actors must be gone when the test ends."""
    ray_head = RayHead(tmp_path_factory.mktemp("prefect-home"), s3.url)
    yield ray_head
    try:
        assert_no_run_actors(ray_head)
    finally:
        ray_head.stop()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model, s3):
    root = tmp_path_factory.mktemp("store")
    ray_head = RayHead(tmp_path_factory.mktemp("prefect-home"), s3.url)
    try:
        proc = ray_head.train(*MICRO, "--store.root", str(root), "--run_id", "straight", log=root / "straight.log")
        assert proc.wait(timeout=900) == 0, (root / "straight.log").read_text()[-3000:]
    finally:
        ray_head.stop()
    return root / "straight"


def kill_driver(proc: subprocess.Popen) -> None:
    """SIGKILL `hybrid train`; its embedded Prefect server (a child process) must not outlive it."""
    servers = [pid for pid in _children(proc.pid) if "uvicorn" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert servers, "no embedded Prefect server found under hybrid train"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    deadline = time.time() + 20
    while time.time() < deadline and any(Path(f"/proc/{pid}").exists() for pid in servers):
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in servers), "the embedded Prefect server outlived its run"


def _children(pid: int) -> list[int]:
    table = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    return [int(child) for child, parent in zip(table[::2], table[1::2]) if int(parent) == pid]


def assert_succeeds(proc: subprocess.Popen, log) -> None:
    assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]


# keeps a run alive (its rollout worker waits at step 2 until the test writes the release file) while a second
# `hybrid train` of its run id starts and is refused; the pause changes nothing the run computes
HOLD_STEP_2 = "hold:2:rollout:start"


def assert_refused_by_the_holder(rival: subprocess.Popen, log, holder_pid: int) -> None:
    """A second `hybrid train` on a held run directory exits 2 naming the live run's pid, without a traceback."""
    assert rival.wait(timeout=300) == 2, log.read_text()[-3000:]
    text = log.read_text()
    assert f"is in use by another run: pid {holder_pid} on host" in text, text[-3000:]
    assert "Traceback" not in text.split("hybrid train stopped:")[-1]


def test_same_seed_gives_the_same_bytes_and_a_second_run_of_its_id_is_refused(head, uninterrupted, tmp_path):
    # checkpoint rotation is not part of the data: keep 2 of the 3 checkpoints (steps 2, 4, 6) this time
    flags = [*MICRO, "--store.root", str(tmp_path), "--run_id", "again", "--ckpt.max_num", "2"]
    proc = head.train(*flags, log=tmp_path / "again.log", faults=HOLD_STEP_2, release=tmp_path / "go")
    wait_for_event(tmp_path / "again", 2, "rollout", "fault", proc)
    rival = head.train(*flags, log=tmp_path / "rival.log")
    assert_refused_by_the_holder(rival, tmp_path / "rival.log", proc.pid)
    (tmp_path / "go").touch()
    assert_succeeds(proc, tmp_path / "again.log")
    first, second = fingerprint(uninterrupted), fingerprint(tmp_path / "again")
    assert (first.pop("checkpoints"), second.pop("checkpoints")) == ([2, 4, 6], [4, 6])
    assert len(first) == 6 * 6 + 1 and first == second
    assert sorted(p.name for p in (tmp_path / "again" / "ckpt" / "_actor").glob("global_step*")) == \
        ["global_step4", "global_step6"]
    assert sorted(p.name for p in (uninterrupted / "ckpt" / "_actor").glob("global_step*")) == \
        ["global_step2", "global_step4", "global_step6"]
    assert [e["step"] for e in events(tmp_path / "again") if e["event"] == "start" and e["stage"] == "rollout"] == \
        [1, 2, 3, 4, 5, 6]  # the refused run generated nothing


# (step, stage, event the test waits for, HYBRID_FAULTS holding the worker there while the driver is killed)
KILL_POINTS = {
    "after-a-stage-start": (4, "train", "start", ""),
    "between-a-stage-write-and-its-commit": (5, "rollout", "fault", "sleep4:5:rollout:written"),
    "between-sync-commit-and-metrics-commit": (4, "sync", "fault", "sleep4:4:sync:committed"),
    "between-metrics-commit-and-checkpoint": (4, "metrics", "fault", "sleep4:4:metrics:committed"),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_driver_killed_at_any_point_of_a_step_resumes_to_the_uninterrupted_run(point, head, uninterrupted,
                                                                                tmp_path):
    step, stage, event, faults = KILL_POINTS[point]
    run_dir = tmp_path / "killed"
    proc = head.train(*MICRO, "--store.root", str(tmp_path), "--run_id", "killed", log=tmp_path / "killed.log",
                      faults=faults)
    wait_for_event(run_dir, step, stage, event, proc)
    kill_driver(proc)
    leftover = run_dir / "steps" / "5" / "reward.tmp-deadbeef"  # a writer that died before its rename
    leftover.mkdir(parents=True)
    resumed = head.train("--resume", str(run_dir), log=tmp_path / "resumed.log")
    assert_succeeds(resumed, tmp_path / "resumed.log")
    # every dataset, metrics row (timings aside), train and sync record, kept checkpoint and the final weights
    assert fingerprint(run_dir) == fingerprint(uninterrupted)
    assert sorted(p.name for p in (run_dir / "ckpt" / "_actor").glob("global_step*")) == \
        ["global_step2", "global_step4", "global_step6"]
    starts = [(e["step"], e["stage"]) for e in events(run_dir) if e["event"] == "start"]
    for k in range(1, 7):  # nothing committed was generated again
        assert [starts.count((k, s)) for s in DATASETS] == [1, 1, 1, 1], (k, starts)
    assert not leftover.exists()


def test_resume_refuses_an_edited_configuration(uninterrupted):
    config = uninterrupted / "config.yaml"
    original = config.read_text()
    try:
        config.write_text(original.replace("batch_size: 2\n", "batch_size: 3\n", 1))
        proc = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--resume", str(uninterrupted)],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2
        assert "rollout.batch_size: saved 2, now 3" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        config.write_text(original)


def test_a_failing_reward_function_fails_at_once_then_is_fixed_and_resumed(head, uninterrupted, tmp_path):
    reward = tmp_path / "flaky_reward.py"
    good = (REPO_ROOT / "data" / "letters_reward.py").read_text()
    reward.write_text(good + "\n_ok = reward_func\n\ndef reward_func(queries, prompts, labels, **kw):\n"
                      "    if any('aeiouy' == y for y in labels):\n        raise KeyError('no grader for aeiouy')\n"
                      "    return _ok(queries, prompts, labels)\n")
    flags = [*MICRO, "--store.root", str(tmp_path), "--run_id", "flaky", "--reward.remote_url", str(reward),
             "--train.retry_delay_s", "30"]
    failed = head.train(*flags, log=tmp_path / "flaky.log")
    assert failed.wait(timeout=900) != 0
    text = (tmp_path / "flaky.log").read_text()
    assert "KeyError" in text and "no grader for aeiouy" in text and "(prompt_index, sample_index)" in text
    assert "Retry 1/2" not in text  # it fails again on the sample alone: a retry cannot help
    committed_before = [e for e in events(tmp_path / "flaky") if e["event"] == "commit"]
    reward.write_text(good)
    resumed = head.train("--resume", str(tmp_path / "flaky"), log=tmp_path / "flaky-resumed.log")
    assert_succeeds(resumed, tmp_path / "flaky-resumed.log")
    starts = [(e["step"], e["stage"]) for e in events(tmp_path / "flaky") if e["event"] == "start"]
    for c in committed_before:  # nothing committed before the failure was generated again
        if c["stage"] in ("rollout", "reward", "advantage"):
            assert starts.count((c["step"], c["stage"])) == 1, c


@pytest.mark.parametrize("role_class, step, stage", [("ActorWorker", 4, "train"), ("RolloutWorker", 3, "rollout")])
def test_a_killed_worker_is_recreated_on_resume(role_class, step, stage, head, uninterrupted, tmp_path):
    run_dir = tmp_path / "worker-killed"
    proc = head.train(*MICRO, "--store.root", str(tmp_path), "--run_id", "worker-killed",
                      "--train.retry_delay_s", "1", log=tmp_path / "run.log")
    wait_for_event(run_dir, step, stage, "start", proc)
    kill_worker(head, role_class)
    assert proc.wait(timeout=600) != 0
    role = role_class.removesuffix("Worker").lower()
    assert f"{role} rank 0 (worker-killed/{role}/0) in {stage} of step {step}: the actor died" in \
        (tmp_path / "run.log").read_text()
    resumed = head.train("--resume", str(run_dir), log=tmp_path / "resumed.log")
    assert_succeeds(resumed, tmp_path / "resumed.log")
    assert fingerprint(run_dir) == fingerprint(uninterrupted)


def test_on_s3_a_second_run_is_refused_and_a_killed_driver_resumes(head, uninterrupted, s3, tmp_path):
    fs, run_dir = s3.filesystem(), "s3://runs-bucket/fault/s3-killed"
    flags = [*MICRO, "--store.root", "s3://runs-bucket/fault", "--run_id", "s3-killed"]
    proc = head.train(*flags, log=tmp_path / "s3.log", faults=f"{HOLD_STEP_2},sleep8:4:train:start",
                      release=tmp_path / "go")
    wait_for_event(run_dir, 2, "rollout", "fault", proc, fs=fs)
    rival = head.train(*flags, log=tmp_path / "rival.log")
    assert_refused_by_the_holder(rival, tmp_path / "rival.log", proc.pid)
    (tmp_path / "go").touch()
    wait_for_event(run_dir, 4, "train", "fault", proc, fs=fs)
    kill_driver(proc)
    # the lease object stays behind; its holder was on this host and is gone, so the resume takes it over at once
    assert fs.exists("runs-bucket/fault/s3-killed/_lease.json")
    resumed = head.train("--resume", run_dir, log=tmp_path / "s3-resumed.log")
    assert_succeeds(resumed, tmp_path / "s3-resumed.log")
    assert fingerprint(run_dir, fs) == fingerprint(uninterrupted)
    assert any((e["step"], e["event"]) == (3, "replay") for e in events(run_dir, fs))
    assert not fs.exists("runs-bucket/fault/s3-killed/_lease.json")  # released when the run ended


def test_load_enable_starts_a_new_run_from_the_newest_checkpoint(head, uninterrupted, tmp_path):
    """Extending the straight run to step 7 and a new run with --ckpt.load_enable from its checkpoint (step 6)
    produce the same step 7."""
    import shutil

    extended = tmp_path / "extended"
    shutil.copytree(uninterrupted, extended)
    proc = head.train("--resume", str(extended), "--train.max_steps", "7", log=tmp_path / "extended.log")
    assert_succeeds(proc, tmp_path / "extended.log")
    loaded = head.train(*MICRO, "--train.max_steps", "7", "--store.root", str(tmp_path), "--run_id", "loaded",
                        "--ckpt.load_enable", "--ckpt.path", str(uninterrupted / "ckpt"), log=tmp_path / "loaded.log")
    assert_succeeds(loaded, tmp_path / "loaded.log")
    ext, new = fingerprint(extended), fingerprint(tmp_path / "loaded")
    assert {k for k in new if k not in ("weights", "checkpoints")} == \
        {f"7/{s}" for s in ("rollout", "reward", "advantage", "metrics", "train", "sync")}
    assert {k: new[k] for k in new if k != "checkpoints"} == {k: ext[k] for k in new if k != "checkpoints"}
    assert ("checkpoint", "restore") in {(e["stage"], e["event"]) for e in events(tmp_path / "loaded")}
