"""Ring attention's maths without a process group (hybrid_core.engines.ring_attention, ring_batch): which queries
and keys each rank's chunk of a packed row holds, which labels it predicts (shifted over the whole row before the
split), and, with the ranks simulated in one process, that the chunks' attention outputs and gradients put together
are the whole row's per-sample causal attention, computed here by hand."""
from __future__ import annotations

import pytest
import torch

from hybrid_core.engines.ring_attention import RingGroup, attend_chunk, ring_chunk
from hybrid_core.engines.ring_batch import padded_length, shard_packed_row
from hybrid_core.engines.sequence_batch import make_sequence_batch
from hybrid_core.layout import ring_group_ranks
from tests.ring_simulation import simulated_ring_attention

PAD = 99


def _bounds(chunk) -> tuple[list[int], list[int], int, int]:
    b = chunk.bounds
    assert b.cu_q.dtype == b.cu_k.dtype == torch.int32
    return b.cu_q.tolist(), b.cu_k.tolist(), b.max_q, b.max_k


def test_chunks_by_hand():
    # samples of 5, 3 and 6 tokens, padded to 16 by a sample of 2; four ranks of 4 tokens
    cu = [0, 5, 8, 14, 16]
    chunks = [ring_chunk(cu, rank, 4) for rank in range(4)]
    assert [(c.start, c.end, c.key_start) for c in chunks] == [(0, 4, 0), (4, 8, 0), (8, 12, 8), (12, 16, 8)]
    assert _bounds(chunks[0]) == ([0, 4], [0, 4], 4, 4)
    # token 4 ends sample 0, whose keys began on rank 0: 1 query over 5 keys; then sample 1 whole (3 over 3)
    assert _bounds(chunks[1]) == ([0, 1, 4], [0, 5, 8], 3, 5)
    assert _bounds(chunks[2]) == ([0, 4], [0, 4], 4, 4)  # the chunk starts exactly at sample 2
    # tokens 12-13 end sample 2 (keys from 8: 6), then the padding sample (2 over 2)
    assert _bounds(chunks[3]) == ([0, 2, 4], [0, 6, 8], 2, 6)
    with pytest.raises(ValueError, match="multiple of 4: got 14 tokens"):
        ring_chunk([0, 5, 8, 14], 0, 4)


def test_ring_groups_are_consecutive_ranks():
    assert ring_group_ranks(4, 2) == [[0, 1], [2, 3]]
    assert ring_group_ranks(6, 3) == [[0, 1, 2], [3, 4, 5]]
    assert ring_group_ranks(2, 1) == [[0], [1]]
    with pytest.raises(ValueError, match="got 4 for 6 ranks"):
        ring_group_ranks(6, 4)


def _ring(rank: int, size: int, head_stride: int = 1) -> RingGroup:
    return RingGroup(group=None, rank=rank, size=size, head_stride=head_stride)  # splitting never communicates


def test_labels_are_shifted_over_the_whole_row_before_the_split():
    # row: 11 12 13 14 15 16 17 | 21 22 23 24 | pad (11 tokens → 12, two chunks of 6)
    batch = make_sequence_batch([[11, 12, 13], [21, 22]], [[14, 15, 16, 17], [23, 24]], PAD, is_packed=True)
    first, second = (shard_packed_row(batch, _ring(rank, 2), PAD) for rank in range(2))
    assert first.input_ids.tolist() == [[11, 12, 13, 14, 15, 16]]
    assert second.input_ids.tolist() == [[17, 21, 22, 23, 24, PAD]]
    assert second.position_ids.tolist() == [[6, 0, 1, 2, 3, 0]]  # sample 0 goes on; the padding starts at 0
    # positions 2-5 predict 14-17: position 5, the last of rank 0's chunk, predicts 17, rank 1's first token
    assert first.response_positions.tolist() == [2, 3, 4, 5] and first.response_ids.tolist() == [14, 15, 16, 17]
    assert second.response_positions.tolist() == [2, 3] and second.response_ids.tolist() == [23, 24]  # rows 8, 9
    assert first.counts == second.counts == (4, 2)
    assert (second.chunk.start, second.chunk.key_start) == (6, 0)
    assert _bounds(second.chunk) == ([0, 1, 5, 6], [0, 7, 11, 12], 4, 7)
    assert padded_length(11, 2) == 12 and padded_length(12, 3) == 12


def test_a_row_that_splits_evenly_gets_no_padding_sample():
    batch = make_sequence_batch([[1, 2], [3]], [[4], [5, 6]], PAD, is_packed=True)  # 1 2 4 | 3 5 6: 3 ranks
    shards = [shard_packed_row(batch, _ring(rank, 3), PAD) for rank in range(3)]
    assert [s.input_ids.tolist() for s in shards] == [[[1, 2]], [[4, 3]], [[5, 6]]]
    assert [s.response_positions.tolist() for s in shards] == [[1], [1], [0]]  # row positions 1, 3 and 4
    assert [s.response_ids.tolist() for s in shards] == [[4], [5], [6]]
    assert _bounds(shards[1].chunk) == ([0, 1, 2], [0, 3, 4], 1, 3)
    padded = make_sequence_batch([[1, 2]], [[4]], PAD)
    with pytest.raises(ValueError, match="ds.packing_samples"):
        shard_packed_row(padded, _ring(0, 2), PAD)


LENGTHS = [5, 9, 1, 12, 4]  # samples of a packed row (31 tokens)
HEADS, KV_HEADS, DIM = 4, 2, 8


def _reference_attention(q, k, v, lengths: list[int]) -> torch.Tensor:
    """Per-sample causal softmax attention, written out: query head h reads K/V head h // (Hq / Hkv)."""
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    parts, start = [], 0
    for n in lengths:
        scores = torch.einsum("qhd,khd->hqk", q[start:start + n], k[start:start + n]) * DIM ** -0.5
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        parts.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v[start:start + n]))
        start += n
    return torch.cat(parts)


@pytest.mark.parametrize("ring_size, head_stride", [(2, 1), (2, 2), (3, 1), (4, 2)])
def test_the_chunks_attention_and_gradients_are_the_whole_rows(ring_size, head_stride):
    g = torch.Generator().manual_seed(ring_size * 10 + head_stride)
    total = sum(LENGTHS)
    q, k, v = (torch.randn(total, heads, DIM, generator=g, dtype=torch.float64, requires_grad=True)
               for heads in (HEADS, KV_HEADS, KV_HEADS))
    weights = torch.randn(total, HEADS, DIM, generator=g, dtype=torch.float64)
    expected = _reference_attention(q, k, v, LENGTHS)
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    got = simulated_ring_attention(q, k, v, LENGTHS, ring_size, head_stride)
    got_grads = torch.autograd.grad((got * weights).sum(), (q, k, v))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    for name, got_grad, expected_grad in zip("qkv", got_grads, expected_grads):
        torch.testing.assert_close(got_grad, expected_grad, rtol=0, atol=1e-12, msg=name)


def test_the_head_stride_must_divide_the_kv_heads():
    q, kv = torch.zeros(4, 6, DIM), torch.zeros(4, 3, DIM)
    chunk = ring_chunk([0, 4], 0, 1)
    with pytest.raises(ValueError, match="must divide the model's 3 K/V heads: got 2; use a divisor of 3"):
        attend_chunk(q, kv, kv, lambda local: local, chunk, 1.0, head_stride=2)
