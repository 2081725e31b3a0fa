"""The update loop shared by the actor and the critic: epochs × optimizer steps × micro-batches over a step's samples.

Owns batching (seeded shuffles, `train.batch_size` samples per optimizer step — the last one may be smaller when
filtering left fewer samples —, then micro-batches of `train.micro_batch_size` samples or, with dynamic batching, of
at most `train.max_tokens_per_gpu` tokens, cut in the step's seeded order), the accumulation boundary (the step's
last micro-batch), and averaging the statistics. With ring attention the ranks of a ring train on the same
micro-batches, each its chunk of them (`sequence_batch.on_ring`): samples are shared out over the data-parallel
groups (rings), not the ranks. What a micro-batch's loss is comes from the caller; this module knows no RL maths,
Ray or store.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch

from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine
from hybrid_core.engines.sequence_batch import (MicroBatching, SequenceBatch, make_sequence_batch, on_ring, pad,
                                                placeholder_batch, split_micro_batches, to_device)

ADDITIVE_KEYS = ("policy_loss", "kl_loss", "value_loss")  # normalised to the optimizer step: they add up


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    batch_size: int          # samples per optimizer step
    batching: MicroBatching  # how a step's samples are cut into forward/backward micro-batches
    max_epochs: int
    seed: int


@dataclass(frozen=True)
class MicroBatchShare:
    """Which samples a micro-batch holds, how they are laid out, and its share of the optimizer step."""

    indices: list[int]
    num_tokens: float       # response tokens of the whole optimizer step (the global token mean's divisor)
    sequence_share: float   # non-empty responses of the micro-batch ÷ those of the optimizer step (GSPO's mean is
    #                         over non-empty sequences, so counting empty ones would make it depend on the cut)
    is_packed: bool = False  # one unpadded row (`ds.packing_samples`) instead of one padded row per sample


def micro_batch_tensors(engine: DeepSpeedTrainEngine, prompt_ids: list[list[int]], response_ids: list[list[int]],
                        share: MicroBatchShare):
    """The micro-batch's sequences on the engine's device (on a ring, this rank's chunk of them), and `take(rows)`:
    its (B, T) slice of a ragged per-token column (old logprobs, advantages, values, …)."""
    indices = share.indices
    batch = make_sequence_batch([prompt_ids[i] for i in indices], [response_ids[i] for i in indices], engine.pad_id,
                                share.is_packed)
    T, device = batch.response_mask.shape[1], next(engine.module.parameters()).device
    batch = on_ring(batch.to(device), engine.ring, engine.pad_id)
    return batch, lambda rows: to_device(pad([rows[i] for i in indices], T), device)


LossBuilder = Callable[[MicroBatchShare], tuple[Callable, float]]  # → (loss_fn(model), micro-batch tokens)
PerTokenForward = Callable[[torch.nn.Module, SequenceBatch], torch.Tensor]  # (model, batch) → (B, T) results


def rank_micro_batches(step_idx: list[int], sequence_lengths: list[int], batching: MicroBatching, group: int,
                       num_groups: int) -> list[list[int]]:
    """The micro-batches of one optimizer step of data-parallel group `group` of `num_groups` (a rank, or a ring of
    ranks that share their samples): its share of the samples (every `num_groups`-th, from `group`) cut as usual,
    then padded with empty micro-batches to the most any group has. Every rank computes every group's cut from the
    same lengths, so all make the same number of backward calls without communicating, and a ring's ranks the same
    micro-batches."""
    cuts = [split_micro_batches(step_idx[g::num_groups], sequence_lengths, batching) for g in range(num_groups)]
    most = max(len(cut) for cut in cuts)
    return cuts[group] + [[] for _ in range(most - len(cuts[group]))]


def _no_samples_loss(engine: DeepSpeedTrainEngine, per_token_fn: PerTokenForward, is_packed: bool) -> Callable:
    """An empty micro-batch's loss: zero, from the role's own per-token forward of the one-token placeholder sample.
    It runs the collectives a real micro-batch does (ZeRO-3's weight gathers, the chunked head's agreed chunk count, a
    ring's exchanges), and every parameter a forward uses gets its (zero) gradient, so DeepSpeed's gradient reduction
    runs as on the other ranks."""
    device = next(engine.module.parameters()).device
    batch = on_ring(placeholder_batch(engine.pad_id, is_packed).to(device), engine.ring, engine.pad_id)
    return lambda model: (per_token_fn(model, batch).float().sum() * 0.0, {})


def run_updates(engine: DeepSpeedTrainEngine, lengths: list[tuple[int, int]], plan: BatchPlan,
                build_loss: LossBuilder, per_token_fn: PerTokenForward, counted: list[int] | None = None) -> dict:
    """Run every optimizer step of the step's samples; returns per-step losses and token-weighted stat means.
    `per_token_fn(model, batch) -> (B, T)` is the forward the role's loss runs (a placeholder micro-batch runs it).

    `lengths`: (prompt tokens, response tokens) of each sample. Data-parallel ranks (`engine.world_size` > 1) each
    pass every sample and the same seed: they shuffle alike, and each trains on its share of every optimizer step
    while the loss stays one token mean over the whole step. `counted`: the tokens of each sample the loss counts
    (an agent's generated ones), when not all of its response.
    """
    n, sequence_lengths = len(lengths), [p + r for p, r in lengths]
    counted = counted if counted is not None else [r for _, r in lengths]
    totals, weights, last = defaultdict(float), defaultdict(float), {}
    generator = torch.Generator().manual_seed(plan.seed)
    num_steps = 0
    for _ in range(plan.max_epochs):
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n, plan.batch_size):
            step_idx = order[start:start + plan.batch_size]
            num_tokens = float(sum(counted[i] for i in step_idx)) or 1.0
            num_sequences = sum(counted[i] > 0 for i in step_idx) or 1
            micro_batches = rank_micro_batches(step_idx, sequence_lengths, plan.batching, engine.data_parallel_rank,
                                               engine.data_parallel_size)
            for m, indices in enumerate(micro_batches):
                is_boundary = m == len(micro_batches) - 1
                if not indices:
                    placeholder = _no_samples_loss(engine, per_token_fn, plan.batching.is_packed)
                    last |= engine.train_micro_batch(placeholder, is_boundary)
                    continue
                sequence_share = sum(counted[i] > 0 for i in indices) / num_sequences
                share = MicroBatchShare(indices, num_tokens, sequence_share, plan.batching.is_packed)
                loss_fn, tokens = build_loss(share)
                stats = engine.train_micro_batch(loss_fn, is_boundary)
                last |= {k: stats.pop(k) for k in ("grad_norm", "lr") if k in stats}
                for key, value in stats.items():
                    totals[key] += value if key in ADDITIVE_KEYS else value * tokens
                    weights[key] += 1.0 if key in ADDITIVE_KEYS else tokens
            num_steps += 1
    if engine.world_size > 1:
        if engine.ring is not None and engine.ring.rank > 0:  # a ring's ranks computed the same losses: count once
            totals, weights = defaultdict(float), defaultdict(float)
        totals, weights = _sum_over_ranks(totals), _sum_over_ranks(weights)
    result = {k: totals[k] / (num_steps if k in ADDITIVE_KEYS else weights[k]) for k in totals if weights[k]}
    return result | last


def _sum_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Each key's sum over the data-parallel ranks (a rank may lack a key when it had no samples)."""
    import torch.distributed as dist

    gathered: list[dict] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, dict(values))
    keys = sorted({key for part in gathered for key in part})
    return {key: sum(part.get(key, 0.0) for part in gathered) for key in keys}
