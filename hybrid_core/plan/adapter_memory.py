"""What LoRA adapters and an EMA change in a run's memory plan: the policy's trained parameters (those with
gradients and optimizer states) and the plan's notes on them.

Pure arithmetic on the model's shape; `memory` builds the phases from it. No torch, no Ray.
"""
from __future__ import annotations

from hybrid_core.config import RunConfig
from hybrid_core.plan.model_shapes import ModelShape

GIB = 2**30


def trained_params(cfg: RunConfig, shape: ModelShape) -> int:
    """The policy's parameters with gradients and optimizer states: all, or with ds.lora.rank the adapters'."""
    lora = cfg.ds.lora
    return shape.adapter_params(lora.rank, lora.target_modules) if cfg.uses_lora else shape.num_params


def adapter_notes(cfg: RunConfig, shape: ModelShape) -> list[str]:
    """LoRA's trained share, and the EMA's host memory."""
    trained, notes = trained_params(cfg, shape), []
    if cfg.uses_lora:
        notes.append(f"ds.lora.rank {cfg.ds.lora.rank}: only the adapters train ({trained / 1e6:.1f}M parameters, "
                     f"{100 * trained / shape.num_params:.2f}% of the model): gradients and optimizer states are "
                     "theirs, a sync sends only them, and the reference is the base with the adapters off")
    if cfg.train.enable_ema:
        notes.append(f"train.enable_ema: an fp32 EMA of the trained parameters in rank 0's host memory "
                     f"({trained * 4 / GIB:.2f} GiB of RAM), none on the GPU")
    return notes
