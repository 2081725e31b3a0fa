"""Composition of the RL maths for one step: sequence rewards → advantages/returns, and the actor's micro-batch loss.

Owns the order of operations of the OpenRLHF-compatible pipeline (inventory §3): length penalties → group baseline →
clip → per-token reward with the KL-in-reward term → GAE or returns → whitening; PPO/GSPO loss with IS-correction
weights, KL-as-loss and the entropy bonus. Tensors and scalars only: no config objects, datasets or engines.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hybrid_core.algorithms.advantages import (GROUP_ESTIMATORS, WHITENED_ESTIMATORS, compute_gae, compute_returns,
                                               place_sequence_rewards, shape_group_rewards, whiten)
from hybrid_core.algorithms.kl import kl_penalty
from hybrid_core.algorithms.losses import aggregate_token_loss, masked_mean, policy_loss
from hybrid_core.algorithms.penalties import overlong_penalty, stop_penalty


@dataclass(frozen=True, kw_only=True)
class AdvantageSettings:
    estimator: str
    n_samples_per_prompt: int
    kl_coef: float  # the KL controller's coefficient at the step (algo.kl.init_coef at first)
    gamma: float = 1.0
    lambd: float = 1.0
    no_std_norm: bool = False
    kl_estimator: str = "k1"
    kl_use_loss: bool = False
    reward_clip: tuple[float, float] = (-10.0, 10.0)


@dataclass(frozen=True, kw_only=True)
class PenaltySettings:
    max_new_tokens: int
    overlong_buffer_len: int | None = None
    overlong_penalty_factor: float = 1.0
    stop_properly_penalty_coef: float | None = None


def apply_length_penalties(rewards: Tensor, response_lengths: Tensor, truncated: Tensor,
                           s: PenaltySettings) -> Tensor:
    """DAPO's overlong penalty (additive) then ProRL's stop-properly penalty, on (B,) sequence rewards."""
    if s.overlong_buffer_len:
        rewards = rewards + overlong_penalty(response_lengths, s.max_new_tokens, s.overlong_buffer_len,
                                             s.overlong_penalty_factor)
    if s.stop_properly_penalty_coef is not None:
        rewards = stop_penalty(rewards, truncated, s.stop_properly_penalty_coef)
    return rewards


@dataclass(frozen=True)
class Advantages:
    advantages: Tensor  # (B, T)
    returns: Tensor     # (B, T)
    kl: Tensor          # (B, T) per-token KL(old ‖ ref) by the configured estimator, 0 without a reference


def reads_old_logprobs(has_reference: bool, kl_use_loss: bool) -> bool:
    """Whether advantages depend on the actor's old logprobs: only through the KL-in-reward term (a reference
    model, KL not a loss). Otherwise an exactly on-policy update can take them from its own forward."""
    return has_reference and not kl_use_loss


def compute_advantages(rewards: Tensor, old_logprobs: Tensor | None, ref_logprobs: Tensor | None, mask: Tensor,
                       s: AdvantageSettings, values: Tensor | None = None) -> Advantages:
    """Advantages and returns of a step (OpenRLHF `experience_maker`, steps 2–4 of inventory §3).

    Args:
        rewards: (B,) sequence rewards after length penalties, prompt-major groups of `n_samples_per_prompt`.
        old_logprobs, ref_logprobs: (B, T) actor (at experience time) and reference logprobs; ref may be None, and
            old may be None when `reads_old_logprobs` is false (then `kl` is zero).
        mask: (B, T) 0/1 response mask.
        values: (B, T) critic values, required by `gae`.
    """
    shaped = shape_group_rewards(rewards.float(), s.n_samples_per_prompt, s.estimator).clamp(*s.reward_clip)
    token_rewards = place_sequence_rewards(shaped, mask)
    if reads_old_logprobs(ref_logprobs is not None, s.kl_use_loss) and old_logprobs is None:
        raise ValueError("the KL-in-reward term needs the actor's old logprobs: got None")
    kl = torch.zeros_like(mask) if ref_logprobs is None or old_logprobs is None else \
        kl_penalty(old_logprobs, ref_logprobs, s.kl_estimator) * mask
    if not s.kl_use_loss:
        token_rewards = token_rewards - s.kl_coef * kl
    if s.estimator == "gae":
        if values is None:
            raise ValueError("values are required by estimator 'gae': got None; run a critic")
        advantages, returns = compute_gae(token_rewards, values, mask, s.gamma, s.lambd)
    else:
        gamma = 1.0 if s.estimator in GROUP_ESTIMATORS else s.gamma  # OpenRLHF forces γ = 1 for group baselines
        returns = advantages = compute_returns(token_rewards, mask, gamma)
    if s.estimator in WHITENED_ESTIMATORS:
        advantages = whiten(advantages, mask, scale_std=not s.no_std_norm)
    return Advantages(advantages * mask, returns * mask, kl)


def sequence_mean_kl(kl: Tensor, mask: Tensor) -> float:
    """The step's KL for the adaptive controller: the mean over sequences of each sequence's token-mean KL."""
    per_sequence = masked_mean(kl, mask, dim=-1)
    return float(per_sequence.mean()) if per_sequence.numel() else 0.0


@dataclass(frozen=True, kw_only=True)
class ActorLossSettings:
    kl_coef: float  # the KL controller's coefficient at the step (algo.kl.init_coef at first)
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    loss_type: str = "ppo"
    kl_estimator: str = "k1"
    kl_use_loss: bool = False
    entropy_coef: float | None = None


@dataclass
class PolicyMicroBatch:
    """One micro-batch's tensors, all (B, T); `logprobs` and `entropy` carry the gradient."""

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    ref_logprobs: Tensor | None = None
    entropy: Tensor | None = None
    token_weights: Tensor | None = None  # IS-correction weights, detached


