"""Unit tests for hybrid_core.algorithms.advantages: group baselines, reward placement, GAE, returns, whitening."""

import math

import pytest
import torch

from hybrid_core.algorithms.advantages import (
    ESTIMATORS,
    GROUP_ESTIMATORS,
    WHITENED_ESTIMATORS,
    compute_gae,
    compute_returns,
    place_sequence_rewards,
    shape_group_rewards,
    whiten,
)


def _close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32), rtol=0, atol=atol)


# two prompts, n = 3: group A = [1, 2, 3] (sum 6, mean 2), group B = [0, 0, 3] (sum 3, mean 1)
REWARDS = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 3.0])


def test_estimator_sets():
    assert ESTIMATORS == {"gae", "reinforce", "reinforce_baseline", "rloo", "group_norm", "dr_grpo"}
    assert GROUP_ESTIMATORS == {"reinforce_baseline", "rloo", "group_norm", "dr_grpo"}
    assert WHITENED_ESTIMATORS == {"gae", "reinforce", "reinforce_baseline"}


def test_rloo_subtracts_the_mean_of_the_other_samples():
    # A: 1 − (6−1)/2 = −1.5; 2 − (6−2)/2 = 0; 3 − (6−3)/2 = 1.5
    # B: 0 − (3−0)/2 = −1.5; 0 − (3−0)/2 = −1.5; 3 − (3−3)/2 = 3
    _close(shape_group_rewards(REWARDS, 3, "rloo"), [-1.5, 0.0, 1.5, -1.5, -1.5, 3.0])


@pytest.mark.parametrize("estimator", ["reinforce_baseline", "dr_grpo"])
def test_mean_baseline_estimators_subtract_the_group_mean(estimator):
    # A − 2 = [−1, 0, 1]; B − 1 = [−1, −1, 2]
    _close(shape_group_rewards(REWARDS, 3, estimator), [-1.0, 0.0, 1.0, -1.0, -1.0, 2.0])


def test_group_norm_divides_by_the_unbiased_std():
    # A: deviations [−1, 0, 1], var = (1 + 0 + 1)/2 = 1 → [−1, 0, 1]
    # B: deviations [−1, −1, 2], var = (1 + 1 + 4)/2 = 3, std = √3 = 1.7320508076
    #    → [−1/√3, −1/√3, 2/√3] = [−0.5773502692, −0.5773502692, 1.1547005384]
    expected = [-1.0, 0.0, 1.0, -0.5773502692, -0.5773502692, 1.1547005384]
    _close(shape_group_rewards(REWARDS, 3, "group_norm"), expected)


def test_group_norm_pair_from_the_style_guide():
    # [1, 0]: mean 0.5, unbiased std 0.7071 → ±0.7071
    _close(shape_group_rewards(torch.tensor([1.0, 0.0]), 2, "group_norm"), [0.7071, -0.7071], atol=1e-4)


def test_group_norm_of_a_constant_group_is_zero():
    # std 0 → 0/(0 + 1e-9) = 0, no NaN
    _close(shape_group_rewards(torch.tensor([1.0, 1.0]), 2, "group_norm"), [0.0, 0.0])


@pytest.mark.parametrize("estimator", ["gae", "reinforce"])
def test_non_group_estimators_return_an_unchanged_copy(estimator):
    shaped = shape_group_rewards(REWARDS, 3, estimator)
    _close(shaped, REWARDS)
    assert shaped.data_ptr() != REWARDS.data_ptr()
    # n = 1 is fine when no group baseline is taken
    _close(shape_group_rewards(REWARDS, 1, estimator), REWARDS)


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_shape_group_rewards_matches_a_reference_loop(estimator):
    n, num_groups = 4, 5
    rewards = torch.randn(n * num_groups, generator=torch.Generator().manual_seed(1))
    expected = []
    for g in range(num_groups):
        group = [rewards[g * n + i].item() for i in range(n)]
        mean = sum(group) / n
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (n - 1))
        for r in group:
            if estimator == "rloo":
                expected.append(r - (sum(group) - r) / (n - 1))
            elif estimator == "group_norm":
                expected.append((r - mean) / (std + 1e-9))
            elif estimator in ("reinforce_baseline", "dr_grpo"):
                expected.append(r - mean)
            else:
                expected.append(r)
    _close(shape_group_rewards(rewards, n, estimator), expected)


