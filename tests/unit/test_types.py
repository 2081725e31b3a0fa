"""Unit tests for hybrid_core.types (run names, checkpoint steps) and hybrid_core.workers.stage_clock (the worker-side
stamp of a stage call's start, its dispatch and its GC pauses)."""
import time

import pytest

import gc

from hybrid_core.types import RunRef, StageResult
from hybrid_core.workers.stage_clock import freeze_startup_heap, stamped


class _Worker:
    @stamped
    def score(self, step: int) -> StageResult:
        """Score step `step`."""
        time.sleep(0.05)
        return StageResult(stage="reward", step=step, seconds=0.05, rows=3,
                           metrics={"x": 1.0} | self.clock.figures("reward"))


def test_stamped_records_when_the_worker_began_the_dispatch_and_keeps_the_result():
    before = time.time()
    result = _Worker().score(7, called_at=before - 2.0)  # the call was made 2 s before the worker began it
    after = time.time()
    assert before <= result.entered_at <= after - 0.05  # stamped on entry, not on return
    assert (result.stage, result.step, result.rows, result.metrics["x"]) == ("reward", 7, 3, 1.0)
    assert 2.0 <= result.metrics["timing_s/dispatch_reward"] <= 2.0 + (after - before)
    assert _Worker().score(8).metrics["timing_s/dispatch_reward"] == 0.0  # no call time given: none measured
    assert _Worker.score.__doc__ == "Score step `step`."


def test_the_clock_reports_the_collector_pauses_since_the_last_stage():
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


def test_a_frozen_start_up_heap_is_left_out_of_later_collections():
    heap = [[[i] for i in range(200)] for _ in range(2000)]  # a worker's long-lived objects: 402k tracked lists
    gc.collect()
    assert any(o is heap for o in gc.get_objects())  # a full collection walks them
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() >= 402_000
        assert not any(o is heap or o is heap[0] for o in gc.get_objects())  # in the permanent generation now
        assert gc.get_count()[0] < 100  # and the young generation starts empty
    finally:
        gc.unfreeze()
    assert any(o is heap for o in gc.get_objects())


def _run(**changes) -> RunRef:
    fields = dict(run_id="r1", store_root="/tmp/store/", stage_timeout_s=60.0, roles=("actor", "rollout"),
                  stage_retries=2, retry_delay_s=5.0, save_steps=2, eval_steps=3, eval_at_start=False)
    return RunRef(**fields | changes)


def test_checkpoints_are_due_every_save_steps():
    assert [k for k in range(1, 8) if _run().is_checkpoint_due(k)] == [2, 4, 6]
    assert not any(_run(save_steps=-1).is_checkpoint_due(k) for k in range(1, 8))


def test_evaluations_are_due_every_eval_steps_and_at_step_0_with_at_start():
    assert [k for k in range(0, 8) if _run().is_eval_due(k)] == [3, 6]
    assert [k for k in range(0, 8) if _run(eval_at_start=True).is_eval_due(k)] == [0, 3, 6]
    assert [k for k in range(0, 8) if _run(eval_steps=-1, eval_at_start=True).is_eval_due(k)] == [0]


def test_actor_names_and_unknown_roles():
    run = _run()
    assert run.actor_name("actor", 2) == "r1/actor/2" and run.run_dir == "/tmp/store/r1"
    with pytest.raises(ValueError, match="role must be one of"):
        run.actor_name("judge")
