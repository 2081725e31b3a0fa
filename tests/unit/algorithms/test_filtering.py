"""Unit tests for hybrid_core.algorithms.filtering: the dynamic-filtering keep mask over prompt groups."""

import pytest
import torch

from hybrid_core.algorithms.filtering import keep_groups


def test_keeps_groups_strictly_inside_the_range():
    # n = 2: group means [1, 0.5, 0]; keep iff 0 < mean < 1 → only the middle group
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    torch.testing.assert_close(keep_groups(scores, 2, 0.0, 1.0), torch.tensor([False, True, False]))


def test_bounds_are_exclusive():
    # n = 4: means [0.25, 0.5, 0.75]; with (0.25, 0.75) only 0.5 passes; with (0.2, 0.8) all three do
    scores = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0])
    torch.testing.assert_close(keep_groups(scores, 4, 0.25, 0.75), torch.tensor([False, True, False]))
    torch.testing.assert_close(keep_groups(scores, 4, 0.2, 0.8), torch.tensor([True, True, True]))


def test_matches_a_reference_loop():
    n, num_groups = 4, 10
    scores = torch.randint(0, 2, (n * num_groups,), generator=torch.Generator().manual_seed(5)).float()
    expected = []
    for g in range(num_groups):
        mean = sum(scores[g * n + i].item() for i in range(n)) / n
        expected.append(0.0 < mean < 1.0)
    torch.testing.assert_close(keep_groups(scores, n, 0.0, 1.0), torch.tensor(expected))


@pytest.mark.parametrize(
    ("scores", "n", "low", "high", "message"),
    [
        (torch.ones(6), 4, 0.0, 1.0, r"n_samples_per_prompt must divide the batch size: got 4 and B=6"),
        (torch.ones(6), 0, 0.0, 1.0, r"n_samples_per_prompt must be a positive int: got 0"),
        (torch.ones(6), 2, 1.0, 1.0, r"low must be < high: got 1.0 and 1.0"),
        (torch.ones(6), 2, 0.8, 0.2, r"low must be < high: got 0.8 and 0.2"),
        (torch.ones(2, 3), 3, 0.0, 1.0, r"scores must be 1-D \(B,\): got shape \(2, 3\)"),
    ],
)
def test_rejects_bad_arguments(scores, n, low, high, message):
    with pytest.raises(ValueError, match=message):
        keep_groups(scores, n, low, high)
