"""One packed micro-batch as a rank of a ring group computes it (ring attention, `ds.ring_attn_size`).

Every rank of a ring holds the whole micro-batch (the same samples, cut alike), so each computes its share locally:
the row is padded at its end to a multiple of the ring size (the padding is a sample of its own: nothing attends to
it, its outputs are dropped), cut into equal chunks in rank order, and a rank feeds its chunk's tokens and positions
to the model. Its vocabulary head (or value head) runs at the response positions inside its chunk, labelled from
the whole row: labels are shifted before the split, so the token at a chunk's end predicts the first token of the
next rank's chunk. The ranks' per-token results, gathered in ring order, are the row's in its own order (response
positions ascend through a packed row). It knows nothing about models, DeepSpeed or RL.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybrid_core.engines.ring_attention import RingAttentionInputs, RingChunk, RingGroup, gather_results, ring_chunk


@dataclass(frozen=True)
class RingShard:
    """This rank's share of a packed micro-batch."""

    ring: RingGroup
    chunk: RingChunk
    input_ids: torch.Tensor           # (1, Lc) the chunk's tokens
    position_ids: torch.Tensor        # (1, Lc) their positions in their samples
    response_positions: torch.Tensor  # (n,) chunk positions whose logits predict a response token
    response_ids: torch.Tensor        # (n,) the tokens they predict (taken from the whole row)
    counts: tuple[int, ...]           # response positions in each rank's chunk, in ring order

    def model_inputs(self) -> dict:
        """The model's keyword arguments for this rank's chunk (`ring_attention` is the `hybrid_ring` kernel's)."""
        return {"input_ids": self.input_ids, "attention_mask": None, "position_ids": self.position_ids,
                "use_cache": False, "ring_attention": RingAttentionInputs(ring=self.ring, chunk=self.chunk)}

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """(n, …) results at this rank's response positions → (N, …) the row's, in `response_positions` order
        (differentiable: each rank's gradient flows back to its own results)."""
        return gather_results(values, self.counts, self.ring)


def padded_length(num_tokens: int, ring_size: int) -> int:
    """The row's length once padded to equal chunks."""
    return -(-num_tokens // ring_size) * ring_size


def shard_packed_row(batch, ring: RingGroup, pad_id: int) -> RingShard:
    """`batch` (a packed `sequence_batch.SequenceBatch` without a ring) as rank `ring.rank` of `ring` computes it."""
    if batch.cu_seq_lens is None:
        raise ValueError("ring attention splits packed rows: got a padded batch; set --ds.packing_samples")
    bounds = batch.cu_seq_lens.tolist()
    length = padded_length(bounds[-1], ring.size)
    pad = length - bounds[-1]
    if pad:  # a sample of padding of its own, positions from 0 like any other
        bounds.append(length)
    device = batch.input_ids.device
    input_ids = F.pad(batch.input_ids, (0, pad), value=pad_id)
    position_ids = torch.cat([batch.position_ids, torch.arange(pad, device=device).unsqueeze(0)], dim=1)
    chunk = ring_chunk(bounds, ring.rank, ring.size, device)
    positions = batch.response_positions
    chunk_edges = torch.arange(ring.size + 1, device=device) * (length // ring.size)
    cuts = torch.searchsorted(positions, chunk_edges).tolist()  # positions ascend: each chunk's are contiguous
    first, last = cuts[ring.rank], cuts[ring.rank + 1]
    return RingShard(ring=ring, chunk=chunk, input_ids=input_ids[:, chunk.start:chunk.end],
                     position_ids=position_ids[:, chunk.start:chunk.end],
                     response_positions=positions[first:last] - chunk.start,
                     response_ids=batch.flat_response_ids[first:last],
                     counts=tuple(b - a for a, b in zip(cuts, cuts[1:])))
