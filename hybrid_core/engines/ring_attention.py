"""Ring attention over torch.distributed (`--ds.ring_attn_size N`, `--ds.ring_attn_head_stride S`): the ring groups,
which keys a rank's chunk of a packed row attends to, the collectives, and the attention kernel `hybrid_ring`.

N consecutive data-parallel ranks form a ring group and share every packed micro-batch, each computing one chunk of
its row (`ring_batch`). In each layer the ranks all-gather the keys and values of S K/V heads at a time (OpenRLHF's
head stride, the `heads_k_stride` of ring-flash-attn's "llama3" variant that OpenRLHF uses) and a rank's queries
attend causally, per sample, to its samples' keys from their first token to the chunk's end. The backward sums the
keys' and values' gradients over the ring back to the rank that owns them (a reduce-scatter). The local attention
is `varlen_attention.causal_varlen_attention`: PyTorch's varlen flash kernel on CUDA, exact sdpa per sample on CPU.
It knows nothing about DeepSpeed, RL or how the row was laid out beyond the sample boundaries it is given.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from hybrid_core.engines.varlen_attention import VarlenBounds, causal_varlen_attention, varlen_attention_forward
from hybrid_core.layout import ring_group_ranks

RING_ATTENTION = "hybrid_ring"


@dataclass(frozen=True)
class RingGroup:
    """This rank's ring: the process group of its N ranks, its place among them, and the K/V heads each all-gather
    exchanges (`head_stride`)."""

    group: object  # torch.distributed.ProcessGroup
    rank: int
    size: int
    head_stride: int


@dataclass(frozen=True, kw_only=True)
class RingSettings:
    """`ds.ring_attn_size` and `ds.ring_attn_head_stride`, for a process that is not a DeepSpeed rank."""

    size: int
    head_stride: int

    def join(self) -> RingGroup | None:
        """This process's ring (None for a ring of one), starting torch.distributed from the rank's environment
        (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) when nothing started it: NCCL on CUDA, gloo on CPU."""
        if self.size == 1:
            return None
        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return new_ring_group(self.size, self.head_stride)


def new_ring_group(ring_size: int, head_stride: int) -> RingGroup | None:
    """This rank's ring among the default process group's ranks (rings of `ring_size` consecutive ranks); None for a
    ring of one. Every rank creates every ring's group, in the same order, as torch.distributed requires."""
    if ring_size == 1:
        return None
    world_size, rank = dist.get_world_size(), dist.get_rank()
    own = None
    for ranks in ring_group_ranks(world_size, ring_size):
        group = dist.new_group(ranks)
        if rank in ranks:
            own = RingGroup(group=group, rank=ranks.index(rank), size=ring_size, head_stride=head_stride)
    return own


@dataclass(frozen=True)
class RingChunk:
    """What one rank of a ring computes of a packed row: the queries of tokens [start, end), attending to the keys
    [key_start, end) — its samples' earlier tokens included — within the sample boundaries `bounds` (relative to
    `start` for queries and to `key_start` for keys)."""

    start: int
    end: int
    key_start: int
    bounds: VarlenBounds


def ring_chunk(cu_seq_lens: list[int], rank: int, ring_size: int, device=None) -> RingChunk:
    """Rank `rank`'s chunk of a packed row whose sample boundaries `cu_seq_lens` end at a multiple of `ring_size`
    (pad the row first): equal chunks in rank order. The first sample the chunk touches may have begun on an
    earlier rank: its keys start at that sample's first token, and its queries are its last keys (bottom-right)."""
    total = cu_seq_lens[-1]
    if total % ring_size:
        raise ValueError(f"a ring of {ring_size} ranks splits rows whose length is a multiple of {ring_size}: got "
                         f"{total} tokens; pad the row first (ring_batch.shard_packed_row does)")
    size = total // ring_size
    start, end = rank * size, (rank + 1) * size
    first = bisect_right(cu_seq_lens, start) - 1  # the sample holding token `start`
    last = bisect_left(cu_seq_lens, end)          # the first boundary at or after `end`
    inner = cu_seq_lens[first + 1:last]           # sample starts strictly inside the chunk
    key_start = cu_seq_lens[first]
    q_bounds = [0, *(b - start for b in inner), end - start]
    k_bounds = [0, *(b - key_start for b in inner), end - key_start]
    bounds = VarlenBounds(cu_q=torch.tensor(q_bounds, dtype=torch.int32, device=device),
                          cu_k=torch.tensor(k_bounds, dtype=torch.int32, device=device),
                          max_q=max(b - a for a, b in zip(q_bounds, q_bounds[1:])),
                          max_k=max(b - a for a, b in zip(k_bounds, k_bounds[1:])))
    return RingChunk(start=start, end=end, key_start=key_start, bounds=bounds)


