"""Unit tests for hybrid_core.algorithms.experience: rewards → advantages/returns, and the actor micro-batch loss."""

import pytest
import torch

from hybrid_core.algorithms.experience import (ActorLossSettings, AdvantageSettings, PolicyMicroBatch,
                                                actor_objective,
                                               compute_advantages)


def _close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32), rtol=0, atol=atol)


# two prompts, n = 2, response lengths 2, 3, 1, 2 (8 tokens)
REWARDS = torch.tensor([1.0, 0.0, 0.5, 0.5])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
ZEROS = torch.zeros(4, 3)
SQRT39 = 6.2449979984


def test_reinforce_baseline_subtracts_the_group_mean_then_whitens_token_weighted():
    s = AdvantageSettings(estimator="reinforce_baseline", n_samples_per_prompt=2, kl_coef=0.0)
    out = compute_advantages(REWARDS, ZEROS, None, MASK, s)
    # group means .5 and .5 → shaped [.5, −.5, 0, 0]; γ = 1 so every token's return is its sequence's reward
    _close(out.returns, [[0.5, 0.5, 0], [-0.5, -0.5, -0.5], [0, 0, 0], [0, 0, 0]])
    # token mean: (2·.5 − 3·.5) / 8 = −.0625; deviations .5625 (×2), −.4375 (×3), .0625 (×3)
    # var = (2·.31640625 + 3·.19140625 + 3·.00390625) / 8 = 1.21875 / 8 = 39/256, std = √39 / 16
    # advantages: .5625·16/√39 = 9/√39 = 1.4411533842; −7/√39 = −1.1208970766; 1/√39 = 0.1601281538
    a, b, c = 9 / SQRT39, -7 / SQRT39, 1 / SQRT39
    _close(out.advantages, [[a, a, 0], [b, b, b], [c, 0, 0], [c, c, 0]])
    _close(out.kl, ZEROS)  # no reference model: no KL


def test_reinforce_baseline_without_std_norm_only_centres():
    s = AdvantageSettings(estimator="reinforce_baseline", n_samples_per_prompt=2, kl_coef=0.0, no_std_norm=True)
    out = compute_advantages(REWARDS, ZEROS, None, MASK, s)
    # returns − (−.0625) on the response tokens
    _close(out.advantages, [[0.5625, 0.5625, 0], [-0.4375] * 3, [0.0625, 0, 0], [0.0625, 0.0625, 0]])


def test_group_norm_is_not_whitened():
    s = AdvantageSettings(estimator="group_norm", n_samples_per_prompt=2, kl_coef=0.0)
    out = compute_advantages(REWARDS, ZEROS, None, MASK, s)
    # group [1, 0]: mean .5, unbiased std √.5 → ±.5/(√.5 + 1e-9) = ±0.7071067802; group [.5, .5]: 0/(0 + 1e-9) = 0
    r = 0.7071067802
    _close(out.advantages, [[r, r, 0], [-r, -r, -r], [0, 0, 0], [0, 0, 0]])
    _close(out.returns, out.advantages)


# rloo, n = 2: rewards [1, 0] → shaped r_i − r_other = [1, −1]; not whitened, so advantages = returns
OLD = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, -1.5]])
REF = torch.tensor([[-1.5, -1.5, 0.0], [-0.5, -2.0, -1.0]])
MASK2 = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
KL_K1 = [[0.5, -0.5, 0.0], [0.0, 1.0, -0.5]]  # old − ref, masked (row 0's −3 falls outside the mask)


def test_kl_in_reward_is_subtracted_per_token():
    s = AdvantageSettings(estimator="rloo", n_samples_per_prompt=2, kl_coef=0.1, kl_estimator="k1")
    out = compute_advantages(torch.tensor([1.0, 0.0]), OLD, REF, MASK2, s)
    _close(out.kl, KL_K1)
    # token rewards = placed − .1·kl: row 0 [−.05, 1 + .05, 0]; row 1 [0, −.1, −1 + .05]
    # reward-to-go: row 0 [1.0, 1.05, 0]; row 1 [−1.05, −1.05, −.95]
    _close(out.returns, [[1.0, 1.05, 0.0], [-1.05, -1.05, -0.95]])
    _close(out.advantages, out.returns)


