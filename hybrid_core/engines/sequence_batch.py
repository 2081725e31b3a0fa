"""Prompt+response batches in two layouts, the micro-batching of a sample list, and no-grad per-token forwards.

Owns the layout shared by the actor, reference and critic forwards. Padded: one right-padded row per sample.
Packed (`ds.packing_samples`): the samples back to back in one row, positions restarting at 0 for each, no attention
mask, and the samples' boundaries (`cu_seq_lens`) for the varlen kernel; the other kernels find the boundaries from the
positions (`masking_utils.find_packed_sequence_indices`). Either way tokens attend within their own sample only.
Response tensors are (B, T) with T the longest response, left-aligned, masked by `response_mask`, in both layouts;
the N response positions (`response_positions`) are where a head's outputs are taken (`vocab_head` for logprobs).
With ring attention (`on_ring`) a packed batch carries this rank's share (`ring_batch.RingShard`): the model sees the
rank's chunk, the response positions and labels are the chunk's, and `to_response_layout` gathers the ring's results
into the whole (B, T). It knows nothing about DeepSpeed, vLLM or where the sequences came from.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from itertools import accumulate, chain
from typing import Callable

import numpy as np
import torch

from hybrid_core.config import LOGIT_CHUNK_TOKENS
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
        """The batch on `device`. To a GPU the copies are queued behind the work already there instead of waiting
        for it (`to_device`), so the host prepares the next micro-batch while the GPU computes this one."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return SequenceBatch(**{k: to_device(v, device) if isinstance(v, torch.Tensor) else v
                                for k, v in moved.items()})


def to_device(tensor: torch.Tensor, device) -> torch.Tensor:
    """`tensor` (in host memory) on `device`. To a GPU the copy is queued without waiting for the GPU's queue:
    PyTorch's blocking copy synchronizes the whole stream, and from pageable memory CUDA takes the bytes before the
    call returns, so the source may change right after."""
    return tensor.to(device, non_blocking=torch.device(device).type == "cuda")


@dataclass(frozen=True, kw_only=True)
class MicroBatching:
    """How a list of samples is cut into forward micro-batches and laid out.

    `max_tokens` None: `num_samples` samples per micro-batch. Otherwise (dynamic batching) a token budget: see
    `split_micro_batches`. `is_packed`: one unpadded row per micro-batch instead of one padded row per sample.
    `logit_chunk_tokens`: response tokens the vocabulary head sees at a time (`vocab_head`; value heads ignore it).
    `logprob_kernel` and `packed_attention`: the run's `ds.logprob_kernel` and `ds.packed_attention` (None: unset,
    see `switches`).
    """

    num_samples: int
    max_tokens: int | None = None
    is_packed: bool = False
    logit_chunk_tokens: int = LOGIT_CHUNK_TOKENS
    logprob_kernel: str | None = None
    packed_attention: str | None = None


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


def to_response_layout(values: torch.Tensor, batch: SequenceBatch) -> torch.Tensor:
    """(N,) per-response-token values → (B, T), zero where `response_mask` is 0 (differentiable). On a ring, this
    rank's (n,) values: the ring's are gathered first, so every rank gets the whole (B, T)."""
    if batch.ring is not None:
        values = batch.ring.gather(values)
    mask = batch.response_mask.bool()
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)


def unpad(values: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    """(B, T) tensor → ragged per-sample lists of the unmasked entries (for Arrow list columns)."""
    lengths = mask.sum(-1).long().tolist()
    return [values[i, :n].tolist() for i, n in enumerate(lengths)]


def pad(rows: list[list[float]], T: int | None = None) -> torch.Tensor:
    """Ragged lists → (B, T) float32, zero padded (each value rounded to float32 as `torch.tensor` rounds it); a
    None row (an Arrow null) is an empty one."""
    rows = [row if row is not None else () for row in rows]
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    T = T or max(1, int(lengths.max(initial=0)))
    if lengths.max(initial=0) > T:
        raise ValueError(f"a row of {int(lengths.max())} values does not fit in {T} columns")
    with np.errstate(over="ignore"):  # beyond float32's range is ±inf, as torch.tensor gives, without a warning
        flat = np.fromiter(chain.from_iterable(rows), dtype=np.float32, count=int(lengths.sum()))
    out = np.zeros((len(rows), T), dtype=np.float32)
    out[np.arange(T) < lengths[:, None]] = flat  # row-major: each row's first len(row) columns, rows in order
    return torch.from_numpy(out)


class HostCopy:
    """(B, T) per-token results on their way to host memory: on a GPU the copy is queued behind the forward that
    computes them, and `rows` waits for it only when they are read (after the next micro-batch's forward has been
    queued, so the GPU does not wait for the host between micro-batches)."""

    def __init__(self, values: torch.Tensor, response_mask: torch.Tensor):
        self.values = values.to("cpu", non_blocking=values.is_cuda)  # non-blocking: into pinned host memory
        self.mask = response_mask.to("cpu", non_blocking=response_mask.is_cuda)
        self.copied = torch.cuda.Event() if values.is_cuda or response_mask.is_cuda else None
        if self.copied is not None:
            self.copied.record()

    def rows(self) -> list[list[float]]:
        if self.copied is not None:
            self.copied.synchronize()
        return unpad(self.values, self.mask)


def placeholder_batch(pad_id: int, is_packed: bool) -> SequenceBatch:
    """One sample of one prompt and one response token (the pad id): the forward a ZeRO-3 rank runs where its share
    of the samples is short. ZeRO-3 gathers the partitioned parameters inside every forward, from every rank, so a
    rank that skipped one would leave its peers waiting."""
    return make_sequence_batch([[pad_id]], [[pad_id]], pad_id, is_packed)


def batched_response_forward(per_token_fn, model, prompt_ids, response_ids, pad_id: int, batching: MicroBatching,
                             ring: RingGroup | None = None,
                             agree_on_count: Callable[[int], int] | None = None) -> list[list[float]]:
    """Ragged per-sample results of `per_token_fn(model, batch) -> (B, T)` over every response, micro-batched by
    `batching`, without gradients (response logprobs of a policy, values of a critic). Sample order is kept. With a
    `ring`, every rank of it must be given the same samples: each computes its chunk of every micro-batch.

    `agree_on_count` maps this rank's number of micro-batches to the number every rank runs (ZeRO-3 ranks run the
    same number of forwards); the missing ones are placeholder forwards whose results are dropped.
    """
    device = next(model.parameters()).device
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    micro_batches = split_micro_batches(list(range(len(prompt_ids))), lengths, batching)
    num_forwards = agree_on_count(len(micro_batches)) if agree_on_count is not None else len(micro_batches)
    out: list[list[float]] = []
    arriving: HostCopy | None = None  # the previous micro-batch's results, read while this one's forward runs
    with torch.no_grad():
        for indices in micro_batches:
            batch = make_sequence_batch([prompt_ids[i] for i in indices], [response_ids[i] for i in indices], pad_id,
                                        batching.is_packed)
            results = per_token_fn(model, on_ring(batch.to(device), ring, pad_id))
            if arriving is not None:
                out.extend(arriving.rows())
            arriving = HostCopy(results.float(), batch.response_mask)
        if arriving is not None:
            out.extend(arriving.rows())
        for _ in range(num_forwards - len(micro_batches)):
            per_token_fn(model, on_ring(placeholder_batch(pad_id, batching.is_packed).to(device), ring, pad_id))
    return out
