"""Bucketed weight transfer: flatten named parameters into contiguous buckets of ≤ `bucket_bytes`, and back.

Owns the bucket format (one dtype per bucket; metadata = name, shape, offset), the ZeRO-3 gather of a bucket's
parameters, the persistent GPU buffers buckets are packed into, and the CUDA IPC form of a bucket (`SharedBucket`:
handles that processes on the same GPUs open without a copy, one per GPU for an engine's TP workers; opened handles
are cached, so a sync reopens nothing). Calling the receiver (Ray, an engine RPC) is the caller's business;
per-parameter transfer is the known anti-pattern and exists only as a benchmark baseline.
"""
from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

import torch

from hybrid_core.engines.lora_policy import adapter_parameters, has_adapters


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


def synced_parameters(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """What a sync sends of `module`: every parameter by its HF name, or of a LoRA policy only its adapters (by
    their PEFT names; the engine holds the base already)."""
    return adapter_parameters(module) if has_adapters(module) else list(module.named_parameters())


def _full_numel(p: torch.nn.Parameter) -> int:
    """Elements of the whole parameter (a ZeRO-3 shard knows its full size as `ds_numel`)."""
    return p.ds_numel if hasattr(p, "ds_numel") else p.numel()


def _group_by_budget(named: list[tuple[str, torch.nn.Parameter]], bucket_bytes: int):
    group, size, dtype = [], 0, None
    for name, p in named:
        nbytes = _full_numel(p) * p.element_size()
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


class BucketBuffers:
    """Persistent byte buffers on the parameters' device that buckets are packed into, used in turn.

    Reusing the same memory every sync lets a receiving process keep the buffers' IPC handles open; a bucket must
    be released by its receiver before its buffer comes round again (the caller waits for that)."""

    def __init__(self, num_bytes: int, device: torch.device, count: int = 2):
        self.buffers = [torch.empty(num_bytes, dtype=torch.uint8, device=device) for _ in range(count)]
        self.next = 0

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        buffer = self.buffers[self.next]
        self.next = (self.next + 1) % len(self.buffers)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel * itemsize > buffer.numel():
            raise ValueError(f"a bucket of {numel * itemsize} bytes does not fit its {buffer.numel()}-byte buffer")
        return buffer[:numel * itemsize].view(dtype)


def largest_bucket_bytes(module: torch.nn.Module, bucket_bytes: int) -> int:
    """Bytes of the largest bucket `iter_buckets` will make (one parameter can exceed the budget on its own)."""
    sizes = [_full_numel(p) * p.element_size() for _, p in synced_parameters(module)]
    return max([bucket_bytes, *sizes])


def iter_buckets(module: torch.nn.Module, bucket_bytes: int, is_zero3: bool = False,
                 buffers: BucketBuffers | None = None) -> Iterator[Bucket]:
    """Yield the module's synced parameters (`synced_parameters`) as flat buckets, gathering ZeRO-3 shards one
    bucket at a time; packed into `buffers` when given (else freshly allocated copies)."""
    if bucket_bytes <= 0:
        raise ValueError(f"vllm.sync_bucket_mb must be positive: got {bucket_bytes} bytes")
    for group in _group_by_budget(synced_parameters(module), bucket_bytes):
        with _gathered([p for _, p in group], is_zero3), torch.no_grad():
            entries, chunks, offset = [], [], 0
            for name, p in group:
                entries.append(BucketEntry(name, tuple(p.shape), offset))
                chunks.append(p.detach().reshape(-1))
                offset += p.numel()
            out = buffers.take(offset, chunks[0].dtype) if buffers is not None else None
            yield Bucket(tuple(entries), torch.cat(chunks, out=out) if out is not None else torch.cat(chunks))


def join_bucket_gathers(module: torch.nn.Module, bucket_bytes: int) -> int:
    """A ZeRO-3 rank that sends nothing: take part in the gather of each bucket `iter_buckets` makes on the sending
    rank (the same buckets in the same order: gathers are collectives), packing nothing; returns the bucket count."""
    groups = list(_group_by_budget(synced_parameters(module), bucket_bytes))
    for group in groups:
        with _gathered([p for _, p in group], True):
            pass
    return len(groups)


def unflatten(bucket: Bucket) -> list[tuple[str, torch.Tensor]]:
    """Views into `bucket.flat`, one per parameter, in HF names."""
    out = []
    for e in bucket.entries:
        numel = 1
        for d in e.shape:
            numel *= d
        out.append((e.name, bucket.flat[e.offset:e.offset + numel].view(e.shape)))
    return out


@dataclass(frozen=True)
class SharedBucket:
    """A bucket in GPU memory, passed to processes on the same GPUs as CUDA IPC handles: one copy per GPU, keyed by
    the GPU's UUID (device indices differ between processes), so each TP worker of an engine opens the copy of the
    actor rank beside it."""

    entries: tuple[BucketEntry, ...]
    handles: dict[str, tuple]  # GPU UUID → reduce_tensor(flat) of the copy on that GPU: (rebuild function, arguments)
    num_bytes: int


def gpu_uuid(device: torch.device | int) -> str:
    """The GPU's UUID: the same GPU in every process, whatever CUDA_VISIBLE_DEVICES numbers it there."""
    return str(torch.cuda.get_device_properties(device).uuid)


def share_bucket(bucket: Bucket) -> SharedBucket:
    """The IPC form of a GPU bucket; the memory must stay untouched until the receiver has loaded it."""
    from torch.multiprocessing.reductions import reduce_tensor

    if not bucket.flat.is_cuda:
        raise ValueError("only GPU buckets can be shared through CUDA IPC; send CPU buckets by value")
    return SharedBucket(bucket.entries, {gpu_uuid(bucket.flat.device): reduce_tensor(bucket.flat)}, bucket.num_bytes)


def gather_shared(shared: SharedBucket, ranks: range) -> SharedBucket:
    """The same bucket as shared by each of `ranks` (the data-parallel ranks on one engine's GPUs): every rank of
    the process group calls this for every bucket, in step, each with its own copy's handle."""
    import torch.distributed as dist

    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, shared.handles)
    return SharedBucket(shared.entries, merge_handles(parts, ranks), shared.num_bytes)


