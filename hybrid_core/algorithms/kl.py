"""KL divergence to the reference policy: per-token estimators and the controllers of the KL coefficient β.

Owns the k1/k2/k3 estimators and the fixed/adaptive β schedules (Ziegler et al. 2019). It knows nothing about where
the KL is used (as a reward penalty or as a loss term), nor about configs, models or workers: tensors and scalars
in, tensors and floats out.
"""

import torch
from torch import Tensor

KL_ESTIMATORS = frozenset({"k1", "k2", "k3"})
_KL_CLAMP = 10.0


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token KL estimate of π_θ against π_ref, from sampled-token log-probabilities.

    With x = log π_θ − log π_ref (Schulman, "Approximating KL divergence", 2020):
    k1 = x (unbiased, can be negative), k2 = x²/2, k3 = exp(−x) − 1 + x (unbiased, ≥ 0).
    The result is clamped to [−10, 10], as OpenRLHF does, so one bad token cannot dominate a batch.

    Args:
        logprobs: (B, T) float32 log π_θ of the sampled tokens.
        ref_logprobs: (B, T) float32 log π_ref of the same tokens.
        estimator: one of "k1", "k2", "k3".

    Returns:
        (B, T) float32 per-token KL estimate; padding positions are not masked (multiply by the mask).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(KL_ESTIMATORS)}: got {estimator!r}")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"ref_logprobs must have the shape of logprobs: got {tuple(ref_logprobs.shape)} "
            f"and {tuple(logprobs.shape)}"
        )
    x = logprobs.float() - ref_logprobs.float()
    if estimator == "k1":
        kl = x
    elif estimator == "k2":
        kl = x.square() / 2
    else:
        kl = torch.expm1(-x) + x
    return kl.clamp(-_KL_CLAMP, _KL_CLAMP)


class FixedKLController:
    """A constant KL coefficient β; `update` is a no-op so callers treat both controllers alike."""

    def __init__(self, init_coef: float):
        if init_coef < 0:
            raise ValueError(f"init_coef must be >= 0: got {init_coef!r}")
        self.coef = float(init_coef)

    def update(self, kl: float, n_samples: int) -> None:
        """Keep β unchanged."""


class AdaptiveKLController:
    """Adaptive β that steers the observed KL towards a target (Ziegler et al. 2019, "Fine-Tuning LMs from Human
    Preferences", §2.2): β ← β·(1 + clip(KL/target − 1, −0.2, 0.2)·N/horizon).
    """

    def __init__(self, init_coef: float, target: float, horizon: float):
        if init_coef < 0:
            raise ValueError(f"init_coef must be >= 0: got {init_coef!r}")
        if target <= 0:
            raise ValueError(f"target must be > 0: got {target!r}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0: got {horizon!r}")
        self.coef = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, kl: float, n_samples: int) -> None:
        """Move β after a step.

        Args:
            kl: the step's observed KL (mean per-sequence KL to the reference).
            n_samples: N, the number of samples in the step (rollout batch size × samples per prompt).
        """
        if n_samples < 0:
            raise ValueError(f"n_samples must be >= 0: got {n_samples!r}")
        proportional_error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + proportional_error * n_samples / self.horizon
