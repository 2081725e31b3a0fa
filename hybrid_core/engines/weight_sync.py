"""Bucketed weight transfer: flatten named parameters into contiguous buckets of ≤ `bucket_bytes`, and back.

Owns the bucket format (one dtype per bucket; metadata = name, shape, offset) and the ZeRO-3 gather of a bucket's
parameters. Sending a bucket (Ray object store on CPU, CUDA IPC on one GPU, a process group in distributed mode)
is the caller's business; per-parameter transfer is the known anti-pattern and exists only as a benchmark baseline.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch


@dataclass(frozen=True)
class BucketEntry:
    name: str
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class Bucket:
    entries: tuple[BucketEntry, ...]
    flat: torch.Tensor  # 1-D, one dtype

    @property
    def num_bytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()


def _group_by_budget(named: list[tuple[str, torch.nn.Parameter]], bucket_bytes: int):
    group, size, dtype = [], 0, None
    for name, p in named:
        numel = p.ds_numel if hasattr(p, "ds_numel") else p.numel()
        nbytes = numel * p.element_size()
        if group and (size + nbytes > bucket_bytes or p.dtype != dtype):
            yield group
            group, size = [], 0
        group.append((name, p))
        size, dtype = size + nbytes, p.dtype
    if group:
        yield group


def _gathered(params: list, is_zero3: bool):
    if not is_zero3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params)


def iter_buckets(module: torch.nn.Module, bucket_bytes: int, is_zero3: bool = False) -> Iterator[Bucket]:
    """Yield the module's parameters as flat buckets (copies), gathering ZeRO-3 shards one bucket at a time."""
    if bucket_bytes <= 0:
        raise ValueError(f"vllm.sync_bucket_mb must be positive: got {bucket_bytes} bytes")
    named = list(module.named_parameters())
    for group in _group_by_budget(named, bucket_bytes):
        with _gathered([p for _, p in group], is_zero3), torch.no_grad():
            entries, chunks, offset = [], [], 0
            for name, p in group:
                entries.append(BucketEntry(name, tuple(p.shape), offset))
                chunks.append(p.detach().reshape(-1))
                offset += p.numel()
            yield Bucket(tuple(entries), torch.cat(chunks))


def unflatten(bucket: Bucket) -> list[tuple[str, torch.Tensor]]:
    """Views into `bucket.flat`, one per parameter, in HF names."""
    out = []
    for e in bucket.entries:
        numel = 1
        for d in e.shape:
            numel *= d
        out.append((e.name, bucket.flat[e.offset:e.offset + numel].view(e.shape)))
    return out