def actor_objective(mb: PolicyMicroBatch, s: ActorLossSettings, num_tokens: float,
                    sequence_share: float) -> tuple[Tensor, dict]:
    """The loss of one micro-batch, normalised so that micro-batches add up to the optimizer step's loss.

    PPO: one token mean over the step (`num_tokens` = response tokens of the whole optimizer step). GSPO: mean over
    the step's sequences, so the micro-batch's sequence mean is weighted by `sequence_share` = B_micro / B_step.
    KL-as-loss (k1/k2/k3 of π_θ vs π_ref) and the entropy bonus are token means of the step, like PPO.
    """
    common = dict(clip_low=s.clip_low, clip_high=s.clip_high, dual_clip=s.dual_clip, token_weights=mb.token_weights)
    if s.loss_type == "gspo":
        loss, stats = policy_loss(mb.logprobs, mb.old_logprobs, mb.advantages, mb.mask, loss_type="gspo", **common)
        loss = loss * sequence_share
    else:
        loss, stats = policy_loss(mb.logprobs, mb.old_logprobs, mb.advantages, mb.mask, num_tokens=num_tokens,
                                  **common)
    stats["policy_loss"] = loss.item()
    if s.kl_use_loss and mb.ref_logprobs is not None and s.kl_coef > 0:
        kl = kl_penalty(mb.logprobs, mb.ref_logprobs, s.kl_estimator)
        kl_loss = aggregate_token_loss(kl, mb.mask, num_tokens)
        loss = loss + s.kl_coef * kl_loss
        stats["kl_loss"] = kl_loss.item()
        stats["kl"] = masked_mean(kl.detach(), mb.mask).item()
    if s.entropy_coef is not None and mb.entropy is not None:
        stats["entropy"] = masked_mean(mb.entropy.detach(), mb.mask).item()
        if s.entropy_coef > 0:
            loss = loss - s.entropy_coef * aggregate_token_loss(mb.entropy, mb.mask, num_tokens)
    if mb.token_weights is not None:
        stats["is_weight_mean"] = masked_mean(mb.token_weights, mb.mask).item()
        stats["is_masked_frac"] = masked_mean((mb.token_weights == 0).float(), mb.mask).item()
    return loss, stats
