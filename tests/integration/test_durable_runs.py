"""Runs survive faults with nothing lost and nothing repeated: determinism, a killed driver resumed from the newest
checkpoint with committed steps replayed, a failing reward function fixed and resumed, an edited config refused."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from durable_runs import (MICRO, MotoServer, RayHead, assert_no_run_actors, events, fingerprint, kill_worker,
                          wait_for_event)

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration


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


def test_same_seed_gives_the_same_bytes(head, uninterrupted, tmp_path):
    # checkpoint rotation is not part of the data: keep 2 of the 3 checkpoints (steps 2, 4, 6) this time
    proc = head.train(*MICRO, "--store.root", str(tmp_path), "--run_id", "again", "--ckpt.max_num", "2",
                      log=tmp_path / "again.log")
    assert proc.wait(timeout=900) == 0, (tmp_path / "again.log").read_text()[-3000:]
    first, second = fingerprint(uninterrupted), fingerprint(tmp_path / "again")
    assert len(first) == 6 * 4 + 1 and first == second
    assert sorted(p.name for p in (tmp_path / "again" / "ckpt" / "_actor").glob("global_step*")) == \
        ["global_step4", "global_step6"]
    assert sorted(p.name for p in (uninterrupted / "ckpt" / "_actor").glob("global_step*")) == \
        ["global_step2", "global_step4", "global_step6"]


def test_killed_driver_resumes_from_the_checkpoint_and_replays(head, uninterrupted, tmp_path):
    run_dir = tmp_path / "killed"
    proc = head.train(*MICRO, "--store.root", str(tmp_path), "--run_id", "killed", log=tmp_path / "killed.log")
    wait_for_event(run_dir, 4, "train", "start", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    (run_dir / "steps" / "5").mkdir(parents=True, exist_ok=True)
    (run_dir / "steps" / "5" / "rollout.tmp-deadbeef").mkdir()  # a crash between write and commit
    resumed = head.train("--resume", str(run_dir), log=tmp_path / "resumed.log")
    assert resumed.wait(timeout=900) == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    assert fingerprint(run_dir) == fingerprint(uninterrupted)
    log = events(run_dir)
    for step in (3, 4):
        assert {(e["stage"], e["event"]) for e in log if e["step"] == step} >= {
            ("rollout", "replay"), ("reward", "replay"), ("advantage", "replay")}
        assert sum(1 for e in log if (e["step"], e["stage"], e["event"]) == (step, "rollout", "start")) == 1
    assert not (run_dir / "steps" / "5" / "rollout.tmp-deadbeef").exists()


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


def test_a_failing_reward_function_is_fixed_and_resumed(head, uninterrupted, tmp_path):
    reward = tmp_path / "flaky_reward.py"
    good = (REPO_ROOT / "data" / "letters_reward.py").read_text()
    reward.write_text(good + "\n_ok = reward_func\n\ndef reward_func(queries, prompts, labels, **kw):\n"
                      "    if any('aeiouy' == y for y in labels):\n        raise KeyError('no grader for aeiouy')\n"
                      "    return _ok(queries, prompts, labels)\n")
    flags = [*MICRO, "--store.root", str(tmp_path), "--run_id", "flaky", "--reward.remote_url", str(reward),
             "--train.stage_retries", "0"]
    failed = head.train(*flags, log=tmp_path / "flaky.log")
    assert failed.wait(timeout=900) != 0
    text = (tmp_path / "flaky.log").read_text()
    assert "KeyError" in text and "no grader for aeiouy" in text and "(prompt_index, sample_index)" in text
    committed_before = [e for e in events(tmp_path / "flaky") if e["event"] == "commit"]
    reward.write_text(good)
    resumed = head.train("--resume", str(tmp_path / "flaky"), log=tmp_path / "flaky-resumed.log")
    assert resumed.wait(timeout=900) == 0, (tmp_path / "flaky-resumed.log").read_text()[-3000:]
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
    assert "the actor died" in (tmp_path / "run.log").read_text()
    resumed = head.train("--resume", str(run_dir), log=tmp_path / "resumed.log")
    assert resumed.wait(timeout=900) == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    assert fingerprint(run_dir) == fingerprint(uninterrupted)


def test_killed_driver_resumes_with_the_store_on_s3(head, uninterrupted, s3, tmp_path):
    fs, run_dir = s3.filesystem(), "s3://runs-bucket/fault/s3-killed"
    proc = head.train(*MICRO, "--store.root", "s3://runs-bucket/fault", "--run_id", "s3-killed",
                      log=tmp_path / "s3.log")
    wait_for_event(run_dir, 4, "train", "start", proc, fs=fs)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    resumed = head.train("--resume", run_dir, log=tmp_path / "s3-resumed.log")
    assert resumed.wait(timeout=900) == 0, (tmp_path / "s3-resumed.log").read_text()[-3000:]
    assert fingerprint(run_dir, fs) == fingerprint(uninterrupted)
    assert any((e["step"], e["event"]) == (3, "replay") for e in events(run_dir, fs))


def test_load_enable_starts_a_new_run_from_the_newest_checkpoint(head, uninterrupted, tmp_path):
    """Extending the straight run to step 7 and a new run with --ckpt.load_enable from its checkpoint (step 6)
    produce the same step 7."""
    import shutil

    extended = tmp_path / "extended"
    shutil.copytree(uninterrupted, extended)
    proc = head.train("--resume", str(extended), "--train.max_steps", "7", log=tmp_path / "extended.log")
    assert proc.wait(timeout=900) == 0, (tmp_path / "extended.log").read_text()[-3000:]
    loaded = head.train(*MICRO, "--train.max_steps", "7", "--store.root", str(tmp_path), "--run_id", "loaded",
                        "--ckpt.load_enable", "--ckpt.path", str(uninterrupted / "ckpt"), log=tmp_path / "loaded.log")
    assert loaded.wait(timeout=900) == 0, (tmp_path / "loaded.log").read_text()[-3000:]
    ext, new = fingerprint(extended), fingerprint(tmp_path / "loaded")
    assert {k for k in new if k != "weights"} == {f"7/{s}" for s in ("rollout", "reward", "advantage", "metrics")}
    assert {k: new[k] for k in new} == {k: ext[k] for k in new}
    assert ("checkpoint", "restore") in {(e["stage"], e["event"]) for e in events(tmp_path / "loaded")}


def test_killed_driver_between_steps_reattaches_to_the_live_workers(head, uninterrupted, tmp_path):
    run_dir = tmp_path / "reattach"
    proc = head.train(*MICRO, "--store.root", str(tmp_path), "--run_id", "reattach", log=tmp_path / "run.log")
    wait_for_event(run_dir, 4, "metrics", "commit", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    resumed = head.train("--resume", str(run_dir), log=tmp_path / "resumed.log")
    assert resumed.wait(timeout=900) == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    assert fingerprint(run_dir) == fingerprint(uninterrupted)
    log = events(run_dir)
    assert not [e for e in log if e["event"] == "restore"]  # the live workers held version 4: no checkpoint load
    assert not [e for e in log if e["event"] == "replay" and e["step"] <= 4]
    assert "'attached': True" in (tmp_path / "resumed.log").read_text()
