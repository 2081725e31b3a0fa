"""Unit tests for hybrid_core.algorithms.penalties: the DAPO overlong penalty and the stop-properly penalty."""

import pytest
import torch

from hybrid_core.algorithms.penalties import overlong_penalty, stop_penalty


def _close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32), rtol=0, atol=atol)


def test_overlong_penalty_by_hand():
    # max_new_tokens 10, buffer 4 → E = 6. len 5, 6: ≤ E → 0; 7: −1/4 = −0.25; 8: −2/4 = −0.5;
    # 10: −4/4 = −1; 12: −min(6, 4)/4 = −1
    lengths = torch.tensor([5, 6, 7, 8, 10, 12])
    _close(overlong_penalty(lengths, 10, 4, 1.0), [0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    # factor 0.5 halves every penalty
    _close(overlong_penalty(lengths, 10, 4, 0.5), [0.0, 0.0, -0.125, -0.25, -0.5, -0.5])


def test_overlong_penalty_returns_float32_for_int32_lengths():
    penalty = overlong_penalty(torch.tensor([9], dtype=torch.int32), 10, 4, 1.0)
    assert penalty.dtype == torch.float32
    _close(penalty, [-0.75])  # E = 6, −3/4


def test_overlong_penalty_matches_a_reference_loop():
    lengths = torch.randint(0, 70, (20,), generator=torch.Generator().manual_seed(9))
    max_new_tokens, buffer_len, factor = 64, 16, 0.7
    expected_len = max_new_tokens - buffer_len
    expected = [
        -min(length - expected_len, buffer_len) / buffer_len * factor if length > expected_len else 0.0
        for length in lengths.tolist()
    ]
    _close(overlong_penalty(lengths, max_new_tokens, buffer_len, factor), expected)


@pytest.mark.parametrize(
    ("lengths", "max_new_tokens", "buffer_len", "factor", "message"),
    [
        (torch.tensor([1.0, 2.0]), 10, 4, 1.0, r"response_lengths must be a 1-D integer tensor: .*torch.float32"),
        (torch.tensor([[1, 2]]), 10, 4, 1.0, r"response_lengths must be a 1-D integer tensor: got shape \(1, 2\)"),
        (torch.tensor([1, 2]), 10, 0, 1.0, r"buffer_len must be > 0: got 0"),
        (torch.tensor([1, 2]), 3, 4, 1.0, r"max_new_tokens must be >= buffer_len: got 3 and 4"),
        (torch.tensor([1, 2]), 10, 4, -1.0, r"factor must be >= 0: got -1.0"),
    ],
)
def test_overlong_penalty_rejects_bad_arguments(lengths, max_new_tokens, buffer_len, factor, message):
    with pytest.raises(ValueError, match=message):
        overlong_penalty(lengths, max_new_tokens, buffer_len, factor)


REWARDS = torch.tensor([1.0, 0.5, -1.0])
TRUNCATED = torch.tensor([True, False, True])


@pytest.mark.parametrize(
    ("coef", "expected"),
    [
        (0.5, [0.5, 0.5, -0.5]),  # truncated: r·0.5 → 1·0.5, −1·0.5
        (0.0, [0.0, 0.5, 0.0]),  # truncated: r·0
        (1.0, [1.0, 0.5, -1.0]),  # r·1: no change
        (-1.0, [-1.0, 0.5, -1.0]),  # negative coef: truncated rewards become the constant −1
        (-0.3, [-0.3, 0.5, -0.3]),
    ],
)
def test_stop_penalty(coef, expected):
    _close(stop_penalty(REWARDS, TRUNCATED, coef), expected)


def test_stop_penalty_does_not_modify_its_input():
    rewards = REWARDS.clone()
    stop_penalty(rewards, TRUNCATED, 0.0)
    _close(rewards, REWARDS)


@pytest.mark.parametrize(
    ("truncated", "coef", "message"),
    [
        (TRUNCATED, 1.5, r"coef must be <= 1 .*: got 1.5"),
        (TRUNCATED.float(), 0.5, r"truncated must be a bool tensor of the shape of rewards: got torch.float32"),
        (TRUNCATED[:2], 0.5, r"truncated must be a bool tensor .*: got torch.bool \(2,\) and \(3,\)"),
    ],
)
def test_stop_penalty_rejects_bad_arguments(truncated, coef, message):
    with pytest.raises(ValueError, match=message):
        stop_penalty(REWARDS, truncated, coef)
