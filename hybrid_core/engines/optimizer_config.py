"""The optimizer half of a DeepSpeed config: AdamW or Muon, and where the optimizer lives (`ds.adam_offload`).

Owns the `optimizer` block and the ZeRO block's offload and reduction settings, from an `OptimizerFields` block (the
actor's or the critic's) and `DsConfig`:
- AdamW: torch's `AdamW` (`torch_adam`), on the GPU; with `ds.adam_offload` ZeRO-Offload keeps the fp32 master
  weights and Adam's moments on the host and steps there, with DeepSpeed's CPU Adam on GPU machines (a vectorised,
  multi-threaded C++ op, JIT-built once into the run's extensions folder) and torch's AdamW on CPU runs (there is no
  GPU to relieve, and the op's build costs minutes on a small machine). DeepSpeed takes a torch optimizer under
  offload when the config names it (`zero_force_ds_cpu_optimizer` only guards client optimizers).
- Muon (`--<role>.optim muon`): DeepSpeed's `MuonWithAuxAdam`. DeepSpeed tags each parameter at `initialize`: 2-D
  weights whose names hold neither "embed" nor "lm_head" (attention and MLP matrices, a value head) get Muon's
  Newton–Schulz-orthogonalised momentum (`muon.lr`, `muon.momentum`; DeepSpeed always runs 5 Newton–Schulz steps
  with Nesterov momentum); embeddings, the vocabulary head and the 1-D norms get its auxiliary Adam (`adam.lr`,
  `adam.betas`, `adam.eps`); `adam.weight_decay` applies to both. ZeRO-3 needs gradients all-reduced whole for Muon
  (DeepSpeed refuses reduce-scatter with it).
It knows nothing about models, Ray or RL.
"""
from __future__ import annotations

from hybrid_core.config import DsConfig, OptimizerFields


def uses_cpu_adam(ds: DsConfig, device: str) -> bool:
    """DeepSpeed's CPU Adam steps the offloaded optimizer on GPU machines (see the module docstring)."""
    return ds.adam_offload and device == "cuda"


def optimizer_block(optim: OptimizerFields, ds: DsConfig, device: str) -> dict:
    """DeepSpeed's `optimizer` entry for `optim` (an actor's or critic's block) on `device` ("cuda" or "cpu")."""
    adam = optim.adam
    adam_params = {"betas": list(adam.betas), "eps": adam.eps, "weight_decay": adam.weight_decay,
                   "torch_adam": not uses_cpu_adam(ds, device)}
    if optim.optim == "muon":
        if ds.adam_offload:  # the config rules refuse it (the seed: Muon drops --ds.adam_offload)
            raise ValueError("optim muon cannot step on the host: drop --ds.adam_offload")
        return {"type": "Muon", "params": {"lr": optim.muon.lr, "muon_lr": optim.muon.lr, "adam_lr": adam.lr,
                                           "momentum": optim.muon.momentum, **adam_params}}
    return {"type": "AdamW", "params": {"lr": adam.lr, **adam_params}}


def zero_block(optim: OptimizerFields, ds: DsConfig, device: str) -> dict:
    """DeepSpeed's `zero_optimization` entry: the stage, the optimizer's offload to the host and, for Muon under
    ZeRO-3, whole-gradient reduction."""
    block: dict = {"stage": ds.zero_stage, "overlap_comm": False}
    if ds.adam_offload:
        # pinned host memory makes the gradient and weight copies asynchronous DMA; a CPU run has no device to copy to
        block["offload_optimizer"] = {"device": "cpu", "pin_memory": device == "cuda"}
    if optim.optim == "muon" and ds.zero_stage == 3:
        block["reduce_scatter"] = False
    return block
