"""Unit tests for hybrid_core.algorithms.losses: aggregation, policy loss (PPO/dual clip/GSPO), value loss."""

import math

import pytest
import torch

from hybrid_core.algorithms.losses import (
    aggregate_sequence_loss,
    aggregate_token_loss,
    masked_mean,
    policy_loss,
    value_loss,
)


def _close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32), rtol=0, atol=atol)


def _log(values):
    return torch.tensor([[math.log(v) for v in row] for row in values])


# One sequence, old_logprobs 0, so ρ = exp(logprobs) = [1.5, 0.5, 1.1, 0.7]; A = [1, 1, −1, −1]; ε = 0.2:
#   t0: ρA = 1.5, clip(ρ)A = 1.2 → min 1.2 → loss −1.2 (clipped)
#   t1: ρA = 0.5, clip(ρ)A = 0.8 → min 0.5 → loss −0.5
#   t2: ρA = −1.1, clip(ρ)A = −1.1 → loss 1.1
#   t3: ρA = −0.7, clip(ρ)A = −0.8 → min −0.8 → loss 0.8 (clipped)
RATIOS = [[1.5, 0.5, 1.1, 0.7]]
LOGPROBS = _log(RATIOS)
OLD_LOGPROBS = torch.zeros(1, 4)
ADVANTAGES = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
FULL_MASK = torch.ones(1, 4)


def test_masked_mean():
    x, mask = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1, 0], [1, 1]])
    _close(masked_mean(x, mask), 8.0 / 3.0)  # (1 + 3 + 4)/3
    _close(masked_mean(x, mask, dim=-1), [1.0, 3.5])  # [1/1, (3 + 4)/2]
    _close(masked_mean(x, torch.zeros(2, 2)), 0.0)  # nothing unmasked: 0, not NaN
    with pytest.raises(ValueError, match=r"x must have the shape of mask: got \(2, 2\) and \(2,\)"):
        masked_mean(x, torch.ones(2))


def test_aggregate_token_loss():
    per_token, mask = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1, 0], [1, 1]])
    _close(aggregate_token_loss(per_token, mask), 8.0 / 3.0)  # (1 + 3 + 4)/3 own count
    _close(aggregate_token_loss(per_token, mask, num_tokens=4), 2.0)  # (1 + 3 + 4)/4
    with pytest.raises(ValueError, match=r"num_tokens must be > 0: got 0"):
        aggregate_token_loss(per_token, mask, num_tokens=0)


def test_aggregate_sequence_loss_ignores_empty_sequences():
    per_token = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    mask = torch.tensor([[1, 0], [1, 1], [0, 0]])
    # sequence means [1, 3.5], the empty third row is not counted: (1 + 3.5)/2 = 2.25
    _close(aggregate_sequence_loss(per_token, mask), 2.25)


def test_ppo_loss_by_hand():
    loss, metrics = policy_loss(LOGPROBS, OLD_LOGPROBS, ADVANTAGES, FULL_MASK)
    _close(loss, (-1.2 - 0.5 + 1.1 + 0.8) / 4)  # 0.2/4 = 0.05
    assert metrics["clip_ratio"] == pytest.approx(0.5, abs=1e-6)  # t0 and t3
    # approx_kl = mean(old − new) = −(ln 1.5 + ln 0.5 + ln 1.1 + ln 0.7)/4
    assert metrics["approx_kl"] == pytest.approx(-math.log(1.5 * 0.5 * 1.1 * 0.7) / 4, abs=1e-6)
    assert all(isinstance(value, float) for value in metrics.values())


def test_ppo_loss_respects_the_mask():
    loss, metrics = policy_loss(LOGPROBS, OLD_LOGPROBS, ADVANTAGES, torch.tensor([[1, 1, 1, 0]]))
    _close(loss, (-1.2 - 0.5 + 1.1) / 3)  # −0.2
    assert metrics["clip_ratio"] == pytest.approx(1 / 3, abs=1e-6)


