"""Prompt+response batches in two layouts, the micro-batching of a sample list, and per-token response logprobs.

Owns the layout shared by the actor, reference and critic forwards. Padded: one right-padded row per sample.
Packed (`ds.packing_samples`): the samples back to back in one row, positions restarting at 0 for each, no attention
mask, and the samples' boundaries (`cu_seq_lens`) for the varlen kernel; the other kernels find the boundaries from the
positions (`masking_utils.find_packed_sequence_indices`). Either way tokens attend within their own sample only.
Response tensors are (B, T) with T the longest response, left-aligned, masked by `response_mask`, in both layouts;
logits are taken at the N response positions only (`response_logits`). With ring attention (`on_ring`) a packed
batch carries this rank's share (`ring_batch.RingShard`): the model sees the rank's chunk, the response positions
and labels are the chunk's, and `to_response_layout` gathers the ring's results into the whole (B, T). It knows
nothing about DeepSpeed, vLLM or where the sequences came from.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from itertools import accumulate

import torch

from hybrid_core.engines.ring_attention import RingGroup
from hybrid_core.engines.ring_batch import RingShard, shard_packed_row


@dataclass
class SequenceBatch:
    input_ids: torch.Tensor              # (R, L) long: R = B padded rows, or R = 1 packed row of every sample
    attention_mask: torch.Tensor | None  # (R, L) long when padded; None when packed (positions mark the samples)
    position_ids: torch.Tensor           # (R, L) long, restarting at 0 for each sample
    response_index: torch.Tensor         # (B, T) long: index into the R·L flattened positions of the logits
    #                                      that predict response token t
    response_ids: torch.Tensor           # (B, T) long, padded with 0
    response_mask: torch.Tensor          # (B, T) float 0/1
    cu_seq_lens: torch.Tensor | None = None  # packed: (B + 1,) int32 sample boundaries in the row; None when padded
    max_length: int = 0                  # packed: the longest sample (the varlen kernel's bound)
    ring: RingShard | None = None        # ring attention: this rank's share of the packed row (`on_ring`)

    @property
    def response_positions(self) -> torch.Tensor:
        """(N,) the flat positions whose logits predict the N response tokens, in row-major (B, T) order; on a ring,
        the n of them in this rank's chunk, as positions of the chunk."""
        if self.ring is not None:
            return self.ring.response_positions
        return self.response_index[self.response_mask.bool()]

    @property
    def flat_response_ids(self) -> torch.Tensor:
        """(N,) the response tokens in the order of `response_positions` (on a ring, this rank's n)."""
        if self.ring is not None:
            return self.ring.response_ids
        return self.response_ids[self.response_mask.bool()]

    def to(self, device) -> "SequenceBatch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return SequenceBatch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()})


@dataclass(frozen=True, kw_only=True)
class MicroBatching:
    """How a list of samples is cut into forward micro-batches and laid out.

    `max_tokens` None: `num_samples` samples per micro-batch. Otherwise (dynamic batching) a token budget: see
    `split_micro_batches`. `is_packed`: one unpadded row per micro-batch instead of one padded row per sample.
    """

    num_samples: int
    max_tokens: int | None = None
    is_packed: bool = False


def make_sequence_batch(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int,
                        is_packed: bool = False) -> SequenceBatch:
    """Lay prompt/response token lists out as tensors: one padded row per sample, or one packed row."""
    assert len(prompt_ids) == len(response_ids), (len(prompt_ids), len(response_ids))
    rows = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids)]
    lengths = [len(r) for r in rows]
    if is_packed:
        input_ids = torch.tensor([[t for row in rows for t in row]], dtype=torch.long)
        position_ids = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        starts = [0, *accumulate(lengths)]
        return SequenceBatch(input_ids, None, position_ids, *_response_tensors(prompt_ids, response_ids, starts[:-1]),
                             cu_seq_lens=torch.tensor(starts, dtype=torch.int32), max_length=max(lengths))
    B, L = len(rows), max(lengths)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, L), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, :len(row)] = 1
    position_ids, starts = (attention_mask.cumsum(-1) - 1).clamp(min=0), [i * L for i in range(B)]
    return SequenceBatch(input_ids, attention_mask, position_ids, *_response_tensors(prompt_ids, response_ids, starts))


def _response_tensors(prompt_ids, response_ids, starts: list[int]):
    """(response_index, response_ids, response_mask), each (B, T); `starts`: each sample's first flat position."""
    B, T = len(response_ids), max(1, max(len(r) for r in response_ids))
    index = torch.zeros((B, T), dtype=torch.long)
    ids = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    for i, (p, r, start) in enumerate(zip(prompt_ids, response_ids, starts)):
        if r:  # the logits at position len(prompt) − 1 + t of the sample predict its response token t
            index[i, :len(r)] = torch.arange(start + len(p) - 1, start + len(p) - 1 + len(r))
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = 1.0
    return index, ids, mask


def micro_batch_tokens(sequence_lengths: list[int], is_packed: bool) -> int:
    """Tokens a micro-batch's input holds: the sum of its lengths packed; rows × the longest row padded."""
    return sum(sequence_lengths) if is_packed else len(sequence_lengths) * max(sequence_lengths, default=0)


