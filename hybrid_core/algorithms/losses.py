"""Training losses: the clipped policy loss (PPO, dual clip, GSPO), the clipped value loss, aggregation.

Owns the per-token loss maths and how per-token terms are reduced to one scalar (a token mean, global across
micro-batches through `num_tokens`, or a mean over sequences). It does not know about models, optimisers, data
parallelism or configs: callers pass log-probabilities, advantages, masks and scalars.
"""

import torch
from torch import Tensor

LOSS_TYPES = frozenset({"ppo", "gspo"})
_LOG_RATIO_CLAMP = 20.0


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over the positions where `mask` is 1; 0 where there are none.

    Args:
        x: (...) float32.
        mask: 0/1 of the shape of `x`.
        dim: the dimension to reduce; None reduces everything to a scalar.

    Returns:
        float32 tensor: a scalar, or `x` with `dim` removed.
    """
    _check_shape(x, mask, "x")
    m = mask.float()
    if dim is None:
        return (x.float() * m).sum() / m.sum().clamp(min=1.0)
    return (x.float() * m).sum(dim=dim) / m.sum(dim=dim).clamp(min=1.0)


def aggregate_token_loss(per_token: Tensor, mask: Tensor, num_tokens: float | None = None) -> Tensor:
    """Token-level aggregation: Σ(loss·mask) / N (OpenRLHF `aggregate_loss`, token mode).

    N is this call's unmasked-token count, or `num_tokens` when given: pass the token count of the whole optimizer
    step (all micro-batches and ranks) so that the micro-batch losses add up to one global token mean.

    Args:
        per_token: (B, T) float32 per-token loss.
        mask: (B, T) 0/1 response mask.
        num_tokens: N > 0, or None for this call's own count.

    Returns:
        Scalar float32 loss.
    """
    _check_shape(per_token, mask, "per_token")
    if num_tokens is None:
        return masked_mean(per_token, mask)
    if not num_tokens > 0:
        raise ValueError(f"num_tokens must be > 0: got {num_tokens!r}")
    return (per_token.float() * mask.float()).sum() / num_tokens


def aggregate_sequence_loss(per_token: Tensor, mask: Tensor) -> Tensor:
    """Sequence-level aggregation: the mean over non-empty sequences of each sequence's token mean (GSPO).

    Args:
        per_token: (B, T) float32 per-token loss.
        mask: (B, T) 0/1 response mask.

    Returns:
        Scalar float32 loss; 0 when every sequence is empty.
    """
    _check_shape(per_token, mask, "per_token")
    per_sequence = masked_mean(per_token, mask, dim=-1)  # (B,)
    is_nonempty = (mask.sum(dim=-1) > 0).float()
    return masked_mean(per_sequence, is_nonempty)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    loss_type: str = "ppo",
    token_weights: Tensor | None = None,
    num_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate policy loss.

    PPO (Schulman et al. 2017, eq. 7) with asymmetric clip (DAPO, Yu et al. 2025):
    ρ = exp(clamp(log π_θ − log π_old, ±20)), L_t = −min(ρ·A, clip(ρ, 1 − clip_low, 1 + clip_high)·A).
    Dual clip (Ye et al. 2020, eq. 5), c > 1: for A < 0, L_t = min(L_t, −c·A).
    GSPO (Zheng et al. 2025, eq. 7): ρ is per sequence, exp(masked mean of the log-ratio), broadcast to its tokens,
    and the loss is the mean over sequences of per-sequence token means. PPO is one token mean over all unmasked
    tokens, divided by `num_tokens` when given (see `aggregate_token_loss`).

    Args:
        logprobs: (B, T) float32 log π_θ of the sampled tokens (carries the gradient).
        old_logprobs: (B, T) float32 log π_old at experience time.
        advantages: (B, T) float32.
        mask: (B, T) 0/1 response mask.
        clip_low, clip_high: ε_low in [0, 1] and ε_high ≥ 0 of the ratio clip.
        dual_clip: c > 1, or None for no dual clip.
        loss_type: "ppo" or "gspo".
        token_weights: (B, T) float32 weights (e.g. IS-correction), detached, multiplying the per-token loss.
        num_tokens: the global token count for "ppo"; not accepted with "gspo", which averages over sequences.

    Returns:
        The scalar loss and float metrics: `clip_ratio` (fraction of unmasked tokens whose ratio was clipped),
        `approx_kl` (token mean of log π_old − log π_θ), and `dual_clip_ratio` when dual clip is on.
    """
    _check_policy_args(clip_low, clip_high, dual_clip, loss_type, num_tokens)
    for name, tensor in (("old_logprobs", old_logprobs), ("advantages", advantages), ("mask", mask)):
        _check_shape(tensor, logprobs, name, "logprobs")
    log_ratio = logprobs.float() - old_logprobs.float()
    if loss_type == "gspo":
        log_ratio = masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1).expand_as(log_ratio)
    ratio = log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()
    advantages = advantages.float()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - clip_low, 1 + clip_high) * advantages
    loss = -torch.min(surr1, surr2)
    metrics = {"clip_ratio": masked_mean((surr2 < surr1).float(), mask).item()}
    if dual_clip is not None:
        is_dual_clipped = (advantages < 0) & (loss > -dual_clip * advantages)
        loss = torch.where(advantages < 0, torch.min(loss, -dual_clip * advantages), loss)
        metrics["dual_clip_ratio"] = masked_mean(is_dual_clipped.float(), mask).item()
    if token_weights is not None:
        _check_shape(token_weights, logprobs, "token_weights", "logprobs")
        loss = loss * token_weights.detach().float()
    metrics["approx_kl"] = masked_mean(-(logprobs - old_logprobs).detach(), mask).item()
    if loss_type == "gspo":
        return aggregate_sequence_loss(loss, mask), metrics
    return aggregate_token_loss(loss, mask, num_tokens), metrics