@pytest.mark.parametrize(
    ("rewards", "n", "estimator", "message"),
    [
        (REWARDS, 3, "grpo", r"estimator must be one of .*: got 'grpo'"),
        (REWARDS, 4, "rloo", r"n_samples_per_prompt must divide the batch size: got 4 and B=6"),
        (REWARDS, 1, "rloo", r"n_samples_per_prompt must be >= 2 for estimator 'rloo': got 1"),
        (REWARDS, 1, "group_norm", r"n_samples_per_prompt must be >= 2 for estimator 'group_norm': got 1"),
        (REWARDS, 1, "dr_grpo", r"n_samples_per_prompt must be >= 2 for estimator 'dr_grpo': got 1"),
        (REWARDS, 0, "gae", r"n_samples_per_prompt must be a positive int: got 0"),
        (REWARDS.reshape(2, 3), 3, "rloo", r"rewards must be 1-D \(B,\): got shape \(2, 3\)"),
    ],
)
def test_shape_group_rewards_rejects_bad_arguments(rewards, n, estimator, message):
    with pytest.raises(ValueError, match=message):
        shape_group_rewards(rewards, n, estimator)


def test_place_sequence_rewards_uses_the_last_unmasked_token():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    placed = place_sequence_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    # row 0 ends at t=1, row 1 at t=2, row 2 is empty and receives nothing
    _close(placed, [[0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]])


def test_place_sequence_rewards_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"rewards must be \(B,\) and mask \(B, T\): got \(3,\) and \(2, 3\)"):
        place_sequence_rewards(torch.zeros(3), torch.ones(2, 3))


def test_gae_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # row 0, γ = 1, λ = 0.5:
    #   δ2 = 1 + 0 − 0.7 = 0.3, A2 = 0.3
    #   δ1 = 0 + 0.7 − 0.6 = 0.1, A1 = 0.1 + 0.5·0.3 = 0.25
    #   δ0 = 0 + 0.6 − 0.5 = 0.1, A0 = 0.1 + 0.5·0.25 = 0.225;  returns = A + V = [0.725, 0.85, 1.0]
    advantages, returns = compute_gae(rewards[:1], values[:1], mask[:1], gamma=1.0, lambd=0.5)
    _close(advantages, [[0.225, 0.25, 0.3]])
    _close(returns, [[0.725, 0.85, 1.0]])
    # row 1, γ = 0.5, λ = 1, last token masked (its reward 9 and value 5 are ignored, V2 = 0):
    #   δ1 = 2 + 0.5·0 − 1 = 1, A1 = 1
    #   δ0 = 0 + 0.5·1 − 1 = −0.5, A0 = −0.5 + 0.5·1 = 0;  returns = [0 + 1, 1 + 1, 0]
    advantages, returns = compute_gae(rewards[1:], values[1:], mask[1:], gamma=0.5, lambd=1.0)
    _close(advantages, [[0.0, 1.0, 0.0]])
    _close(returns, [[1.0, 2.0, 0.0]])


def _reference_gae(rewards, values, mask, gamma, lambd):
    B, T = rewards.shape
    advantages, returns = torch.zeros(B, T), torch.zeros(B, T)
    for b in range(B):
        length = int(mask[b].sum().item())
        next_value, running = 0.0, 0.0
        for t in reversed(range(length)):
            delta = rewards[b, t].item() + gamma * next_value - values[b, t].item()
            running = delta + gamma * lambd * running
            advantages[b, t] = running
            returns[b, t] = running + values[b, t].item()
            next_value = values[b, t].item()
    return advantages, returns


def _random_right_padded(B, T, seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    return torch.randn(B, T, generator=gen), torch.randn(B, T, generator=gen), mask


@pytest.mark.parametrize(("gamma", "lambd"), [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.0, 0.0)])
def test_gae_matches_a_reference_loop(gamma, lambd):
    rewards, values, mask = _random_right_padded(6, 9, seed=2)
    advantages, returns = compute_gae(rewards, values, mask, gamma, lambd)
    expected_advantages, expected_returns = _reference_gae(rewards, values, mask, gamma, lambd)
    _close(advantages, expected_advantages)
    _close(returns, expected_returns)


def test_gae_with_lambda_one_is_monte_carlo_return_minus_value():
    rewards, values, mask = _random_right_padded(4, 6, seed=3)
    advantages, returns = compute_gae(rewards, values, mask, gamma=0.9, lambd=1.0)
    _close(advantages, compute_returns(rewards, mask, gamma=0.9) - values * mask)
    _close(returns, compute_returns(rewards, mask, gamma=0.9))