def test_ppo_gradient_is_zero_on_clipped_tokens():
    logprobs = LOGPROBS.clone().requires_grad_()
    loss, _ = policy_loss(logprobs, OLD_LOGPROBS, ADVANTAGES, FULL_MASK)
    loss.backward()
    # d(−ρA/4)/dlogπ = −ρA/4: t1 = −0.5/4 = −0.125, t2 = 1.1/4 = 0.275; t0 and t3 are clipped → 0
    _close(logprobs.grad, [[0.0, -0.125, 0.275, 0.0]])


def test_asymmetric_clip():
    # clip_low 0.1, clip_high 0.3: t0 clip(1.5) = 1.3 → −1.3; t3 clip(0.7) = 0.9 → −0.9 vs −0.7 → 0.9
    loss, _ = policy_loss(LOGPROBS, OLD_LOGPROBS, ADVANTAGES, FULL_MASK, clip_low=0.1, clip_high=0.3)
    _close(loss, (-1.3 - 0.5 + 1.1 + 0.9) / 4)  # 0.2/4 = 0.05


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    # ρ = [5, 2, 5], A = [−1, −1, 1], c = 3:
    #   t0: −min(−5, −1.2) = 5 → min(5, −c·A = 3) = 3 (dual-clipped)
    #   t1: −min(−2, −1.2) = 2 → min(2, 3) = 2
    #   t2: A > 0, −min(5, 1.2) = −1.2 unchanged
    logprobs, advantages, mask = _log([[5.0, 2.0, 5.0]]), torch.tensor([[-1.0, -1.0, 1.0]]), torch.ones(1, 3)
    loss, metrics = policy_loss(logprobs, torch.zeros(1, 3), advantages, mask, dual_clip=3.0)
    _close(loss, (3.0 + 2.0 - 1.2) / 3)
    assert metrics["dual_clip_ratio"] == pytest.approx(1 / 3, abs=1e-6)
    loss, metrics = policy_loss(logprobs, torch.zeros(1, 3), advantages, mask)
    _close(loss, (5.0 + 2.0 - 1.2) / 3)
    assert "dual_clip_ratio" not in metrics


def test_token_weights_multiply_the_per_token_loss_and_are_detached():
    # per-token [−1.2, −0.5, 1.1, 0.8]·[2, 0, 1, 0.5] = [−2.4, 0, 1.1, 0.4] → −0.9/4 = −0.225
    weights = torch.tensor([[2.0, 0.0, 1.0, 0.5]], requires_grad=True)
    logprobs = LOGPROBS.clone().requires_grad_()
    loss, _ = policy_loss(logprobs, OLD_LOGPROBS, ADVANTAGES, FULL_MASK, token_weights=weights)
    _close(loss, -0.225)
    loss.backward()
    assert weights.grad is None
    _close(logprobs.grad, [[0.0, 0.0, 0.275, 0.0]])  # t1 weighted by 0; t2 by 1: 1.1/4


def test_num_tokens_divides_by_the_global_count():
    loss, _ = policy_loss(LOGPROBS, OLD_LOGPROBS, ADVANTAGES, FULL_MASK, num_tokens=8)
    _close(loss, 0.2 / 8)


def test_micro_batch_losses_with_num_tokens_add_up_to_the_full_batch_loss():
    gen = torch.Generator().manual_seed(7)
    logprobs, old_logprobs = -torch.rand(6, 5, generator=gen), -torch.rand(6, 5, generator=gen)
    advantages = torch.randn(6, 5, generator=gen)
    mask = (torch.rand(6, 5, generator=gen) > 0.3).float()
    full, _ = policy_loss(logprobs, old_logprobs, advantages, mask)
    num_tokens = mask.sum().item()
    parts = [
        policy_loss(logprobs[s], old_logprobs[s], advantages[s], mask[s], num_tokens=num_tokens)[0]
        for s in (slice(0, 2), slice(2, 6))
    ]
    _close(parts[0] + parts[1], full)


