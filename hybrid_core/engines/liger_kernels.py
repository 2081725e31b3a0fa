"""`--ds.use_liger_kernel`: Liger's fused Triton kernels (RMSNorm, rotary embedding, SwiGLU MLP) in place of the
HF model's own, applied to a loaded model instance.

Owns which Liger patches are applied and the error for a model type Liger does not cover. The logits path stays
this project's (`vocab_head`, the head in chunks): Liger's fused linear cross-entropy forward is never installed, so
logprobs and entropy behave as without Liger. Liger also patches the model type's module process-wide (its
rotary function is looked up there at call time), so a process loads its models either all with it or all without.
Liger needs CUDA (Triton); `plan` refuses the flag on CPU or without the package. It knows nothing about DeepSpeed,
Ray or RL.
"""
from __future__ import annotations

import inspect

from hybrid_core.config import LIGER_INSTALL_HINT

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
