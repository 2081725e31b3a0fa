"""A run scored by two real `hybrid serve-reward` servers on loopback, one of them killed once step 1's rewards are
committed: the run completes and every step's committed rewards are those of the reference run, which called the
same reward file directly (same seed, so the same rollouts)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import read_stage, run_micro

from tests.unit.rewards.reward_servers import LETTERS_REWARD, start_serve_reward, stop

pytestmark = pytest.mark.integration
RUN_ID = "remote-rewards"


def kill_when_committed(marker: Path, proc, killed: dict, give_up_s: float = 600) -> threading.Thread:
    """Kill `proc` as soon as `marker` exists (polling in a thread); records when in `killed`."""

    def watch():
        deadline = time.monotonic() + give_up_s
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if marker.exists():
            proc.kill()
            killed["at"] = time.time()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_run_on_two_reward_servers_survives_one_dying_with_the_rewards_of_the_file(tmp_path, reference_run):
    _, reference = reference_run
    with ThreadPoolExecutor(max_workers=2) as pool:  # both start (import torch) side by side
        (survivor, first_url), (doomed, second_url) = pool.map(start_serve_reward, [LETTERS_REWARD] * 2)
    killed: dict = {}
    watcher = kill_when_committed(tmp_path / RUN_ID / "steps" / "1" / "reward" / "_SUCCESS", doomed, killed)
    try:
        # batches of one sample: round-robin, both servers score step 1; steps 2 and 3 find the second one dead
        cfg, run_dir = run_micro(tmp_path, RUN_ID, "--reward.remote_url", f"{first_url},{second_url}",
                                 "--reward.remote_batch_size", "1")
        watcher.join(timeout=5)
        assert doomed.poll() is not None and "at" in killed, "the second server was not killed"
        assert survivor.poll() is None
    finally:
        stop(survivor)
        stop(doomed)
    assert cfg.train.max_steps == 3
    # steps 2 and 3 were scored after the kill, so by the first server alone
    assert (Path(run_dir) / "steps" / "2" / "reward" / "_SUCCESS").stat().st_mtime > killed["at"]
    for step in (1, 2, 3):
        got, want = read_stage(run_dir, step, "reward"), read_stage(reference.run_dir, step, "reward")
        assert got.num_rows == want.num_rows == 4
        assert got.to_pylist() == want.to_pylist(), f"step {step}"
