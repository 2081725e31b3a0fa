"""Liger's fused Triton kernels (RMSNorm, rotary embedding, SwiGLU MLP) in place of the HF model's own, applied to a
loaded model instance: by default on CUDA wherever Liger covers the model type (on the H200 they took packed training
from 32.9% to 45.7% MFU at the 1.7B shape), required with `--ds.use_liger_kernel`.

Owns which Liger patches are applied, the default, its fallback message and the error for a model type Liger does not
cover when the flag asks for it. The logits path stays
this project's (`sequence_batch`): Liger's fused linear cross-entropy forward is never installed, so logprobs,
`logits_to_keep` and entropy behave as without Liger. Liger also patches the model type's module process-wide (its
rotary function is looked up there at call time), so a process loads its models either all with it or all without.
Liger needs CUDA (Triton); `plan` refuses the flag on CPU or without the package. It knows nothing about DeepSpeed,
Ray or RL.
"""
from __future__ import annotations

import inspect
import logging

import torch

from hybrid_core.config import LIGER_INSTALL_HINT

log = logging.getLogger(__name__)

# the kernels applied; the two cross-entropy replacements are off (they would replace the model's forward)
LIGER_PATCHES = {"rope": True, "rms_norm": True, "swiglu": True, "cross_entropy": False,
                 "fused_linear_cross_entropy": False}


def apply_liger_kernels(model) -> None:
    """Swap the model's RMSNorm, rotary embedding and SwiGLU MLP for Liger's kernels, in place. `model` is a causal LM
    or its base model (the critic's backbone). Fails naming the model type when Liger has no kernels for it."""
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as err:
        raise ImportError(f"ds.use_liger_kernel needs the liger-kernel package (CUDA only): {LIGER_INSTALL_HINT} "
                          f"({err})") from err
    model_type = model.config.model_type
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply is None:
        raise ValueError(f"ds.use_liger_kernel: Liger has no kernels for model type {model_type!r} (it covers "
                         f"{', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}); drop --ds.use_liger_kernel")
    accepted = inspect.signature(apply).parameters
    apply(model=model, **{name: on for name, on in LIGER_PATCHES.items() if name in accepted})


def apply_fast_kernels(model, use_liger: bool | None) -> bool:
    """Liger's kernels on `model` as asked: True requires them (fails as `apply_liger_kernels`), False keeps the
    model's own, None (the default) applies them on CUDA when the package is installed and covers the model type,
    saying why not otherwise. Returns whether they were applied."""
    if use_liger is None:
        use_liger = torch.cuda.is_available() and _can_apply(model.config.model_type)
    if use_liger:
        apply_liger_kernels(model)
    return bool(use_liger)


def _can_apply(model_type: str) -> bool:
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        log.warning("fast kernels: the liger-kernel package is not installed (%s); the model's own RMSNorm, rotary "
                    "and SwiGLU kernels run (slower)", LIGER_INSTALL_HINT)
        return False
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        log.warning("fast kernels: Liger has none for model type %r; the model's own kernels run (slower)",
                    model_type)
        return False
    return True
