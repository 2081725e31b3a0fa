"""Dynamic filtering of prompt groups (DAPO, Yu et al. 2025, §3.2 "dynamic sampling").

Owns the keep/drop decision for each prompt's group of samples. It does not know how dropped groups are replaced
or where the scores come from: a (B,) score tensor in, a (B/n,) boolean mask out.
"""

from torch import Tensor


def keep_groups(scores: Tensor, n_samples_per_prompt: int, low: float, high: float) -> Tensor:
    """Keep a prompt group iff low < mean(group scores) < high (strict), e.g. drop all-correct and all-wrong groups.

    Args:
        scores: (B,) float32 per-sample scores, prompt-major (the n samples of a prompt are contiguous).
        n_samples_per_prompt: n, the group size; must divide B.
        low, high: the open range of accepted group means, low < high.

    Returns:
        (B/n,) bool, True for the groups to keep.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D (B,): got shape {tuple(scores.shape)}")
    if not isinstance(n_samples_per_prompt, int) or n_samples_per_prompt < 1:
        raise ValueError(f"n_samples_per_prompt must be a positive int: got {n_samples_per_prompt!r}")
    if scores.numel() % n_samples_per_prompt != 0:
        raise ValueError(
            f"n_samples_per_prompt must divide the batch size: got {n_samples_per_prompt!r} and B={scores.numel()}"
        )
    if not low < high:
        raise ValueError(f"low must be < high: got {low!r} and {high!r}")
    group_means = scores.float().reshape(-1, n_samples_per_prompt).mean(dim=1)
    return (group_means > low) & (group_means < high)
