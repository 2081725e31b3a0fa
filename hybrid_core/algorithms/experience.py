"""Composition of the RL maths for one step: sequence rewards → advantages/returns, and the actor's micro-batch loss.

Owns the order of operations of the OpenRLHF-compatible pipeline (group baseline → clip → per-token reward with the
KL-in-reward term → returns → whitening; PPO/GSPO loss + KL-as-loss) on tensors and scalars only.
It knows nothing about config objects, datasets, DeepSpeed or vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hybrid_core.algorithms.advantages import (GROUP_ESTIMATORS, WHITENED_ESTIMATORS, compute_returns,
                                               place_sequence_rewards, shape_group_rewards, whiten)
from hybrid_core.algorithms.kl import kl_penalty
from hybrid_core.algorithms.losses import aggregate_token_loss, masked_mean, policy_loss


@dataclass(frozen=True)
class AdvantageSettings:
    estimator: str
    n_samples_per_prompt: int
    gamma: float = 1.0
    no_std_norm: bool = False
    kl_coef: float = 0.0
    kl_estimator: str = "k1"
    kl_use_loss: bool = False
    reward_clip: tuple[float, float] = (-10.0, 10.0)


@dataclass(frozen=True)
class Advantages:
    advantages: Tensor  # (B, T)
    returns: Tensor     # (B, T)
    kl: Tensor          # (B, T) per-token KL(old ‖ ref) by the configured estimator, 0 without a reference


def compute_advantages(rewards: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, mask: Tensor,
                       s: AdvantageSettings) -> Advantages:
    """Advantages for the critic-free estimators (OpenRLHF `experience_maker`, steps 2–4 of inventory §3).

    Args:
        rewards: (B,) sequence rewards, prompt-major groups of `n_samples_per_prompt`.
        old_logprobs, ref_logprobs: (B, T) actor (at experience time) and reference logprobs; ref may be None.
        mask: (B, T) 0/1 response mask.
    """
    shaped = shape_group_rewards(rewards.float(), s.n_samples_per_prompt, s.estimator)
    shaped = shaped.clamp(*s.reward_clip)
    token_rewards = place_sequence_rewards(shaped, mask)
    kl = torch.zeros_like(old_logprobs) if ref_logprobs is None else \
        kl_penalty(old_logprobs, ref_logprobs, s.kl_estimator) * mask
    if not s.kl_use_loss:
        token_rewards = token_rewards - s.kl_coef * kl
    gamma = 1.0 if s.estimator in GROUP_ESTIMATORS else s.gamma  # OpenRLHF forces γ = 1 for group baselines
    returns = compute_returns(token_rewards, mask, gamma)
    advantages = returns
    if s.estimator in WHITENED_ESTIMATORS:
        advantages = whiten(returns, mask, scale_std=not s.no_std_norm)
    return Advantages(advantages * mask, returns * mask, kl)


@dataclass(frozen=True)
class ActorLossSettings:
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    loss_type: str = "ppo"
    kl_coef: float = 0.0
    kl_estimator: str = "k1"
    kl_use_loss: bool = False


def actor_objective(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor,
                    mask: Tensor, s: ActorLossSettings, num_tokens: float, sequence_share: float) -> tuple[Tensor, dict]:
    """The loss of one micro-batch, normalised so that micro-batches add up to the optimizer step's loss.

    PPO: one token mean over the step (`num_tokens` = response tokens of the whole optimizer step). GSPO: mean over
    the step's sequences, so the micro-batch's sequence mean is weighted by `sequence_share` = B_micro / B_step.
    KL-as-loss (k1/k2/k3 of π_θ vs π_ref) is aggregated the same way and added with weight β.
    """
    if s.loss_type == "gspo":
        loss, stats = policy_loss(logprobs, old_logprobs, advantages, mask, clip_low=s.clip_low,
                                  clip_high=s.clip_high, dual_clip=s.dual_clip, loss_type="gspo")
        loss = loss * sequence_share
    else:
        loss, stats = policy_loss(logprobs, old_logprobs, advantages, mask, clip_low=s.clip_low,
                                  clip_high=s.clip_high, dual_clip=s.dual_clip, num_tokens=num_tokens)
    stats["policy_loss"] = loss.item()
    if s.kl_use_loss and ref_logprobs is not None and s.kl_coef > 0:
        kl = kl_penalty(logprobs, ref_logprobs, s.kl_estimator)
        kl_loss = aggregate_token_loss(kl, mask, num_tokens)
        loss = loss + s.kl_coef * kl_loss
        stats["kl_loss"] = kl_loss.item()
        stats["kl"] = masked_mean(kl.detach(), mask).item()
    return loss, stats
