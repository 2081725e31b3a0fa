"""Padded prompt+response batches and per-token response logprobs from a causal LM forward.

Owns the layout shared by the actor, reference and critic forwards: each row is prompt + response, right-padded;
response tensors are (B, T) with T the longest response, left-aligned, masked by `response_mask`.
It knows nothing about DeepSpeed, vLLM or where the sequences came from.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SequenceBatch:
    input_ids: torch.Tensor       # (B, L) long, prompt + response, right-padded
    attention_mask: torch.Tensor  # (B, L) long
    response_index: torch.Tensor  # (B, T) long: position in the row of the logits that predict response token t
    response_ids: torch.Tensor    # (B, T) long, padded with 0
    response_mask: torch.Tensor   # (B, T) float 0/1

    def to(self, device) -> "SequenceBatch":
        return SequenceBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.response_index,
                                                       self.response_ids, self.response_mask)))


def make_sequence_batch(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int) -> SequenceBatch:
    """Pack prompt/response token lists into padded tensors (one row per sample)."""
    assert len(prompt_ids) == len(response_ids), (len(prompt_ids), len(response_ids))
    rows = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids)]
    B, L = len(rows), max(len(r) for r in rows)
    T = max(1, max(len(r) for r in response_ids))
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, L), dtype=torch.long)
    response_index = torch.zeros((B, T), dtype=torch.long)
    resp = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        n = len(p) + len(r)
        input_ids[i, :n] = torch.tensor(rows[i], dtype=torch.long)
        attention_mask[i, :n] = 1
        if r:
            response_index[i, :len(r)] = torch.arange(len(p) - 1, len(p) - 1 + len(r))
            resp[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = 1.0
    return SequenceBatch(input_ids, attention_mask, response_index, resp, mask)


def response_logits(model, batch: SequenceBatch) -> torch.Tensor:
    """Logits (B, T, V) at the positions that predict each response token."""
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=position_ids, use_cache=False).logits
    index = batch.response_index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    return torch.gather(logits, 1, index)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] in fp32 without materialising the whole log-softmax twice. (B, T)."""
    logits = logits.float()
    picked = torch.gather(logits, -1, token_ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def response_logprobs(model, batch: SequenceBatch) -> torch.Tensor:
    """Per-token logprobs (B, T) of the response tokens, zero where `response_mask` is 0."""
    return token_logprobs(response_logits(model, batch), batch.response_ids) * batch.response_mask


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
                             micro_batch_size: int) -> list[list[float]]:
    """Ragged per-sample results of `per_token_fn(model, batch) -> (B, T)` over every response, `micro_batch_size`
    rows at a time, without gradients (response logprobs of a policy, values of a critic)."""
    device = next(model.parameters()).device
    out: list[list[float]] = []
    with torch.no_grad():
        for i in range(0, len(prompt_ids), micro_batch_size):
            batch = make_sequence_batch(prompt_ids[i:i + micro_batch_size], response_ids[i:i + micro_batch_size],
                                        pad_id).to(device)
            out.extend(unpad(per_token_fn(model, batch).float().cpu(), batch.response_mask.cpu()))
    return out
