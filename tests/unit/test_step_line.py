"""The console line of a step: its reward, length, KL and stage seconds, and in async mode its staleness, the wait for
its batch and its own wall time."""
from __future__ import annotations

from flows.reporting import step_line

ROW = {"reward/mean": 0.5, "rollout/response_length_mean": 12.25, "actor/kl": 0.001, "timing_s/rollout": 0.5,
       "timing_s/train": 1.25}


def test_a_sync_step_line_names_its_stages():
    assert step_line(3, 20, ROW) == ("step 3/20 | reward 0.500 | response length 12.2 | kl 0.00100 | rollout 0.50s "
                                     "train 1.25s")


def test_an_async_step_line_adds_staleness_wait_and_wall():
    row = ROW | {"rollout/staleness": 2.0, "timing_s/rollout_wait": 0.125, "timing_s/step_wall": 1.5}
    assert step_line(3, 20, row).endswith("train 1.25s | staleness 2, waited 0.12s, step 1.50s")
