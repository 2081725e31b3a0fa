"""The step contract end to end on CPU (real Ray, Prefect, vLLM CPU build, DeepSpeed), on copies of the shared
reference run: replay verifies committed files, regenerating a stage redoes the ones after it, a damaged or missing
manifest is a clear refusal, a held run directory is refused, retries follow the settings and the error's kind, and a
hung stage fails after the stage timeout naming it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import micro_config
from durable_runs import events, fingerprint

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.fixture
def copied(reference_run, tmp_path) -> Path:
    """A copy of the reference run's directory (3 committed steps, no checkpoint) under a store of its own."""
    _, result = reference_run
    shutil.copytree(result.run_dir, tmp_path / "reference")
    return tmp_path / "reference"


def resume(copied: Path, *flags: str):
    """Continue the copied run in this process: its saved configuration under the copy's store, and `flags`."""
    from flows.rl_train import rl_train
    from hybrid_core.flags import parse_cli

    cfg = parse_cli(["--config", str(copied / "config.yaml"), "--store.root", str(copied.parent), *flags])
    return rl_train(cfg, run_id="reference")


def task_run(name: str):
    """The newest task run called `name` (this test's: tests run one after another)."""
    from prefect import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName
    from prefect.client.schemas.sorting import TaskRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=[name])),
                                     sort=TaskRunSort.EXPECTED_START_TIME_DESC, limit=1)
    return runs[0]


def directory_digest(root: Path) -> dict[str, bytes]:
    """Every file's bytes but the lease's (the refused run took the lease before it looked)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "_lease.json"}


def test_an_altered_committed_file_is_refused_at_replay_and_not_retried(copied, ray_session, prefect_server):
    from hybrid_core.types import PermanentError

    part = copied / "steps" / "2" / "advantage" / "part-00000.parquet"
    num_events = len(events(copied))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(PermanentError, match=r"step 2 stage advantage: .*/reference/steps/2/advantage/"
                                             r"part-00000\.parquet does not match the sha256 recorded") as err:
        resume(copied, "--train.max_steps", "4")
    assert "actor rank 0 (reference/actor/0) in advantage of step 2" in str(err.value)
    assert task_run("advantage-step-2").run_count == 1  # a retry cannot fix altered data
    assert [(e["step"], e["stage"], e["event"]) for e in events(copied)[num_events:] if e["event"] != "commit"] == \
        [(1, s, "replay") for s in ("rollout", "reward", "advantage")] + [(1, "train", "start")] + \
        [(1, "train", "reproduced"), (1, "sync", "start"), (1, "sync", "reproduced"), (1, "metrics", "replay"),
         (2, "rollout", "replay"),
         (2, "reward", "replay")]  # step 1 replayed, step 2's advantage refused: nothing generated again


def test_a_deleted_success_marker_regenerates_the_stage_and_those_after_it_and_a_retry_completes_it(
        copied, reference_run, ray_session, prefect_server, monkeypatch):
    """Step 2's rollout loses its marker: it is generated again (its first attempt fails after writing, and Prefect's
    retry completes it), the step's reward and advantage are redone, and the run ends with the same bytes."""
    before = fingerprint(copied)
    (copied / "steps" / "2" / "rollout" / "_SUCCESS").unlink()
    monkeypatch.setenv("HYBRID_FAULTS", "raise:2:rollout:written")
    resume(copied, "--train.retry_delay_s", "0")
    assert fingerprint(copied) == before
    log = [(e["step"], e["stage"], e["event"]) for e in events(copied)]
    resumed = log[log.index((2, "rollout", "start")):]
    assert (2, "rollout", "fault") in resumed and resumed.count((2, "rollout", "start")) == 2
    for stage in ("reward", "advantage", "metrics"):
        assert (2, stage, "start") in resumed and (1, stage, "start") not in resumed, stage
    assert (2, "rollout", "invalidate") in resumed
    assert task_run("rollout-step-2").run_count == 2
    assert (1, "rollout", "replay") in log and (3, "rollout", "replay") in log


@pytest.mark.parametrize("damage", [b'{"steps": {"1": {"rollo', b""])
def test_a_damaged_manifest_is_a_clear_error_everywhere(copied, damage, ray_session, prefect_server):
    from hybrid_core.types import PermanentError

    (copied / "manifest.json").write_bytes(damage)
    for command in (["train", "--resume", str(copied)], ["rollouts", str(copied)]):
        proc = subprocess.run([sys.executable, "-m", "flows.cli", *command], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=180)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "manifest.json is damaged" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    with pytest.raises(PermanentError, match=r"is damaged: .* restore it from a copy, or start a new --run_id"):
        resume(copied)  # refused by the flow's preflight, before the lease or any worker


