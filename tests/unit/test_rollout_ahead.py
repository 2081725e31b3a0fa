"""The engine's turns in async mode (a weight push waits for a generation's pause point, the generation goes on once
the push ended; without partial rollout the push waits for the whole batch), and the staleness figures of a batch."""
from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from hybrid_core.workers.rollout_ahead import EngineTurns, async_figures, token_figures


def test_a_push_waits_for_the_pause_point_and_the_generation_for_the_push():
    turns, order = EngineTurns(), []
    at_pause, pushed = threading.Event(), threading.Event()

    def generation():
        with turns.lock:
            order.append("step 1")
            at_pause.wait(5)
            time.sleep(0.05)  # the push is waiting on the lock now
            turns.pause_point()
            order.append("step 2")

    def push():
        turns.begin_update()
        order.append("weights loaded")
        turns.end_update()
        pushed.set()

    gen = threading.Thread(target=generation)
    gen.start()
    time.sleep(0.05)
    pusher = threading.Thread(target=push)
    pusher.start()
    time.sleep(0.05)
    assert order == ["step 1"] and turns.update_waiting.is_set()
    at_pause.set()
    gen.join(5)
    pusher.join(5)
    assert order == ["step 1", "weights loaded", "step 2"] and pushed.is_set()
    assert not turns.update_waiting.is_set() and not turns.lock.locked()


def test_without_a_waiting_push_the_pause_point_keeps_the_engine_and_a_retried_push_begins_once():
    turns = EngineTurns()
    with turns.lock:
        turns.pause_point()  # returns at once: nothing waits
        assert turns.lock.locked()
    turns.begin_update()
    turns.begin_update()  # a retried sync begins again: it holds the engine already
    turns.end_update()
    turns.end_update()
    assert not turns.lock.locked()


def test_staleness_is_counted_from_the_oldest_version_and_the_tokens_mean():
    table = pa.table({"token_policy_version": pa.array([[2, 2, 3], [3, 3], []], pa.list_(pa.int32()))})
    figures = token_figures(table)
    assert figures == {"rollout/token_version_min": 2.0, "rollout/token_version_max": 3.0,
                       "rollout/token_version_mean": pytest.approx(13 / 5), "rollout/old_version_token_share": 0.4}
    # step 5 trains version 4: the oldest token is 2 versions behind, the tokens 1.4 on average
    assert async_figures(5, 2, 0.25, figures) == {"rollout/staleness": 2.0, "timing_s/rollout_wait": 0.25,
                                                  "rollout/staleness_token_mean": pytest.approx(1.4)}
    assert async_figures(3, 1, 0.0) == {"rollout/staleness": 1.0, "timing_s/rollout_wait": 0.0}
