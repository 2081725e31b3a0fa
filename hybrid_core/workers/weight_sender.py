"""Sending the actor's weights to the run's rollout workers, by the run's transport (see `plan.sync_transport`).

Owns the three ways a bucket travels: by value through Ray's object store (colocated on CPU; one object shared
by every engine), as a CUDA IPC handle of a persistent GPU buffer (colocated on a GPU: the engine maps it, no
copy), or by a broadcast over the actor↔engines process group (distributed mode: engines on devices of their own;
one broadcast reaches every engine). It knows nothing about Prefect or what the weights are.
"""
from __future__ import annotations

from collections import deque

import ray
import torch

from hybrid_core.engines.sync_group import WeightSyncGroup
from hybrid_core.engines.weight_sync import BucketBuffers, iter_buckets, largest_bucket_bytes, share_bucket
from hybrid_core.workers.placement import free_port


class WeightSender:
    """The actor side of weight sync; keeps what later syncs reuse (GPU buffers, the process group)."""

    def __init__(self, transport: str, bucket_bytes: int, timeout_s: float):
        self.transport, self.bucket_bytes, self.timeout_s = transport, bucket_bytes, timeout_s
        self.buffers: BucketBuffers | None = None
        self.group: WeightSyncGroup | None = None
        self.group_peers: list[str] = []

    def send(self, module: torch.nn.Module, is_zero3: bool, rollouts: list) -> int:
        """Every parameter of `module` to every rollout worker; returns the bytes of one copy of the weights."""
        buckets = iter_buckets(module, self.bucket_bytes, is_zero3)
        if self.transport.startswith("process_group:"):
            return self._broadcast(buckets, rollouts, self.transport.split(":", 1)[1])
        if self.transport == "object_store":
            return sum(self._by_value(bucket, rollouts) for bucket in buckets)
        if len(rollouts) != 1:
            raise RuntimeError(f"CUDA IPC sync serves the one engine on the actor's GPU: got {len(rollouts)} engines")
        return self._cuda_ipc(module, is_zero3, rollouts[0])

    def _by_value(self, bucket, rollouts: list) -> int:
        shared = ray.put(bucket)
        return ray.get([r.load_bucket.remote(shared) for r in rollouts], timeout=self.timeout_s)[0]

    def _cuda_ipc(self, module: torch.nn.Module, is_zero3: bool, rollout) -> int:
        """Buckets packed into two persistent buffers in turn; the next is packed while the engine loads one."""
        if self.buffers is None:
            device = next(module.parameters()).device
            self.buffers = BucketBuffers(largest_bucket_bytes(module, self.bucket_bytes), device)
        buckets, pending, sent = iter_buckets(module, self.bucket_bytes, is_zero3, self.buffers), deque(), 0
        while True:
            while len(pending) >= len(self.buffers.buffers):  # the next buffer is free once its load returned
                sent += ray.get(pending.popleft(), timeout=self.timeout_s)
            bucket = next(buckets, None)
            if bucket is None:
                return sent + sum(ray.get(list(pending), timeout=self.timeout_s))
            torch.cuda.synchronize()  # the packed bytes are in memory before another process reads them
            pending.append(rollout.load_shared_bucket.remote(share_bucket(bucket)))

    def _join(self, rollouts: list, backend: str) -> None:
        """Make the process group (actor rank 0, engine r rank r+1) at the first sync or after any engine changed."""
        peers = [r._actor_id.hex() for r in rollouts]
        if self.group is not None and peers == self.group_peers:
            return
        host, port, world = ray.util.get_node_ip_address(), free_port(), 1 + len(rollouts)
        joined = [r.join_sync_group.remote(host, port, world, rank + 1, backend) for rank, r in enumerate(rollouts)]
        self.group, self.group_peers = WeightSyncGroup(host, port, world, 0, backend, self.timeout_s), peers
        ray.get(joined, timeout=self.timeout_s)

    def _broadcast(self, buckets, rollouts: list, backend: str) -> int:
        """Each bucket is broadcast once while every engine's `receive_bucket` call waits for it."""
        self._join(rollouts, backend)
        sent = 0
        for bucket in buckets:
            flat = bucket.flat.to(self.group.device)
            received = [r.receive_bucket.remote(bucket.entries, flat.numel(), str(flat.dtype)) for r in rollouts]
            self.group.broadcast(flat)
            sent += ray.get(received, timeout=self.timeout_s)[0]
        return sent
