"""Advantage estimation: group baselines on scalar rewards, per-token reward placement, GAE, returns, whitening.

Owns the maths that turns per-sample rewards into per-token advantages for every estimator of the CLI
(gae, reinforce, reinforce_baseline, rloo, group_norm, dr_grpo). It does not know where rewards come from, how
the KL penalty is weighted or which estimator the run uses: callers pass tensors, scalars and the estimator name.
"""

import torch
from torch import Tensor

GROUP_ESTIMATORS = frozenset({"rloo", "reinforce_baseline", "group_norm", "dr_grpo"})
ESTIMATORS = GROUP_ESTIMATORS | {"gae", "reinforce"}
# Only these are whitened over the batch; the group estimators are already centred (and group_norm scaled) per prompt.
WHITENED_ESTIMATORS = frozenset({"gae", "reinforce", "reinforce_baseline"})
_VAR_FLOOR = 1e-8


def shape_group_rewards(rewards: Tensor, n_samples_per_prompt: int, estimator: str) -> Tensor:
    """Subtract the group baseline of each prompt's n samples from their scalar rewards.

    rloo (Ahmadian et al. 2024): r_i − (Σ_j r_j − r_i)/(n−1); reinforce_baseline and dr_grpo (Liu et al. 2025):
    r_i − mean(group); group_norm (GRPO, Shao et al. 2024): (r_i − mean)/(std + 1e-9), unbiased std;
    gae and reinforce: unchanged.

    Args:
        rewards: (B,) float32, prompt-major: the n samples of one prompt are contiguous.
        n_samples_per_prompt: n, the group size; must divide B, and be ≥ 2 for the group estimators.
        estimator: one of `ESTIMATORS`.

    Returns:
        (B,) float32 shaped rewards (a new tensor).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(ESTIMATORS)}: got {estimator!r}")
    groups = _as_groups(rewards, n_samples_per_prompt, "rewards").float()
    n = n_samples_per_prompt
    if estimator in GROUP_ESTIMATORS and n < 2:
        raise ValueError(
            f"n_samples_per_prompt must be >= 2 for estimator {estimator!r}: got {n!r}; use gae or reinforce"
        )
    if estimator in ("gae", "reinforce"):
        shaped = groups.clone()
    elif estimator == "rloo":
        shaped = groups - (groups.sum(dim=1, keepdim=True) - groups) / (n - 1)
    elif estimator == "group_norm":
        shaped = (groups - groups.mean(dim=1, keepdim=True)) / (groups.std(dim=1, keepdim=True) + 1e-9)
    else:
        shaped = groups - groups.mean(dim=1, keepdim=True)
    return shaped.reshape(-1)


def _as_groups(values: Tensor, n_samples_per_prompt: int, name: str) -> Tensor:
    """Reshape a prompt-major (B,) tensor to (B/n, n), rejecting shapes that do not split into groups."""
    if values.dim() != 1:
        raise ValueError(f"{name} must be 1-D (B,): got shape {tuple(values.shape)}")
    if not isinstance(n_samples_per_prompt, int) or n_samples_per_prompt < 1:
        raise ValueError(f"n_samples_per_prompt must be a positive int: got {n_samples_per_prompt!r}")
    if values.numel() % n_samples_per_prompt != 0:
        raise ValueError(
            f"n_samples_per_prompt must divide the batch size: got {n_samples_per_prompt!r} and B={values.numel()}"
        )
    return values.reshape(-1, n_samples_per_prompt)


def place_sequence_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Put each sequence's scalar reward on its last unmasked token (zeros elsewhere).

    Args:
        rewards: (B,) float32 per-sequence rewards.
        mask: (B, T) 0/1 response mask. A row with no unmasked token receives no reward.

    Returns:
        (B, T) float32 per-token rewards.
    """
    if mask.dim() != 2 or rewards.shape != mask.shape[:1]:
        raise ValueError(
            f"rewards must be (B,) and mask (B, T): got {tuple(rewards.shape)} and {tuple(mask.shape)}"
        )
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).amax(dim=1)  # (B,), −1 for empty rows
    placed = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    placed[rows, last[rows]] = rewards[rows].float()
    return placed


def compute_gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lambd: float
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, eq. 16).

    δ_t = r_t + γ·V_{t+1} − V_t, A_t = δ_t + γλ·A_{t+1}, returns = A + V. Rewards and values are masked first, so
    V beyond the last unmasked token is 0 (the episode ends there); `mask` is a right-padded response mask.

    Args:
        rewards: (B, T) float32 per-token rewards.
        values: (B, T) float32 critic values V(s_t).
        mask: (B, T) 0/1 response mask.
        gamma: discount γ in [0, 1].
        lambd: GAE λ in [0, 1].

    Returns:
        advantages (B, T) and returns (B, T), float32, 0 outside `mask`.
    """
    _check_same_shape(rewards, mask, "rewards")
    _check_same_shape(values, mask, "values")
    _check_unit_interval(gamma, "gamma")
    _check_unit_interval(lambd, "lambd")
    m = mask.float()
    rewards, values = rewards.float() * m, values.float() * m
    advantages = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(rewards[:, 0])
    next_values = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_gae = delta + gamma * lambd * last_gae
        advantages[:, t] = last_gae
        next_values = values[:, t]
    return advantages * m, (advantages + values) * m


def compute_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Discounted reward-to-go G_t = Σ_{k≥t} γ^{k−t}·r_k (REINFORCE, Williams 1992).

    Args:
        rewards: (B, T) float32 per-token rewards.
        mask: (B, T) 0/1 response mask; rewards outside it are ignored.
        gamma: discount γ in [0, 1].

    Returns:
        (B, T) float32 returns, 0 outside `mask`.
    """
    _check_same_shape(rewards, mask, "rewards")
    _check_unit_interval(gamma, "gamma")
    m = mask.float()
    rewards = rewards.float() * m
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * m


def whiten(advantages: Tensor, mask: Tensor, shift_mean: bool = True, scale_std: bool = True) -> Tensor:
    """Normalise advantages with the token-weighted mean and variance of all unmasked tokens of the batch.

    μ = Σ A·m / Σ m, var = Σ (A − μ)²·m / Σ m floored at 1e-8; A ← (A − μ)/sqrt(var).
    `shift_mean=False` skips the − μ, `scale_std=False` skips the division (mean-only, `--no_std_norm`).

    Args:
        advantages: (B, T) float32.
        mask: (B, T) 0/1 response mask.

    Returns:
        (B, T) float32 whitened advantages, 0 outside `mask`.
    """
    _check_same_shape(advantages, mask, "advantages")
    m = mask.float()
    a = advantages.float()
    num_tokens = m.sum().clamp(min=1.0)
    mean = (a * m).sum() / num_tokens
    out = a - mean if shift_mean else a
    if scale_std:
        var = ((a - mean).square() * m).sum() / num_tokens
        out = out * var.clamp(min=_VAR_FLOOR).rsqrt()
    return out * m


def _check_same_shape(tensor: Tensor, mask: Tensor, name: str) -> None:
    if mask.dim() != 2 or tensor.shape != mask.shape:
        raise ValueError(
            f"{name} and mask must both be (B, T) of one shape: got {tuple(tensor.shape)} and {tuple(mask.shape)}"
        )


def _check_unit_interval(value: float, name: str) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1]: got {value!r}")
