"""Runs survive faults with nothing lost and nothing repeated: one run's driver SIGKILLed at each point of a step's
contract in turn and resumed each time, a second run on a held directory refused (local and S3), a failing reward
function fixed and killed workers recreated by resuming, a new run from a checkpoint, an edited config refused. All
against a Ray head of its own, so the workers outlive the driver as they do on a cluster."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

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


@pytest.fixture(scope="module")
def module_head(tmp_path_factory, tiny_model, s3, prefect_server):
    """One Ray head for the module's runs (its actors outlive a killed driver, as on a cluster), every `hybrid
    train` on the session's Prefect server."""
    ray_head = RayHead(tmp_path_factory.mktemp("prefect-home"), s3.url, api_url=prefect_server)
    yield ray_head
    ray_head.stop()


@pytest.fixture
def head(module_head):
    """The module's head; a run's actors must be gone when its test ends (runs kill their actors)."""
    yield module_head
    assert_no_run_actors(module_head)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, module_head):
    root = tmp_path_factory.mktemp("store")
    proc = module_head.train(*MICRO, "--store.root", str(root), "--run_id", "straight", log=root / "straight.log")
    assert proc.wait(timeout=900) == 0, (root / "straight.log").read_text()[-3000:]
    assert_no_run_actors(module_head)
    return root / "straight"


def kill_driver(proc: subprocess.Popen) -> None:
    """SIGKILL `hybrid train` (the process alone, as the kernel's OOM killer would)."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def assert_succeeds(proc: subprocess.Popen, log) -> None:
    assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]


def assert_refused_by_the_holder(rival: subprocess.Popen, log, holder_pid: int) -> None:
    """A second `hybrid train` on a held run directory exits 2 naming the live run's pid, without a traceback."""
    assert rival.wait(timeout=300) == 2, log.read_text()[-3000:]
    text = log.read_text()
    assert f"is in use by another run: pid {holder_pid} on host" in text, text[-3000:]
    assert "Traceback" not in text.split("hybrid train stopped:")[-1]


def commit_counts(run_dir, fs=None) -> dict[tuple[int, str], int]:
    """How often each (step, dataset stage) was committed over all the drivers of a run."""
    counts: dict[tuple[int, str], int] = {}
    for e in events(run_dir, fs):
        if e["event"] == "commit" and e["stage"] in DATASETS:
            counts[(e["step"], e["stage"])] = counts.get((e["step"], e["stage"]), 0) + 1
    return counts


def assert_each_dataset_committed_once(run_dir, fs=None) -> None:
    assert commit_counts(run_dir, fs) == {(k, s): 1 for k in range(1, 8) for s in DATASETS}


# (step, stage, event the test waits for) at which a driver is SIGKILLed, one after the other in one run whose
# workers live on (the head's actors outlive drivers); HYBRID_FAULTS keeps a worker at the point while the kill lands
KILL_POINTS = {
    "between-sync-commit-and-metrics-commit": (2, "sync", "fault"),
    "between-a-stage-write-and-its-commit": (3, "rollout", "fault"),
    "between-metrics-commit-and-checkpoint": (4, "metrics", "fault"),
    "after-a-stage-start": (5, "train", "start"),
}
KILL_FAULTS = "sleep4:2:sync:committed,sleep4:3:rollout:written,sleep4:4:metrics:committed"
# holds step 1's rollout until the test writes the release file, so a second run of the id meets a live holder
HOLD_STEP_1 = "hold:1:rollout:start"


def test_a_driver_killed_at_each_point_of_a_step_resumes_to_the_uninterrupted_run(head, uninterrupted, tmp_path):
    """One run, its driver SIGKILLed at each point of the step contract in turn and resumed each time (a second
    run of its id refused while it holds the directory): the end state is the uninterrupted run's, nothing
    committed is generated twice, every due checkpoint is taken. Checkpoint rotation (2 kept) is not data."""
    run_dir = tmp_path / "killed"
    flags = [*MICRO, "--store.root", str(tmp_path), "--run_id", "killed", "--ckpt.max_num", "2"]
    proc = head.train(*flags, log=tmp_path / "driver-0.log", faults=f"{HOLD_STEP_1},{KILL_FAULTS}",
                      release=tmp_path / "go")
    wait_for_event(run_dir, 1, "rollout", "fault", proc)
    rival = head.train(*flags, log=tmp_path / "rival.log")
    assert_refused_by_the_holder(rival, tmp_path / "rival.log", proc.pid)
    (tmp_path / "go").touch()
    leftover = run_dir / "steps" / "6" / "reward.tmp-deadbeef"  # a writer that died before its rename
    for n, (step, stage, event) in enumerate(KILL_POINTS.values(), start=1):
        wait_for_event(run_dir, step, stage, event, proc)
        kill_driver(proc)
        leftover.mkdir(parents=True, exist_ok=True)
        proc = head.train("--resume", str(run_dir), log=tmp_path / f"driver-{n}.log")
    assert_succeeds(proc, tmp_path / f"driver-{len(KILL_POINTS)}.log")
    for n in range(1, len(KILL_POINTS) + 1):  # every resume continued with the live workers
        assert "is_attached=True" in (tmp_path / f"driver-{n}.log").read_text(), n
    straight, resumed = fingerprint(uninterrupted), fingerprint(run_dir)
    assert (straight.pop("checkpoints"), resumed.pop("checkpoints")) == ([2, 4, 6], [4, 6])
    # every dataset, metrics row (timings aside), train and sync record and the final weights
    assert len(straight) == 7 * 6 + 1 and resumed == straight
    steps = json.loads((run_dir / "manifest.json").read_text())["steps"]
    assert [(k, steps[str(k)]["checkpoint"]["kept"]) for k in (2, 4, 6)] == [(2, False), (4, True), (6, True)]
    assert sorted(p.name for p in (run_dir / "ckpt" / "_actor").glob("global_step*")) == \
        ["global_step4", "global_step6"]
    assert_each_dataset_committed_once(run_dir)
    starts = [(e["step"], e["stage"]) for e in events(run_dir) if e["event"] == "start"]
    assert starts.count((1, "rollout")) == 1  # the refused run generated nothing
    assert [e["step"] for e in events(run_dir) if e["event"] == "replay" and e["stage"] == "rollout"] == [2, 3, 4, 5]
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


def flaky_reward(tmp_path):
    """The demo's reward function, raising for one label (step 3 of the micro run has it); `fix()` restores it."""
    reward = tmp_path / "flaky_reward.py"
    good = (REPO_ROOT / "data" / "letters_reward.py").read_text()
    reward.write_text(good + "\n_ok = reward_func\n\ndef reward_func(queries, prompts, labels, **kw):\n"
                      "    if any('aeiouy' == y for y in labels):\n        raise KeyError('no grader for aeiouy')\n"
                      "    return _ok(queries, prompts, labels)\n")
    return reward, lambda: reward.write_text(good)


def assert_fails_naming_the_dead_worker(proc: subprocess.Popen, log, role_class: str, step: int, stage: str):
    assert proc.wait(timeout=600) != 0
    role = role_class.removesuffix("Worker").lower()
    assert f"{role} rank 0 (faulty/{role}/0) in {stage} of step {step}: the actor died" in log.read_text()


def test_a_failing_reward_function_and_killed_workers_are_fixed_by_resuming(head, uninterrupted, tmp_path):
    """One run meets three faults in turn, each ending its driver, each fixed by `--resume`: a reward function
    that raises (failed at once: a retry cannot help), then the actor's and the rollout engine's worker processes
    SIGKILLed (recreated on resume from the checkpoint and the committed data). The end state is the
    uninterrupted run's and nothing committed was generated again."""
    run_dir = tmp_path / "faulty"
    reward, fix = flaky_reward(tmp_path)
    failed = head.train(*MICRO, "--store.root", str(tmp_path), "--run_id", "faulty", "--reward.remote_url",
                        str(reward), "--train.retry_delay_s", "30", log=tmp_path / "flaky.log")
    assert failed.wait(timeout=900) != 0
    text = (tmp_path / "flaky.log").read_text()
    assert "KeyError" in text and "no grader for aeiouy" in text and "(prompt_index, sample_index)" in text
    assert "Retry 1/2" not in text  # it fails again on the sample alone: a retry cannot help
    assert [e["step"] for e in events(run_dir) if e["event"] == "commit" and e["stage"] == "advantage"] == [1, 2]
    fix()
    for n, (role_class, step, stage) in enumerate([("ActorWorker", 4, "train"), ("RolloutWorker", 5, "rollout")]):
        # the worker holds at the stage's start (its release file never comes) until it is killed: a micro train
        # stage ends in ~80 ms, sooner than a kill aimed at its start event can land on a loaded machine
        resumed = head.train("--resume", str(run_dir), "--train.retry_delay_s", "1", log=tmp_path / f"{n}.log",
                             faults=f"hold:{step}:{stage}:start", release=tmp_path / "never")
        wait_for_event(run_dir, step, stage, "fault", resumed)
        kill_worker(head, role_class)
        assert_fails_naming_the_dead_worker(resumed, tmp_path / f"{n}.log", role_class, step, stage)
    resumed = head.train("--resume", str(run_dir), log=tmp_path / "fixed.log")
    assert_succeeds(resumed, tmp_path / "fixed.log")
    assert fingerprint(run_dir) == fingerprint(uninterrupted)
    assert_each_dataset_committed_once(run_dir)


def test_on_s3_a_second_run_is_refused_and_a_killed_driver_resumes(head, uninterrupted, s3, tmp_path):
    fs, run_dir = s3.filesystem(), "s3://runs-bucket/fault/s3-killed"
    flags = [*MICRO, "--store.root", "s3://runs-bucket/fault", "--run_id", "s3-killed"]
    proc = head.train(*flags, log=tmp_path / "s3.log", faults="hold:2:rollout:start,sleep16:4:train:start",
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
    # killed during step 4's train, which its live actor finished ~10 s after the resume began (sleep16): the resume
    # waited for it, read the manifest with step 4's train in it, kept the workers and synced them
    assert "is_attached=True" in (tmp_path / "s3-resumed.log").read_text()
    assert not fs.exists("runs-bucket/fault/s3-killed/_lease.json")  # released when the run ended


def test_load_enable_starts_a_new_run_from_the_newest_checkpoint(head, uninterrupted, tmp_path):
    """A new run with --ckpt.load_enable from the straight run's checkpoints (newest: step 6) makes the straight
    run's step 7: the same datasets, records and final weights."""
    loaded = head.train(*MICRO, "--store.root", str(tmp_path), "--run_id", "loaded", "--ckpt.load_enable",
                        "--ckpt.path", str(uninterrupted / "ckpt"), log=tmp_path / "loaded.log")
    assert_succeeds(loaded, tmp_path / "loaded.log")
    straight, new = fingerprint(uninterrupted), fingerprint(tmp_path / "loaded")
    assert {k for k in new if k not in ("weights", "checkpoints")} == \
        {f"7/{s}" for s in ("rollout", "reward", "advantage", "metrics", "train", "sync")}
    assert {k: new[k] for k in new if k != "checkpoints"} == {k: straight[k] for k in new if k != "checkpoints"}
    assert ("checkpoint", "restore") in {(e["stage"], e["event"]) for e in events(tmp_path / "loaded")}
