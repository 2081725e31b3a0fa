"""The weight-sync process group of distributed mode: the actor (rank 0) broadcasts buckets to rollout engines on
other devices or machines (ranks 1..n) — NCCL between GPUs, gloo on CPU.

Owns the group's creation outside torch's default group (DeepSpeed owns that one in the actor's process): a TCP
store hosted by rank 0 and a backend process group built on it directly. It knows nothing about Ray, buckets'
contents or vLLM; callers exchange addresses and bucket metadata themselves.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

BACKENDS = ("nccl", "gloo")


class WeightSyncGroup:
    """Rank `rank` of a `world_size` group whose store is served by rank 0 at `host:port`; blocks until all joined."""

    def __init__(self, host: str, port: int, world_size: int, rank: int, backend: str, timeout_s: float = 600.0):
        if backend not in BACKENDS:
            raise ValueError(f"vllm.sync_backend must be one of {BACKENDS}: got {backend!r}")
        timeout = timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
        self.rank, self.world_size, self.backend = rank, world_size, backend
        if backend == "gloo":
            self.group = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(self.store, rank, world_size, options)

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's `tensor` into every other rank's `tensor` (same shape and dtype), in place."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()
