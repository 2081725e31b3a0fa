"""Sending the actor's weights to the run's rollout workers, by the run's transport (`placement.sync_transport`).

Owns the three ways a bucket travels: by value through Ray's object store (colocated on CPU; one object shared
by every engine), as CUDA IPC handles of persistent GPU buffers (colocated on GPUs: every actor rank hands its copy to
the engine worker on its GPU, the engine maps it, no copy), or by a broadcast over the actor↔engines process group
(distributed mode: engines on devices of their own; one broadcast reaches every engine). It knows nothing about
Prefect or what the weights are.
"""
from __future__ import annotations

import ray
import torch

from hybrid_core.engines.sync_group import WeightSyncGroup
from hybrid_core.engines.weight_sync import (BucketBuffers, gather_shared, iter_buckets, largest_bucket_bytes,
                                             share_bucket)
from hybrid_core.workers.placement import free_port


class WeightSender:
    """The actor side of weight sync; keeps what later syncs reuse (GPU buffers, the process group)."""

    def __init__(self, transport: str, bucket_bytes: int, timeout_s: float):
        self.transport, self.bucket_bytes, self.timeout_s = transport, bucket_bytes, timeout_s
        self.buffers: BucketBuffers | None = None
        self.group: WeightSyncGroup | None = None
        self.group_peers: list[str] = []

    def send(self, module: torch.nn.Module, is_zero3: bool, rollouts: list) -> int:
        """Every parameter of `module` to every rollout worker, from this rank alone (object store or broadcast);
        returns the bytes of one copy of the weights."""
        buckets = iter_buckets(module, self.bucket_bytes, is_zero3)
        if self.transport.startswith("process_group:"):
            return self._broadcast(buckets, rollouts, self.transport.split(":", 1)[1])
        if self.transport == "object_store":
            return sum(self._by_value(bucket, rollouts) for bucket in buckets)
        raise RuntimeError(f"{self.transport} sync goes from every actor rank to the engine on its GPU: "
                           "call send_beside on each rank")

    def _by_value(self, bucket, rollouts: list) -> int:
        shared = ray.put(bucket)
        return ray.get([r.load_bucket.remote(shared) for r in rollouts], timeout=self.timeout_s)[0]

    def send_beside(self, module: torch.nn.Module, is_zero3: bool, engine, feeders: range | None) -> int:
        """CUDA IPC: this rank's copy of every bucket to the engine worker on its GPU; returns the bytes it sent.

        Buckets are packed into two persistent buffers in turn, the next packed while the engine loads one. With TP
        workers (`feeders`: the actor ranks on the engine's GPUs) every rank of the process group packs each bucket,
        the ranks' handles are gathered, and the engine's first feeder (`engine` given; None on the others) sends
        them all in one call. A buffer is packed again only after the bucket it held was loaded: the sender waits
        for the previous load before the gather that lets the other ranks pack their next bucket.
        """
        if self.buffers is None:
            device = next(module.parameters()).device
            self.buffers = BucketBuffers(largest_bucket_bytes(module, self.bucket_bytes), device)
        pending, sent = None, 0
        for bucket in iter_buckets(module, self.bucket_bytes, is_zero3, self.buffers):
            # the packed bytes are in memory before another process reads them; this stream only: DeepSpeed's
            # sleep may still be copying the optimizer states to the host on its own
            torch.cuda.current_stream().synchronize()
            shared = share_bucket(bucket)
            if pending is not None:
                sent += ray.get(pending, timeout=self.timeout_s)
            shared = gather_shared(shared, feeders) if feeders is not None else shared
            pending = engine.load_shared_bucket.remote(shared) if engine is not None else None
        return sent + (ray.get(pending, timeout=self.timeout_s) if pending is not None else 0)

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