def test_gspo_uses_a_sequence_ratio_and_sequence_aggregation():
    # row 0: log-ratios [ln 2, 0] → ρ_seq = exp(ln 2/2) = √2 ≈ 1.414, A = [1, 1] → clipped to 1.2 → −1.2 per token
    # row 1: only t0 unmasked (its t1 log-ratio 5.0 is ignored), ρ_seq = 0.9, A = −1 → −min(−0.9, −0.9) = 0.9
    # loss = mean over sequences of token means = (−1.2 + 0.9)/2 = −0.15
    logprobs = torch.tensor([[math.log(2.0), 0.0], [math.log(0.9), 5.0]])
    advantages, mask = torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), torch.tensor([[1, 1], [1, 0]])
    loss, metrics = policy_loss(logprobs, torch.zeros(2, 2), advantages, mask, loss_type="gspo")
    _close(loss, -0.15)
    assert metrics["clip_ratio"] == pytest.approx(2 / 3, abs=1e-6)
    # ppo on the same batch: ρ = [2, 1 | 0.9]: losses [−1.2, −1 | 0.9] → one token mean −1.3/3
    loss, _ = policy_loss(logprobs, torch.zeros(2, 2), advantages, mask, loss_type="ppo")
    _close(loss, -1.3 / 3)


def _reference_policy_loss(logprobs, old_logprobs, advantages, mask, clip, dual_clip, loss_type):
    B, T = logprobs.shape
    per_sequence, total, count = [], 0.0, 0
    for b in range(B):
        tokens = [t for t in range(T) if mask[b, t] > 0]
        log_ratios = [logprobs[b, t].item() - old_logprobs[b, t].item() for t in tokens]
        seq_losses = []
        for t, log_ratio in zip(tokens, log_ratios):
            if loss_type == "gspo":
                log_ratio = sum(log_ratios) / len(log_ratios)
            ratio = math.exp(min(max(log_ratio, -20.0), 20.0))
            a = advantages[b, t].item()
            loss = -min(ratio * a, min(max(ratio, 1 - clip), 1 + clip) * a)
            if dual_clip is not None and a < 0:
                loss = min(loss, -dual_clip * a)
            seq_losses.append(loss)
        total, count = total + sum(seq_losses), count + len(seq_losses)
        if seq_losses:
            per_sequence.append(sum(seq_losses) / len(seq_losses))
    return sum(per_sequence) / len(per_sequence) if loss_type == "gspo" else total / count


@pytest.mark.parametrize(("loss_type", "dual_clip"), [("ppo", None), ("ppo", 3.0), ("gspo", None), ("gspo", 2.0)])
def test_policy_loss_matches_a_reference_loop(loss_type, dual_clip):
    gen = torch.Generator().manual_seed(11)
    logprobs, old_logprobs = -torch.rand(5, 8, generator=gen) * 2, -torch.rand(5, 8, generator=gen) * 2
    advantages = torch.randn(5, 8, generator=gen)
    mask = (torch.arange(8).unsqueeze(0) < torch.tensor([[8], [3], [5], [1], [6]])).float()
    loss, _ = policy_loss(
        logprobs, old_logprobs, advantages, mask, clip_low=0.2, clip_high=0.2, dual_clip=dual_clip, loss_type=loss_type
    )
    expected = _reference_policy_loss(logprobs, old_logprobs, advantages, mask, 0.2, dual_clip, loss_type)
    _close(loss, expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_type": "cispo"}, r"loss_type must be one of \['gspo', 'ppo'\]: got 'cispo'"),
        ({"clip_low": -0.1}, r"clip_low must be in \[0, 1\]: got -0.1"),
        ({"clip_low": 1.5}, r"clip_low must be in \[0, 1\]: got 1.5"),
        ({"clip_high": -0.2}, r"clip_high must be >= 0: got -0.2"),
        ({"dual_clip": 1.0}, r"dual_clip must be > 1 or None: got 1.0"),
        ({"num_tokens": 0}, r"num_tokens must be > 0: got 0"),
        ({"num_tokens": 4, "loss_type": "gspo"}, r"num_tokens must be None with loss_type 'gspo'.*: got 4"),
        ({"token_weights": torch.ones(1, 3)}, r"token_weights must have the shape of logprobs: got \(1, 3\)"),
    ],
)
def test_policy_loss_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        policy_loss(LOGPROBS, OLD_LOGPROBS, ADVANTAGES, FULL_MASK, **kwargs)