def test_a_directory_with_data_but_no_manifest_is_refused_and_left_as_it_was(copied, ray_session,
                                                                              prefect_server):
    from hybrid_core.types import PermanentError

    (copied / "manifest.json").unlink()
    before = directory_digest(copied)
    with pytest.raises(PermanentError, match=r"holds ckpt|holds config\.yaml.* but no manifest\.json.* never "
                                                r"overwritten"):
        resume(copied, "--rollout.temperature", "0.5")  # another configuration under the same run id
    assert directory_digest(copied) == before


def test_a_run_directory_held_by_a_live_run_is_refused_naming_it(copied, ray_session, prefect_server):
    import os

    from hybrid_core.data.run_lease import RunLease, RunLockedError

    with RunLease(str(copied), "reference"):  # another live run of this id, on this host
        started = time.perf_counter()
        with pytest.raises(RunLockedError, match=rf"is in use by another run: pid {os.getpid()} on host"):
            resume(copied, "--train.max_steps", "4")
        assert time.perf_counter() - started < 30  # refused before any worker starts
    assert not (copied / "steps" / "4").exists()


BROKEN_REWARDS = {
    "nan": ("{'rewards': [float('nan')] * len(queries)}", r"returned a non-finite reward nan for sample #0"),
    "short-extra-logs": ("{'rewards': [1.0] * len(queries), 'extra_logs': {'acc': [1.0]}}",
                         r"returned extra_logs\['acc'\] with 1 values for \d+ samples"),
}


@pytest.mark.parametrize("broken", sorted(BROKEN_REWARDS))
def test_a_reward_function_that_fails_the_same_way_again_is_not_retried(broken, tmp_path, tiny_model, ray_session,
                                                                        prefect_server):
    from flows.rl_train import rl_train
    from hybrid_core.types import PermanentError

    returned, message = BROKEN_REWARDS[broken]
    reward = tmp_path / "broken_reward.py"
    reward.write_text(f"def reward_func(queries, prompts, labels, **kwargs):\n    return {returned}\n")
    cfg = micro_config(tmp_path, "--reward.remote_url", str(reward), "--train.retry_delay_s", "20")
    started = time.perf_counter()
    with pytest.raises(PermanentError, match=r"rollout rank 0 \(broken\)?.*in reward of step 1 failed: "
                                             r"RewardFunctionError: reward_func in .*broken_reward\.py " + message):
        rl_train(cfg, run_id="broken")
    assert task_run("reward-step-1").run_count == 1 and time.perf_counter() - started < 120


def test_a_hung_stage_fails_after_the_stage_timeout_naming_it(tmp_path, tiny_model, ray_session, prefect_server,
                                                              monkeypatch):
    from flows.rl_train import rl_train

    monkeypatch.setenv("HYBRID_FAULTS", "sleep30:1:advantage:start")  # longer than the timeout and the stop after it
    cfg = micro_config(tmp_path, "--train.stage_timeout_s", "6", "--train.stage_retries", "0")
    with pytest.raises(Exception, match=r"actor rank 0 \(hung/actor/0\) in advantage of step 1: no answer within "
                                        r"6s \(train\.stage_timeout_s\)"):
        rl_train(cfg, run_id="hung")
    run = task_run("advantage-step-1")
    assert 5.5 <= (run.end_time - run.start_time).total_seconds() < 20
    assert json.loads((tmp_path / "hung" / "manifest.json").read_text())["steps"]["1"].keys() == {"rollout", "reward"}


def test_a_failing_peer_rank_is_reported_by_its_own_rank(ray_session):
    """Rank 0 leads: a peer that raises or hangs is named by role and rank, with its own error."""
    import ray

    from hybrid_core.workers.rank_group import RankFailure, gather

    @ray.remote(num_cpus=0)
    class Peer:
        def fail(self):
            raise ValueError("bad shard")

        def hang(self):
            time.sleep(30)

    peer = Peer.remote()
    try:
        with pytest.raises(RankFailure, match=r"critic rank 3 failed: ValueError\('bad shard'\)") as err:
            gather("critic", [(3, peer.fail.remote())], timeout_s=30)
        assert isinstance(err.value.cause, ValueError)
        started = time.perf_counter()
        with pytest.raises(RankFailure, match=r"actor rank 1 gave no answer within 2s"):
            gather("actor", [(1, peer.hang.remote())], timeout_s=2)
        assert time.perf_counter() - started < 2.0  # the peers' share of the timeout: before the task gives up
    finally:
        ray.kill(peer)
