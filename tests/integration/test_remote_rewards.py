"""A run scored by two real `hybrid serve-reward` servers on loopback, one of them killed once step 1's rewards are
committed (the session's `served_eval_run`, which also evaluates): the run completes and every step's committed
rewards are those of the reference run, which called the same reward file directly (same seed, so the same
rollouts)."""
from __future__ import annotations

from pathlib import Path

from conftest import read_stage


def test_a_run_on_two_reward_servers_survives_one_dying_with_the_rewards_of_the_file(served_eval_run, reference_run):
    _, reference = reference_run
    run = served_eval_run
    assert run.doomed.poll() is not None and run.killed_at is not None, "the second server was not killed"
    assert run.killed_at < run.finished_at and run.survivor.poll() is None
    assert run.cfg.train.max_steps == 3
    # steps 2 and 3 were scored after the kill, so by the first server alone
    assert (Path(run.result.run_dir) / "steps" / "2" / "reward" / "_SUCCESS").stat().st_mtime > run.killed_at
    for step in (1, 2, 3):
        got, want = read_stage(run.result.run_dir, step, "reward"), read_stage(reference.run_dir, step, "reward")
        assert got.num_rows == want.num_rows == 4
        assert got.to_pylist() == want.to_pylist(), f"step {step}"
