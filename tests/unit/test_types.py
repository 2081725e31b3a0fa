"""Unit tests for hybrid_core.types (run names) and hybrid_core.workers.stage_clock (the worker-side stamp of a
stage call's start and its GC pauses)."""
import time

import pytest

import gc

from hybrid_core.types import RunRef, StageResult
from hybrid_core.workers.stage_clock import stamped


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
    assert (result.stage, result.step, result.rows, result.metrics["x"]) == ("reward", 7, 3, 1.0)
    assert _Worker.score.__doc__ == "Score step `step`."


def test_stamped_reports_the_collector_pauses_since_the_last_stage():
    gc.disable()  # only the explicit collection below may pause the process
    try:
        _Worker().score(1)  # the counter runs from here
        garbage = [[[i] for i in range(200)] for _ in range(2000)]  # 400k tracked lists: a slow full collection
        started = time.perf_counter()
        gc.collect()
        collected_s = time.perf_counter() - started
        del garbage
    finally:
        gc.enable()
    paused = _Worker().score(2).metrics["timing_s/gc_reward"]
    assert 0.5 * collected_s <= paused <= collected_s + 0.05
    assert _Worker().score(3).metrics["timing_s/gc_reward"] < 0.5 * collected_s  # reported once, then counted afresh


def test_actor_names_and_unknown_roles():
    run = RunRef("r1", "/tmp/store/")
    assert run.actor_name("actor", 2) == "r1/actor/2" and run.run_dir == "/tmp/store/r1"
    with pytest.raises(ValueError, match="role must be one of"):
        run.actor_name("judge")