def test_returns_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.0, 1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # γ = 0.5. row 0: G2 = 3, G1 = 2 + 0.5·3 = 3.5, G0 = 1 + 0.5·3.5 = 2.75
    # row 1 (reward 5 masked out): G2 = 0, G1 = 1, G0 = 0 + 0.5·1 = 0.5
    _close(compute_returns(rewards, mask, gamma=0.5), [[2.75, 3.5, 3.0], [0.5, 1.0, 0.0]])


@pytest.mark.parametrize("gamma", [1.0, 0.7])
def test_returns_match_a_reference_loop(gamma):
    rewards, _, mask = _random_right_padded(5, 8, seed=4)
    expected = torch.zeros(5, 8)
    for b in range(5):
        for t in range(int(mask[b].sum().item())):
            expected[b, t] = sum(
                gamma ** (k - t) * rewards[b, k].item() for k in range(t, int(mask[b].sum().item()))
            )
    _close(compute_returns(rewards, mask, gamma), expected)


WHITEN_ADVANTAGES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
WHITEN_MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_whiten_by_hand():
    # unmasked [1, 2, 3, 4]: μ = 2.5, var = (2.25 + 0.25 + 0.25 + 2.25)/4 = 1.25, sqrt = 1.1180339887
    # (A − μ)/1.1180339887 = [−1.3416407865, −0.4472135955, 0.4472135955, 1.3416407865]
    expected = [[-1.3416407865, -0.4472135955, 0.4472135955], [1.3416407865, 0.0, 0.0]]
    _close(whiten(WHITEN_ADVANTAGES, WHITEN_MASK), expected)


def test_whiten_mean_only():
    # no_std_norm: A − 2.5 = [−1.5, −0.5, 0.5, 1.5]
    _close(whiten(WHITEN_ADVANTAGES, WHITEN_MASK, scale_std=False), [[-1.5, -0.5, 0.5], [1.5, 0.0, 0.0]])


def test_whiten_scale_only_and_neither():
    # A/1.1180339887 = [0.8944271910, 1.7888543820, 2.6832815730, 3.5777087640]
    expected = [[0.8944271910, 1.7888543820, 2.6832815730], [3.5777087640, 0.0, 0.0]]
    _close(whiten(WHITEN_ADVANTAGES, WHITEN_MASK, shift_mean=False), expected)
    _close(whiten(WHITEN_ADVANTAGES, WHITEN_MASK, shift_mean=False, scale_std=False), [[1, 2, 3], [4, 0, 0.0]])


def test_whiten_floors_the_variance():
    # constant advantages: var = 0 → 1e-8, so A/sqrt(1e-8) = 2·1e4 = 20000 (shift off), and 0 with the shift
    advantages, mask = torch.full((1, 2), 2.0), torch.ones(1, 2)
    _close(whiten(advantages, mask, shift_mean=False), [[20000.0, 20000.0]], atol=1e-2)
    _close(whiten(advantages, mask), [[0.0, 0.0]])


def test_whiten_matches_a_reference_loop():
    advantages, _, mask = _random_right_padded(6, 7, seed=5)
    kept = [advantages[b, t].item() for b in range(6) for t in range(7) if mask[b, t] > 0]
    mean = sum(kept) / len(kept)
    std = math.sqrt(max(sum((a - mean) ** 2 for a in kept) / len(kept), 1e-8))
    expected = torch.zeros(6, 7)
    for b in range(6):
        for t in range(7):
            if mask[b, t] > 0:
                expected[b, t] = (advantages[b, t].item() - mean) / std
    _close(whiten(advantages, mask), expected)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: compute_gae(torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 4), 1.0, 0.9), r"rewards and mask"),
        (lambda: compute_gae(torch.ones(2, 3), torch.ones(2, 2), torch.ones(2, 3), 1.0, 0.9), r"values and mask"),
        (lambda: compute_gae(torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 3), 1.5, 0.9), r"gamma .*: got 1.5"),
        (lambda: compute_gae(torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 3), 1.0, -0.1), r"lambd .*: got -0.1"),
        (lambda: compute_returns(torch.ones(3), torch.ones(3), 1.0), r"rewards and mask .*: got \(3,\) and \(3,\)"),
        (lambda: compute_returns(torch.ones(2, 3), torch.ones(2, 3), 2.0), r"gamma must be in \[0, 1\]: got 2.0"),
        (lambda: whiten(torch.ones(2, 3), torch.ones(3, 2)), r"advantages and mask .*: got \(2, 3\) and \(3, 2\)"),
    ],
)
def test_per_token_functions_reject_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