class _GatherChunks(torch.autograd.Function):
    """All-gather of equal chunks along dim 1, in ring order; the backward gives each rank the sum over the ring of
    the gradients of its own chunk (other ranks' queries attended to its keys)."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, ring: RingGroup) -> torch.Tensor:
        ctx.ring = ring
        parts = [torch.empty_like(local) for _ in range(ring.size)]
        dist.all_gather(parts, local.contiguous(), group=ring.group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        parts = [part.contiguous() for part in grad.chunk(ctx.ring.size, dim=1)]
        own = torch.empty_like(parts[0])
        dist.reduce_scatter(own, parts, group=ctx.ring.group)
        return own, None


class _GatherResults(torch.autograd.Function):
    """All-gather of per-token results of varying counts along dim 0, in ring order. Every rank then computes the
    same function of the whole, so the backward keeps this rank's own part of the gradient (no communication)."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, counts: tuple[int, ...], ring: RingGroup) -> torch.Tensor:
        ctx.offset, ctx.count = sum(counts[:ring.rank]), counts[ring.rank]
        most = max(counts)
        padded = local.new_zeros((most, *local.shape[1:]))
        padded[:local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded, group=ring.group)
        return torch.cat([part[:count] for part, count in zip(parts, counts)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad[ctx.offset:ctx.offset + ctx.count], None, None


def gather_results(local: torch.Tensor, counts: tuple[int, ...], ring: RingGroup) -> torch.Tensor:
    """Each rank's per-token results (`counts[r]` rows on rank r) as one tensor in ring order, on every rank."""
    if local.shape[0] != counts[ring.rank]:
        raise ValueError(f"ring rank {ring.rank} holds {local.shape[0]} results, its share says {counts[ring.rank]}")
    if not any(counts):  # every rank knows the counts: none communicates for a micro-batch without responses
        return local
    return _GatherResults.apply(local, tuple(counts), ring)


def attend_chunk(q, k, v, gather_keys: Callable[[torch.Tensor], torch.Tensor], chunk: RingChunk, scale: float,
                 head_stride: int) -> torch.Tensor:
    """A rank's attention output (Lc, Hq, D) for its queries q (Lc, Hq, D), given its keys and values k/v (Lc, Hkv, D).

    For `head_stride` K/V heads at a time, `gather_keys` turns this rank's (2, Lc, S, D) keys and values into the
    row's (2, N·Lc, S, D); the heads' queries attend to the keys `chunk.key_start:chunk.end` of it. Query head h
    reads K/V head h // (Hq / Hkv), as transformers' repeat_kv.
    """
    num_kv_heads = k.shape[1]
    if num_kv_heads % head_stride:
        raise ValueError(f"ds.ring_attn_head_stride must divide the model's {num_kv_heads} K/V heads: got "
                         f"{head_stride}; use a divisor of {num_kv_heads}")
    per_kv_head = q.shape[1] // num_kv_heads
    outputs = []
    for first in range(0, num_kv_heads, head_stride):
        heads = slice(first, first + head_stride)
        row = gather_keys(torch.stack((k[:, heads], v[:, heads])))
        keys = row[:, chunk.key_start:chunk.end]
        queries = q[:, first * per_kv_head:(first + head_stride) * per_kv_head]
        outputs.append(causal_varlen_attention(queries, keys[0], keys[1], chunk.bounds, scale))
    return torch.cat(outputs, dim=1)


@dataclass(frozen=True)
class RingAttentionInputs:
    """The kernel's keyword argument `ring_attention`: the ring and this rank's chunk of the row."""

    ring: RingGroup
    chunk: RingChunk


def register_ring_attention() -> str:
    """Make `hybrid_ring` a transformers attention kernel in this process (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(RING_ATTENTION, ring_attention_forward)
    return RING_ATTENTION


def ring_attention_forward(module, query, key, value, attention_mask, scaling: float | None = None,
                           dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-kernel signature: query (1, Hq, Lc, D), key/value (1, Hkv, Lc, D) of this rank's chunk
    → ((1, Lc, Hq, D), no weights). Without `ring_attention` in the keyword arguments (a forward of whole rows) it
    is the `hybrid_varlen` kernel."""
    inputs: RingAttentionInputs | None = kwargs.get("ring_attention")
    if inputs is None:
        return varlen_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"the {RING_ATTENTION} attention kernel takes one packed row: got {query.shape[0]} rows")
    if dropout:
        raise ValueError(f"the {RING_ATTENTION} attention kernel has no dropout: got {dropout}")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (Lc, H, D)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    ring = inputs.ring
    out = attend_chunk(q, k, v, lambda local: _GatherChunks.apply(local, ring), inputs.chunk, scale,
                       ring.head_stride)
    return out.unsqueeze(0), None