def merge_handles(parts: list[dict[str, tuple]], ranks: range) -> dict[str, tuple]:
    """One handle per GPU from the ranks in `ranks` (`parts[r]`: rank r's handles by GPU UUID); each TP worker of
    the engine needs the copy of the rank on its own GPU, so two ranks on one GPU are an error, not a choice."""
    handles = {uuid: handle for rank in ranks for uuid, handle in parts[rank].items()}
    if len(handles) != len(ranks):
        raise RuntimeError(f"actor ranks {ranks.start}-{ranks.stop - 1} hold copies on {len(handles)} GPUs "
                           f"({sorted(handles)}): each TP worker of their engine needs the actor rank on its own GPU")
    return handles


_OPENED: OrderedDict = OrderedDict()  # receiver side: (IPC handle, offset) → tensor, kept so the mapping stays open
MAX_OPENED = 8


def open_shared_bucket(shared: SharedBucket) -> Bucket:
    """Map the copy of a shared bucket that lies on this process's current GPU (no copy); mappings are cached by
    handle."""
    device = torch.cuda.current_device()
    handle = shared.handles.get(gpu_uuid(device))
    if handle is None:
        raise RuntimeError(f"no copy of the bucket on this GPU ({gpu_uuid(device)}): the actor ranks shared it on "
                           f"{sorted(shared.handles)}")
    rebuild, args = handle
    args = list(args)
    args[6] = device  # the sender's device index means this process's current device (the same GPU)
    key = (args[7], args[9], args[3], tuple(args[1]), args[5])  # handle, storage/tensor offsets, shape, dtype
    flat = _OPENED.get(key)
    if flat is None:
        flat = rebuild(*args)
        _OPENED[key] = flat
        while len(_OPENED) > MAX_OPENED:
            _OPENED.popitem(last=False)
    _OPENED.move_to_end(key)
    return Bucket(shared.entries, flat)
