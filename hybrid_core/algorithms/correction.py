"""Importance-sampling correction for the mismatch between the rollout engine and the trainer.

Owns the per-token weights w = π_old / π_rollout (truncated IS, IcePop token masking, sequence-masked TIS) that
multiply the policy loss. It does not know which engines produced the log-probabilities, nor how the weights are
applied or logged: tensors and scalars in, a detached (B, T) tensor out.
"""

from torch import Tensor

IS_KINDS = frozenset({"tis", "icepop", "seq-mask-tis"})
# Bounds the exponent only; any weight this far out is clamped or masked by every kind anyway.
_LOG_WEIGHT_CLAMP = 20.0


def is_weights(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    *,
    kind: str,
    low: float = 0.5,
    high: float = 5.0,
) -> Tensor:
    """Importance weights w_t = exp(log π_old − log π_rollout), detached.

    `tis` (truncated IS, Yao et al. 2025 "Your efficient RL framework secretly brings you off-policy RL"):
    clamp(w, low, high). `icepop` (Ling team 2025): w·1[low ≤ w ≤ high]. `seq-mask-tis`: w on the sequences whose
    geometric-mean weight exp(masked mean of log w) lies in [low, high], 0 on the others.

    Args:
        old_logprobs: (B, T) float32 log π_old from the trainer's forward at experience time.
        rollout_logprobs: (B, T) float32 log π_rollout reported by the rollout engine.
        mask: (B, T) 0/1 response mask.
        kind: one of "tis", "icepop", "seq-mask-tis".
        low, high: the accepted weight range, 0 ≤ low < high.

    Returns:
        (B, T) float32 detached weights, 0 outside `mask`.
    """
    if kind not in IS_KINDS:
        raise ValueError(f"kind must be one of {sorted(IS_KINDS)}: got {kind!r}")
    if not 0.0 <= low < high:
        raise ValueError(f"low and high must satisfy 0 <= low < high: got {low!r} and {high!r}")
    for name, tensor in (("rollout_logprobs", rollout_logprobs), ("mask", mask)):
        if tensor.shape != old_logprobs.shape or tensor.dim() != 2:
            raise ValueError(
                f"{name} must be (B, T) like old_logprobs: got {tuple(tensor.shape)} and {tuple(old_logprobs.shape)}"
            )
    m = mask.detach().float()
    log_w = (old_logprobs.detach().float() - rollout_logprobs.detach().float()).clamp(
        -_LOG_WEIGHT_CLAMP, _LOG_WEIGHT_CLAMP
    )
    w = log_w.exp()
    if kind == "tis":
        weights = w.clamp(low, high)
    elif kind == "icepop":
        weights = w * ((w >= low) & (w <= high)).float()
    else:
        seq_w = ((log_w * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1.0)).exp()  # (B,)
        is_kept = (seq_w >= low) & (seq_w <= high)
        weights = w * is_kept.float().unsqueeze(-1)
    return weights * m
