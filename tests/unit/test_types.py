"""Unit tests for hybrid_core.types: run names and the worker-side stamp of a stage call's start."""
import time

import pytest

from hybrid_core.types import RunRef, StageResult, stamped


class _Worker:
    @stamped
    def score(self, step: int) -> StageResult:
        """Score step `step`."""
        time.sleep(0.05)
        return StageResult("reward", step, 0.05, rows=3, metrics={"x": 1.0})


def test_stamped_records_when_the_worker_began_and_keeps_the_result():
    before = time.time()
    result = _Worker().score(7)
    after = time.time()
    assert before <= result.entered_at <= after - 0.05  # stamped on entry, not on return
    assert (result.stage, result.step, result.rows, result.metrics) == ("reward", 7, 3, {"x": 1.0})
    assert _Worker.score.__doc__ == "Score step `step`."


def test_actor_names_and_unknown_roles():
    run = RunRef("r1", "/tmp/store/")
    assert run.actor_name("actor", 2) == "r1/actor/2" and run.run_dir == "/tmp/store/r1"
    with pytest.raises(ValueError, match="role must be one of"):
        run.actor_name("judge")
