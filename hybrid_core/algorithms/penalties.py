"""Length-based reward penalties: DAPO's soft overlong penalty and ProRL's stop-properly penalty.

Owns the adjustments applied to scalar rewards before any group baseline. It does not know how rewards were
computed or how truncation was detected: lengths, flags and scalars in, (B,) tensors out.
"""

import torch
from torch import Tensor


def overlong_penalty(response_lengths: Tensor, max_new_tokens: int, buffer_len: int, factor: float) -> Tensor:
    """Soft overlong punishment (DAPO, Yu et al. 2025, eq. 13), an additive term for the reward.

    With E = max_new_tokens − buffer_len: −min(len − E, buffer_len)/buffer_len·factor where len > E, else 0.

    Args:
        response_lengths: (B,) integer tensor of response lengths in tokens.
        max_new_tokens: the generation limit; ≥ buffer_len.
        buffer_len: L_buf > 0, the length of the penalty ramp.
        factor: the penalty at (and beyond) max_new_tokens, ≥ 0.

    Returns:
        (B,) float32 penalties, ≤ 0.
    """
    if response_lengths.dim() != 1 or response_lengths.is_floating_point() or response_lengths.is_complex():
        raise ValueError(
            f"response_lengths must be a 1-D integer tensor: got shape {tuple(response_lengths.shape)} "
            f"and dtype {response_lengths.dtype}"
        )
    if not buffer_len > 0:
        raise ValueError(f"buffer_len must be > 0: got {buffer_len!r}")
    if not max_new_tokens >= buffer_len:
        raise ValueError(f"max_new_tokens must be >= buffer_len: got {max_new_tokens!r} and {buffer_len!r}")
    if not factor >= 0:
        raise ValueError(f"factor must be >= 0: got {factor!r}")
    expected_len = max_new_tokens - buffer_len
    excess = (response_lengths - expected_len).clamp(min=0, max=buffer_len).float()
    return -excess / buffer_len * factor


def stop_penalty(rewards: Tensor, truncated: Tensor, coef: float) -> Tensor:
    """Stop-properly penalty (ProRL, Liu et al. 2025) for responses cut off at the length limit.

    Truncated samples get r·coef when 0 ≤ coef ≤ 1, or the constant coef when coef < 0; the others keep r.

    Args:
        rewards: (B,) float32 rewards.
        truncated: (B,) bool, True where generation stopped on the length limit.
        coef: the penalty coefficient, ≤ 1.

    Returns:
        (B,) float32 rewards (a new tensor).
    """
    if truncated.dtype != torch.bool or truncated.shape != rewards.shape:
        raise ValueError(
            f"truncated must be a bool tensor of the shape of rewards: got {truncated.dtype} "
            f"{tuple(truncated.shape)} and {tuple(rewards.shape)}"
        )
    if not coef <= 1:
        raise ValueError(f"coef must be <= 1 (a scale in [0, 1] or a negative constant): got {coef!r}")
    rewards = rewards.float()
    penalised = rewards * coef if coef >= 0 else torch.full_like(rewards, coef)
    return torch.where(truncated, penalised, rewards)