def split_micro_batches(indices: list[int], sequence_lengths: list[int], batching: MicroBatching) -> list[list[int]]:
    """Cut `indices` into micro-batches, keeping their order.

    Fixed: `batching.num_samples` at a time. Dynamic (`max_tokens` set): greedy next-fit in the given order — a
    micro-batch takes the next sample while `micro_batch_tokens` of its prompt+response lengths stays within the
    budget, so the tensors a forward sees never exceed it; a sample longer than the budget alone is a micro-batch of
    its own (it must be trained on; the budget bounds batching, not which samples are used).
    `sequence_lengths[i]` is sample i's prompt+response token count.
    """
    if batching.max_tokens is None:
        n = batching.num_samples
        return [indices[m:m + n] for m in range(0, len(indices), n)]
    micro_batches: list[list[int]] = []
    current: list[int] = []
    for i in indices:
        lengths = [sequence_lengths[j] for j in current] + [sequence_lengths[i]]
        if current and micro_batch_tokens(lengths, batching.is_packed) > batching.max_tokens:
            micro_batches.append(current)
            current = []
        current.append(i)
    if current:
        micro_batches.append(current)
    return micro_batches


def on_ring(batch: SequenceBatch, ring: RingGroup | None, pad_id: int) -> SequenceBatch:
    """`batch` as this rank of `ring` computes it (`batch` itself without a ring)."""
    return batch if ring is None else replace(batch, ring=shard_packed_row(batch, ring, pad_id))


def model_inputs(batch: SequenceBatch) -> dict:
    """The model's keyword arguments for `batch`. Packed, they include the samples' boundaries under transformers'
    flash-attention names, which the varlen kernel reads (`varlen_attention`) and the others ignore; on a ring,
    this rank's chunk and the ring kernel's inputs."""
    if batch.ring is not None:
        return batch.ring.model_inputs()
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
              "position_ids": batch.position_ids, "use_cache": False}
    if batch.cu_seq_lens is not None:
        inputs |= {"cu_seq_lens_q": batch.cu_seq_lens, "cu_seq_lens_k": batch.cu_seq_lens,
                   "max_length_q": batch.max_length, "max_length_k": batch.max_length}
    return inputs


def response_logits(model, batch: SequenceBatch) -> torch.Tensor:
    """Logits (N, V) at the N positions that predict a response token (`batch.response_positions`). Packed, the
    vocabulary head runs on those positions only (`logits_to_keep`), not on prompts; padded, on every position."""
    if batch.attention_mask is None:
        return model(**model_inputs(batch), logits_to_keep=batch.response_positions).logits[0]
    return model(**model_inputs(batch)).logits.flatten(0, 1)[batch.response_positions]


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] in fp32 without materialising the whole log-softmax twice: (…, V) → (…)."""
    logits = logits.float()
    picked = torch.gather(logits, -1, token_ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def to_response_layout(values: torch.Tensor, batch: SequenceBatch) -> torch.Tensor:
    """(N,) per-response-token values → (B, T), zero where `response_mask` is 0 (differentiable). On a ring, this
    rank's (n,) values: the ring's are gathered first, so every rank gets the whole (B, T)."""
    if batch.ring is not None:
        values = batch.ring.gather(values)
    mask = batch.response_mask.bool()
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)


def response_logprobs(model, batch: SequenceBatch) -> torch.Tensor:
    """Per-token logprobs (B, T) of the response tokens, zero where `response_mask` is 0."""
    return to_response_layout(token_logprobs(response_logits(model, batch), batch.flat_response_ids), batch)


def unpad(values: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    """(B, T) tensor → ragged per-sample lists of the unmasked entries (for Arrow list columns)."""
    lengths = mask.sum(-1).long().tolist()
    return [values[i, :n].tolist() for i, n in enumerate(lengths)]


def pad(rows: list[list[float]], T: int | None = None) -> torch.Tensor:
    """Ragged lists → (B, T) float32, zero padded."""
    T = T or max(1, max(len(r) for r in rows))
    out = torch.zeros((len(rows), T), dtype=torch.float32)
    for i, r in enumerate(rows):
        if r:
            out[i, :len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


def batched_response_forward(per_token_fn, model, prompt_ids, response_ids, pad_id: int,
                             batching: MicroBatching, ring: RingGroup | None = None) -> list[list[float]]:
    """Ragged per-sample results of `per_token_fn(model, batch) -> (B, T)` over every response, micro-batched by
    `batching`, without gradients (response logprobs of a policy, values of a critic). Sample order is kept. With a
    `ring`, every rank of it must be given the same samples: each computes its chunk of every micro-batch."""
    device = next(model.parameters()).device
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    out: list[list[float]] = []
    with torch.no_grad():
        for indices in split_micro_batches(list(range(len(prompt_ids))), lengths, batching):
            batch = make_sequence_batch([prompt_ids[i] for i in indices], [response_ids[i] for i in indices], pad_id,
                                        batching.is_packed).to(device)
            batch = on_ring(batch, ring, pad_id)
            out.extend(unpad(per_token_fn(model, batch).float().cpu(), batch.response_mask.cpu()))
    return out
