"""The trainers' optimizers as `hybrid plan` shows them and `hybrid train` checks them before anything starts.

Owns the refusals of optimizer settings that cannot run (`--<role>.optim muon` with `--ds.adam_offload`, as the seed
says: Muon drops CPU Adam; offload without ZeRO; CPU Adam without a C++ compiler to build it) and the plan's line on
where each trainer's optimizer lives. Pure functions of a `RunConfig` (and of `PATH`): no torch, no Ray. How the
DeepSpeed config is built is `engines/optimizer_config.py`'s.
"""
from __future__ import annotations

import os
import shutil

from hybrid_core.config import OptimizerFields, RunConfig


def _trainers(cfg: RunConfig) -> list[tuple[str, OptimizerFields]]:
    """The DeepSpeed roles this run trains, with their optimizer blocks."""
    return [("actor", cfg.actor)] + ([("critic", cfg.critic)] if cfg.uses_critic else [])


def optimizer_problems(cfg: RunConfig) -> list[str]:
    """Why the trainers' optimizers cannot run as configured (empty when they can)."""
    problems = []
    if cfg.ds.adam_offload:
        problems += [f"{role}.optim muon cannot be combined with ds.adam_offload: DeepSpeed's Muon orthogonalises "
                     f"each weight matrix's update on the GPU, and the seed drops CPU Adam with Muon; drop "
                     f"--ds.adam_offload, or train the {role} with --{role}.optim adam"
                     for role, block in _trainers(cfg) if block.optim == "muon"]
    if cfg.ds.adam_offload and cfg.ds.zero_stage == 0:
        problems.append("ds.adam_offload needs ZeRO stage 1, 2 or 3 (ZeRO-Offload moves the partitioned optimizer to "
                        "the host): got ds.zero_stage 0; pass --ds.zero_stage 2, or drop --ds.adam_offload")
    compiler = os.environ.get("CXX", "c++")
    if cfg.ds.adam_offload and cfg.train.device == "cuda" and shutil.which(compiler) is None:
        problems.append(f"ds.adam_offload on GPUs steps with DeepSpeed's CPU Adam, a C++ op built on first use: no "
                        f"C++ compiler ({compiler!r}, from $CXX or PATH) here; install g++ (and ninja), or drop "
                        "--ds.adam_offload")
    return problems


def optimizer_lines(cfg: RunConfig) -> list[str]:
    """One plan line per trainer, which optimizer for which weights and where its states live, when either differs
    from the default (AdamW, states on the device); none otherwise."""
    if not (cfg.ds.adam_offload or any(block.optim == "muon" for _, block in _trainers(cfg))):
        return []
    on_host = cfg.ds.adam_offload
    where = ("states and step on the host (ds.adam_offload: "
             + ("DeepSpeed's CPU Adam)" if cfg.train.device == "cuda" else "torch's AdamW)")) if on_host \
        else "states on the device"
    lines = []
    for role, block in _trainers(cfg):
        if block.optim == "muon":
            lines.append(f"optimizer ({role}): DeepSpeed's Muon, lr {block.muon.lr:g}, momentum {block.muon.momentum:g}"
                         f" (2-D hidden weights) + Adam, lr {block.adam.lr:g} (embeddings, head, norms); {where}")
        else:
            lines.append(f"optimizer ({role}): AdamW, lr {block.adam.lr:g}; {where}")
    return lines
