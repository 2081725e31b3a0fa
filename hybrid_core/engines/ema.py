"""An exponential moving average of a model's trained parameters, in fp32 host memory (`--train.enable_ema`).

Owns the average (ema = beta·ema + (1 − beta)·weights after each optimizer step, starting from the initial weights,
as OpenRLHF's EMA does), its state for checkpoints, and the state dict of an export with the average in place of the
trained weights. Only parameters that train are averaged: a LoRA policy's EMA is its adapters'. It knows nothing about
DeepSpeed, Ray or the store.
"""
from __future__ import annotations

import torch


def trained_parameters(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


class EmaWeights:
    """fp32 host copies of `module`'s trained parameters (pinned where a GPU can copy into them asynchronously)."""

    def __init__(self, module: torch.nn.Module, beta: float):
        self.beta = beta
        self.module = module
        is_pinned = torch.cuda.is_available()
        self.average = {name: p.detach().to("cpu", torch.float32).clone().pin_memory() if is_pinned
                        else p.detach().to("cpu", torch.float32).clone() for name, p in trained_parameters(module)}
        self.num_updates = 0

    @torch.no_grad()
    def update(self) -> None:
        """One optimizer step's update from the module's weights now."""
        for name, p in trained_parameters(self.module):
            average = self.average[name]
            average.mul_(self.beta).add_(p.detach().to("cpu", torch.float32), alpha=1.0 - self.beta)
        self.num_updates += 1

    def state_dict(self) -> dict:
        return {"beta": self.beta, "num_updates": self.num_updates,
                "average": {name: tensor.clone() for name, tensor in self.average.items()}}

    def load_state_dict(self, state: dict) -> None:
        if set(state["average"]) != set(self.average):
            raise RuntimeError(f"the checkpoint's EMA holds {len(state['average'])} tensors, this policy trains "
                               f"{len(self.average)}: it was saved by another model or adapter configuration")
        for name, tensor in state["average"].items():
            self.average[name].copy_(tensor)
        self.num_updates = state["num_updates"]

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's state dict with the average in place of each trained parameter (in the parameter's dtype)."""
        state = self.module.state_dict()
        for name, tensor in self.average.items():
            state[name] = tensor.to(state[name].dtype)
        return state