def _check_policy_args(
    clip_low: float, clip_high: float, dual_clip: float | None, loss_type: str, num_tokens: float | None
) -> None:
    if not 0.0 <= clip_low <= 1.0:
        raise ValueError(f"clip_low must be in [0, 1]: got {clip_low!r}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0: got {clip_high!r}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 or None: got {dual_clip!r}")
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {sorted(LOSS_TYPES)}: got {loss_type!r}")
    if loss_type == "gspo" and num_tokens is not None:
        raise ValueError(
            f"num_tokens must be None with loss_type 'gspo' (it averages over sequences): got {num_tokens!r}"
        )


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip: float | None = None
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss (PPO2 baselines; OpenRLHF `ValueLoss`), a token mean over unmasked tokens.

    With clip: 0.5·max((V_clip − R)², (V − R)²), V_clip = V_old + clip(V − V_old, −clip, clip).
    Without: 0.5·(V − R)².

    Args:
        values: (B, T) float32 current critic values (carry the gradient).
        old_values: (B, T) float32 critic values at experience time.
        returns: (B, T) float32 targets R.
        mask: (B, T) 0/1 response mask.
        clip: value clip > 0, or None.

    Returns:
        The scalar loss and float metrics: `clip_ratio` (fraction of unmasked tokens where the clipped term is the
        larger one; 0 without clip).
    """
    if clip is not None and not clip > 0:
        raise ValueError(f"clip must be > 0 or None: got {clip!r}")
    for name, tensor in (("old_values", old_values), ("returns", returns), ("mask", mask)):
        _check_shape(tensor, values, name, "values")
    values, returns = values.float(), returns.float()
    unclipped = (values - returns).square()
    if clip is None:
        return 0.5 * masked_mean(unclipped, mask), {"clip_ratio": 0.0}
    old_values = old_values.float()
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    clipped = (clipped_values - returns).square()
    loss = 0.5 * masked_mean(torch.max(clipped, unclipped), mask)
    return loss, {"clip_ratio": masked_mean((clipped > unclipped).float(), mask).item()}


def _check_shape(tensor: Tensor, like: Tensor, name: str, like_name: str = "mask") -> None:
    if tensor.shape != like.shape:
        raise ValueError(
            f"{name} must have the shape of {like_name}: got {tuple(tensor.shape)} and {tuple(like.shape)}"
        )
