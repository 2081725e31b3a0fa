"""Ring attention's ranks simulated in one process, for the CPU unit tests and the GPU test: every rank's
`ring_attention.attend_chunk` in turn, its all-gather played by slices of the whole (padded) row."""
from __future__ import annotations

import torch

from hybrid_core.engines.ring_attention import attend_chunk, ring_chunk
from hybrid_core.engines.ring_batch import padded_length


def simulated_ring_attention(q, k, v, lengths: list[int], ring_size: int, head_stride: int) -> torch.Tensor:
    """q (L, Hq, D), k/v (L, Hkv, D) of a packed row of samples of `lengths` → (L, Hq, D): the ranks' chunks of the
    attention output put back together, the padding dropped (differentiable in q, k and v)."""
    total, num_kv_heads = sum(lengths), k.shape[1]
    pad = padded_length(total, ring_size) - total
    cu = [0, *torch.tensor(lengths).cumsum(0).tolist()] + ([total + pad] if pad else [])
    row_q, row_k, row_v = (torch.cat([t, t.new_zeros((pad, *t.shape[1:]))]) for t in (q, k, v))
    outputs = []
    for rank in range(ring_size):
        chunk = ring_chunk(cu, rank, ring_size, q.device)
        groups = iter(range(0, num_kv_heads, head_stride))  # the order in which attend_chunk gathers head groups

        def gather(local_kv, groups=groups):
            first = next(groups)
            return torch.stack((row_k[:, first:first + head_stride], row_v[:, first:first + head_stride]))

        local = slice(chunk.start, chunk.end)
        outputs.append(attend_chunk(row_q[local], row_k[local], row_v[local], gather, chunk, q.shape[-1] ** -0.5,
                                    head_stride))
    return torch.cat(outputs)[:total]
