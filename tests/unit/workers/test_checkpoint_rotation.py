"""Checkpoint rotation with the best eval metric (OpenRLHF's order): the best is exempt, the newest stays, and the
others go without-metric first, then worst, then oldest, down to ckpt.max_num regular ones."""
import pytest

from hybrid_core.types import PermanentError
from hybrid_core.workers.checkpoints import best_metric_of, best_step, steps_to_evict


def test_without_metrics_the_oldest_go_first():
    assert steps_to_evict([1, 2, 3, 4, 5], {}, 3, None) == [1, 2]
    assert steps_to_evict([1, 2, 3], {}, 3, None) == []
    assert steps_to_evict([1, 2], {}, 1, None) == [1]


def test_the_best_is_kept_through_rotation_and_the_newest_always_stays():
    metrics = {2: 0.9, 4: 0.3, 6: 0.5, 8: 0.1}
    best = best_step(metrics)
    assert best == 2
    # max_num 1 keeps the newest regular one (8, although worst) and the best besides it
    assert steps_to_evict([2, 4, 6, 8], metrics, 1, best) == [4, 6]
    # max_num 3: the newest and the two best regular ones (2, 6); 4 (0.3) is worse than 6 (0.5)
    assert steps_to_evict([2, 4, 6, 8], metrics, 3, best) == [4]
    # max_num 2: the best fills the second regular slot
    assert steps_to_evict([2, 4, 6, 8], metrics, 2, best) == [4, 6]
    # checkpoints of steps without an evaluation go before any evaluated one, the oldest first
    assert steps_to_evict([1, 2, 3, 4, 5, 6], {2: 0.9, 4: 0.3, 6: 0.5}, 3, 2) == [1, 3, 5]
    # the newest being the best: nothing else is kept for it
    assert steps_to_evict([1, 2, 3], {1: 0.1, 2: 0.2, 3: 0.3}, 1, 3) == [1, 2]


def test_a_tie_keeps_the_earlier_best():
    assert best_step({3: 0.5, 1: 0.5, 2: 0.25}) == 1
    assert best_step({}) is None


def test_the_metric_of_a_checkpoint_comes_from_its_steps_row():
    row = {"reward/mean": 0.1, "eval/math_pass1": 0.25, "eval/math_pass4": 0.5, "eval/aime_pass1": 0.125}
    assert best_metric_of("", row) == 0.125  # the first eval/*_pass1 in name order, as the default
    assert best_metric_of("eval/math_pass4", row) == 0.5
    assert best_metric_of("eval_math_pass4", row) == 0.5  # OpenRLHF's spelling
    assert best_metric_of("none", row) is None
    assert best_metric_of("eval/math_pass4", {"reward/mean": 0.1}) is None  # a step that was not evaluated
    with pytest.raises(PermanentError, match=r"ckpt.best_metric_key 'eval/gsm_pass1' is not a figure of the "
                                             r"evaluation: it has \['eval/aime_pass1', 'eval/math_pass1'"):
        best_metric_of("eval/gsm_pass1", row)
