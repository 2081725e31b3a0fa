"""The update loop shared by the actor and the critic: epochs × optimizer steps × micro-batches over a step's samples.

Owns batching (seeded shuffles, `train.batch_size` samples per optimizer step — the last one may be smaller when
filtering left fewer samples —, `train.micro_batch_size` per forward), the accumulation boundary, and averaging the
statistics. What a micro-batch's loss is comes from the caller; this module knows no RL maths, Ray or store.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch

from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine
from hybrid_core.engines.sequence_batch import make_sequence_batch, pad

ADDITIVE_KEYS = ("policy_loss", "kl_loss", "value_loss")  # normalised to the optimizer step: they add up


@dataclass(frozen=True)
class BatchPlan:
    batch_size: int
    micro_batch_size: int
    max_epochs: int
    seed: int


@dataclass(frozen=True)
class MicroBatchShare:
    """Which samples a micro-batch holds and its share of the optimizer step it belongs to."""

    indices: list[int]
    num_tokens: float       # response tokens of the whole optimizer step (the global token mean's divisor)
    sequence_share: float   # micro-batch sequences ÷ optimizer-step sequences


def micro_batch_tensors(engine: DeepSpeedTrainEngine, prompt_ids: list[list[int]], response_ids: list[list[int]],
                        indices: list[int]):
    """The micro-batch's padded sequences on the engine's device, and `take(rows)`: its (B, T) slice of a ragged
    per-token column (old logprobs, advantages, values, …)."""
    batch = make_sequence_batch([prompt_ids[i] for i in indices], [response_ids[i] for i in indices], engine.pad_id)
    T, device = batch.response_mask.shape[1], next(engine.module.parameters()).device
    return batch.to(device), lambda rows: pad([rows[i] for i in indices], T).to(device)


LossBuilder = Callable[[MicroBatchShare], tuple[Callable, float]]  # → (loss_fn(model), micro-batch tokens)


def run_updates(engine: DeepSpeedTrainEngine, response_lengths: list[int], plan: BatchPlan,
                build_loss: LossBuilder) -> dict:
    """Run every optimizer step of the step's samples; returns per-step losses and token-weighted stat means."""
    n = len(response_lengths)
    totals, weights, last = defaultdict(float), defaultdict(float), {}
    generator = torch.Generator().manual_seed(plan.seed)
    num_steps = 0
    for _ in range(plan.max_epochs):
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n, plan.batch_size):
            step_idx = order[start:start + plan.batch_size]
            num_tokens = float(sum(response_lengths[i] for i in step_idx)) or 1.0
            for m in range(0, len(step_idx), plan.micro_batch_size):
                share = MicroBatchShare(step_idx[m:m + plan.micro_batch_size], num_tokens,
                                        min(plan.micro_batch_size, len(step_idx) - m) / len(step_idx))
                loss_fn, tokens = build_loss(share)
                stats = engine.train_micro_batch(loss_fn, is_boundary=m + plan.micro_batch_size >= len(step_idx))
                last |= {k: stats.pop(k) for k in ("grad_norm", "lr") if k in stats}
                for key, value in stats.items():
                    totals[key] += value if key in ADDITIVE_KEYS else value * tokens
                    weights[key] += 1.0 if key in ADDITIVE_KEYS else tokens
            num_steps += 1
    result = {k: totals[k] / (num_steps if k in ADDITIVE_KEYS else weights[k]) for k in totals if weights[k]}
    return result | last