@pytest.mark.parametrize("position", [1, 2, 3])
def test_policy_loss_rejects_tensors_of_another_shape(position):
    args = [LOGPROBS, OLD_LOGPROBS, ADVANTAGES, FULL_MASK]
    args[position] = torch.ones(1, 3)
    name = ["logprobs", "old_logprobs", "advantages", "mask"][position]
    with pytest.raises(ValueError, match=rf"{name} must have the shape of logprobs: got \(1, 3\) and \(1, 4\)"):
        policy_loss(*args)


# values [1, 2, 3], old values 1.5, returns 2, clip 0.2:
#   t0: V_clip = 1.5 + clip(−0.5) = 1.3 → (1.3 − 2)² = 0.49; (1 − 2)² = 1 → max 1
#   t1: V_clip = 1.5 + clip(0.5) = 1.7 → 0.09; (2 − 2)² = 0 → max 0.09 (clipped term wins)
#   t2: V_clip = 1.7 → 0.09; (3 − 2)² = 1 → max 1
VALUES, OLD_VALUES, RETURNS = torch.tensor([[1.0, 2.0, 3.0]]), torch.full((1, 3), 1.5), torch.full((1, 3), 2.0)


def test_value_loss_by_hand():
    loss, metrics = value_loss(VALUES, OLD_VALUES, RETURNS, torch.ones(1, 3), clip=0.2)
    _close(loss, 0.5 * (1.0 + 0.09 + 1.0) / 3)  # 0.3483333
    assert metrics["clip_ratio"] == pytest.approx(1 / 3, abs=1e-6)
    loss, _ = value_loss(VALUES, OLD_VALUES, RETURNS, torch.tensor([[1, 1, 0]]), clip=0.2)
    _close(loss, 0.5 * (1.0 + 0.09) / 2)  # 0.2725
    loss, metrics = value_loss(VALUES, OLD_VALUES, RETURNS, torch.ones(1, 3))
    _close(loss, 0.5 * (1.0 + 0.0 + 1.0) / 3)  # no clip: 0.5·(V − R)²
    assert metrics["clip_ratio"] == 0.0


@pytest.mark.parametrize("clip", [None, 0.3])
def test_value_loss_matches_a_reference_loop(clip):
    gen = torch.Generator().manual_seed(13)
    values, old_values, returns = (torch.randn(4, 6, generator=gen) for _ in range(3))
    mask = (torch.rand(4, 6, generator=gen) > 0.4).float()
    total, count = 0.0, 0
    for b in range(4):
        for t in range(6):
            if mask[b, t] > 0:
                v, v_old, r = values[b, t].item(), old_values[b, t].item(), returns[b, t].item()
                term = (v - r) ** 2
                if clip is not None:
                    v_clip = v_old + min(max(v - v_old, -clip), clip)
                    term = max(term, (v_clip - r) ** 2)
                total, count = total + 0.5 * term, count + 1
    _close(value_loss(values, old_values, returns, mask, clip=clip)[0], total / count)


def test_value_loss_rejects_bad_arguments():
    mask = torch.ones(1, 3)
    with pytest.raises(ValueError, match=r"clip must be > 0 or None: got 0"):
        value_loss(VALUES, OLD_VALUES, RETURNS, mask, clip=0)
    with pytest.raises(ValueError, match=r"returns must have the shape of values: got \(1, 2\) and \(1, 3\)"):
        value_loss(VALUES, OLD_VALUES, RETURNS[:, :2], mask)
    with pytest.raises(ValueError, match=r"old_values must have the shape of values: got \(3,\)"):
        value_loss(VALUES, OLD_VALUES[0], RETURNS, mask)
