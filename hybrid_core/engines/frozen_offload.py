"""A frozen model's weights kept in host memory, visiting the device only for its forwards (`--ref.offload`,
`--reward.offload`): the GPU holds them during the reference's or reward model's stage, not while the actor trains
or vLLM generates.

Owns the host copies (page-locked on a GPU machine, so the copies to the device are DMA) and the two moves. The
weights never change, so leaving the device copies nothing: the device copies are dropped and every tensor points
at its host copy again; a visit is one host-to-device copy per tensor. OpenRLHF asks DeepSpeed for ZeRO-3 parameter
offload instead (`get_eval_ds_config(offload=True)`); this project's frozen models are plain PyTorch modules. It
knows nothing about what the model computes, Ray or the store.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class HostResidentWeights:
    """Every parameter and buffer of `module` (shared ones once) lives on the host; `on_device()` brings them to
    `device` for the duration of a block."""

    def __init__(self, module: torch.nn.Module, device: str):
        self.module, self.device = module.to("cpu"), torch.device(device)
        tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}  # tied weights once
        self.tensors = list(tensors.values())
        if self.device.type == "cuda":
            for tensor in self.tensors:
                tensor.data = tensor.data.pin_memory()
        self.host_copies = [tensor.data for tensor in self.tensors]

    def _visit(self) -> None:
        for tensor, host in zip(self.tensors, self.host_copies):
            device_copy = torch.empty_like(host, device=self.device)
            tensor.data = device_copy.copy_(host, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _leave(self) -> None:
        for tensor, host in zip(self.tensors, self.host_copies):
            tensor.data = host
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the rollout engine and the trainers (other processes) need the memory next

    @contextlib.contextmanager
    def on_device(self) -> Iterator[torch.nn.Module]:
        """The module with its weights on the device; back on the host when the block ends, however it ends."""
        self._visit()
        try:
            yield self.module
        finally:
            self._leave()

    @property
    def num_bytes(self) -> int:
        return sum(host.numel() * host.element_size() for host in self.host_copies)
