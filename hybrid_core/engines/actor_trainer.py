"""The actor's update for one step: epochs × optimizer steps × micro-batches over the step's samples.

Owns batching (seeded shuffles, `train.batch_size` samples per optimizer step, `train.micro_batch_size` per forward)
and the bookkeeping that makes micro-batch losses add up to one global token mean per optimizer step.
It knows nothing about Ray or the store; the maths come from `hybrid_core.algorithms.experience`.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from hybrid_core.algorithms.experience import ActorLossSettings, actor_objective
from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine
from hybrid_core.engines.sequence_batch import make_sequence_batch, pad, response_logprobs


@dataclass(frozen=True)
class TrainSamples:
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    old_logprobs: list[list[float]]
    ref_logprobs: list[list[float]] | None
    advantages: list[list[float]]

    def __len__(self) -> int:
        return len(self.prompt_ids)


@dataclass(frozen=True)
class BatchPlan:
    batch_size: int
    micro_batch_size: int
    max_epochs: int
    seed: int


def _micro_loss(engine: DeepSpeedTrainEngine, samples: TrainSamples, idx: list[int], s: ActorLossSettings,
                num_tokens: float, sequence_share: float):
    batch = make_sequence_batch([samples.prompt_ids[i] for i in idx], [samples.response_ids[i] for i in idx],
                                engine.pad_id)
    T = batch.response_mask.shape[1]
    device = next(engine.module.parameters()).device
    batch = batch.to(device)
    take = lambda rows: pad([rows[i] for i in idx], T).to(device)  # noqa: E731
    ref = take(samples.ref_logprobs) if samples.ref_logprobs is not None else None
    old, adv = take(samples.old_logprobs), take(samples.advantages)

    def loss_fn(model):
        logprobs = response_logprobs(model, batch).float()
        return actor_objective(logprobs, old, ref, adv, batch.response_mask, s, num_tokens, sequence_share)

    return loss_fn, float(batch.response_mask.sum())


ADDITIVE_KEYS = ("policy_loss", "kl_loss")  # already normalised to the optimizer step: they add up


def fit_actor(engine: DeepSpeedTrainEngine, samples: TrainSamples, s: ActorLossSettings, plan: BatchPlan) -> dict:
    """Run the step's updates; returns per-optimizer-step losses and token-weighted means of the other stats."""
    n = len(samples)
    if n % plan.batch_size:
        raise ValueError(f"train.batch_size must divide the samples of a step: got {plan.batch_size} and {n} "
                         f"(rollout.batch_size × n_samples_per_prompt); pick a divisor")
    totals, weights, last = defaultdict(float), defaultdict(float), {}
    generator = torch.Generator().manual_seed(plan.seed)
    for _ in range(plan.max_epochs):
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n, plan.batch_size):
            step_idx = order[start:start + plan.batch_size]
            num_tokens = float(sum(len(samples.response_ids[i]) for i in step_idx)) or 1.0
            for m in range(0, len(step_idx), plan.micro_batch_size):
                idx = step_idx[m:m + plan.micro_batch_size]
                loss_fn, tokens = _micro_loss(engine, samples, idx, s, num_tokens, len(idx) / len(step_idx))
                stats = engine.train_micro_batch(loss_fn)
                last |= {k: stats.pop(k) for k in ("grad_norm", "lr") if k in stats}
                for key, value in stats.items():
                    totals[key] += value if key in ADDITIVE_KEYS else value * tokens
                    weights[key] += 1.0 if key in ADDITIVE_KEYS else tokens
    num_steps = plan.max_epochs * (n // plan.batch_size)
    result = {k: totals[k] / (num_steps if k in ADDITIVE_KEYS else weights[k]) for k in totals if weights[k]}
    return result | last