def test_kl_as_loss_leaves_the_rewards_alone():
    s = AdvantageSettings(estimator="rloo", n_samples_per_prompt=2, kl_coef=0.1, kl_estimator="k1", kl_use_loss=True)
    out = compute_advantages(torch.tensor([1.0, 0.0]), OLD, REF, MASK2, s)
    _close(out.kl, KL_K1)  # still reported
    _close(out.returns, [[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])


def test_k3_kl_in_reward():
    s = AdvantageSettings(estimator="rloo", n_samples_per_prompt=2, kl_coef=1.0, kl_estimator="k3")
    out = compute_advantages(torch.tensor([0.0, 0.0]), OLD, REF, MASK2, s)
    # k3(x) = e^−x − 1 + x: k3(.5) = 0.1065306597, k3(−.5) = 0.1487212707, k3(0) = 0, k3(1) = 0.3678794412,
    # k3(−.5) = 0.1487212707; shaped rewards are 0, so returns = −Σ_{k≥t} k3
    _close(out.kl, [[0.1065306597, 0.1487212707, 0.0], [0.0, 0.3678794412, 0.1487212707]])
    _close(out.returns, [[-0.2552519304, -0.1487212707, 0.0], [-0.5166007119, -0.5166007119, -0.1487212707]])


@pytest.mark.parametrize("clip, expected", [((-10.0, 10.0), [10.0, -10.0]), ((-1.0, 2.0), [2.0, -1.0])])
def test_reward_clip_applies_to_the_shaped_rewards(clip, expected):
    # rloo [30, 0] → [30, −30] → clipped
    s = AdvantageSettings(estimator="rloo", n_samples_per_prompt=2, kl_coef=0.0, reward_clip=clip)
    out = compute_advantages(torch.tensor([30.0, 0.0]), torch.zeros(2, 1), None, torch.ones(2, 1), s)
    _close(out.advantages, [[expected[0]], [expected[1]]])


def test_gamma_is_forced_to_one_for_group_estimators_only():
    mask = torch.ones(2, 3)
    group = compute_advantages(torch.tensor([1.0, 0.0]), torch.zeros(2, 3), None, mask,
                               AdvantageSettings(estimator="rloo", n_samples_per_prompt=2, kl_coef=0.0, gamma=0.5))
    _close(group.returns, [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    plain = compute_advantages(torch.tensor([1.0]), torch.zeros(1, 3), None, torch.ones(1, 3),
                               AdvantageSettings(estimator="reinforce", n_samples_per_prompt=1, kl_coef=0.0, gamma=0.5))
    # G = [.25, .5, 1]: mean 1.75/3 = .5833333333; whitened values then sum to 0
    _close(plain.returns, [[0.25, 0.5, 1.0]])
    _close(plain.advantages.sum(), 0.0)


# actor loss: logprobs = old → ratio 1, so the PPO token loss is −A on the mask (5 tokens)
LOGPROBS = OLD.clone()
ADV = torch.tensor([[1.0, 2.0, 9.0], [-1.0, 0.5, -0.5]])  # the 9 lies outside the mask


def test_actor_objective_policy_loss_only():
    batch = PolicyMicroBatch(LOGPROBS, OLD, ADV, MASK2, REF)
    loss, stats = actor_objective(batch, ActorLossSettings(kl_coef=0.2), 5.0, 1.0)
    # −(1 + 2 − 1 + .5 − .5) / 5 = −0.4; KL not added without kl_use_loss
    _close(loss, -0.4)
    assert stats["policy_loss"] == pytest.approx(-0.4, abs=1e-6) and "kl_loss" not in stats


def test_actor_objective_adds_the_token_mean_kl_with_kl_use_loss():
    s = ActorLossSettings(kl_coef=0.2, kl_estimator="k1", kl_use_loss=True)
    loss, stats = actor_objective(PolicyMicroBatch(LOGPROBS, OLD, ADV, MASK2, REF), s, 5.0, 1.0)
    # k1 on the mask: .5 − .5 + 0 + 1 − .5 = .5 → .5 / 5 = .1; loss = −0.4 + 0.2·0.1 = −0.38
    _close(loss, -0.38)
    assert stats["policy_loss"] == pytest.approx(-0.4, abs=1e-6)
    assert stats["kl_loss"] == pytest.approx(0.1, abs=1e-6) and stats["kl"] == pytest.approx(0.1, abs=1e-6)
    no_ref, _ = actor_objective(PolicyMicroBatch(LOGPROBS, OLD, ADV, MASK2, None), s, 5.0, 1.0)
    _close(no_ref, -0.4)  # no reference model: nothing to add


def test_ppo_micro_batches_add_up_to_the_step_loss():
    s = ActorLossSettings(kl_coef=0.2, kl_estimator="k1", kl_use_loss=True)
    row0, _ = actor_objective(PolicyMicroBatch(LOGPROBS[:1], OLD[:1], ADV[:1], MASK2[:1], REF[:1]), s, 5.0, 0.5)
    row1, _ = actor_objective(PolicyMicroBatch(LOGPROBS[1:], OLD[1:], ADV[1:], MASK2[1:], REF[1:]), s, 5.0, 0.5)
    # row 0: −(1 + 2)/5 + .2·(.5 − .5)/5 = −0.6; row 1: −(−1 + .5 − .5)/5 + .2·(1 − .5)/5 = 0.2 + 0.02 = 0.22
    _close(row0, -0.6)
    _close(row1, 0.22)
    _close(row0 + row1, -0.38)


def test_micro_batches_add_up_with_random_ratios_and_clipping():
    g = torch.Generator().manual_seed(0)
    logprobs, old, ref = (-torch.rand(6, 5, generator=g) * 2 for _ in range(3))
    adv = torch.randn(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    for s in (ActorLossSettings(kl_coef=0.1, kl_estimator="k3", kl_use_loss=True, dual_clip=3.0),
              ActorLossSettings(kl_coef=0.0, loss_type="gspo", clip_low=3e-4, clip_high=4e-4)):
        n = float(mask.sum())
        full, _ = actor_objective(PolicyMicroBatch(logprobs, old, adv, mask, ref), s, n, 1.0)
        shares = [PolicyMicroBatch(logprobs[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], ref[i:i + 2])
                  for i in (0, 2, 4)]
        parts = [actor_objective(share, s, n, 2 / 6)[0] for share in shares]
        _close(sum(parts), full.item())


def test_gspo_weights_the_micro_batch_by_its_sequence_share():
    s = ActorLossSettings(kl_coef=0.0, loss_type="gspo")
    full, _ = actor_objective(PolicyMicroBatch(LOGPROBS, OLD, ADV, MASK2, None), s, 5.0, 1.0)
    # ratio 1: per-sequence token means −(1 + 2)/2 = −1.5 and −(−1 + .5 − .5)/3 = 1/3; mean (−1.5 + 1/3)/2
    _close(full, -0.5833333333)
    half, _ = actor_objective(PolicyMicroBatch(LOGPROBS[:1], OLD[:1], ADV[:1], MASK2[:1], None), s, 5.0, 0.5)
    _close(half, -0.75)  # −1.5 · 1/2
