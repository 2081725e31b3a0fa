"""The critic's update for one step: clipped value loss (inventory §3.9) over the step's samples.

Owns the critic's micro-batch loss (the micro-batch token mean of `value_loss`, weighted to one global token mean per
optimizer step). The loop is `minibatch_updates`. It knows nothing about Ray or the store.
"""
from __future__ import annotations

from dataclasses import dataclass

from hybrid_core.algorithms.losses import value_loss
from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine
from hybrid_core.engines.minibatch_updates import BatchPlan, MicroBatchShare, micro_batch_tensors, run_updates
from hybrid_core.engines.value_model import response_values


@dataclass(frozen=True)
class CriticSamples:
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    old_values: list[list[float]]
    returns: list[list[float]]
    action_mask: list[list[int]] | None = None  # an agent's: values are fitted on generated tokens only


def fit_critic(engine: DeepSpeedTrainEngine, samples: CriticSamples, value_clip: float | None,
               plan: BatchPlan) -> dict:
    def build(share: MicroBatchShare):
        batch, take = micro_batch_tensors(engine, samples.prompt_ids, samples.response_ids, share)
        old, returns = take(samples.old_values), take(samples.returns)
        mask = batch.response_mask if samples.action_mask is None else batch.response_mask * take(samples.action_mask)
        tokens = float(mask.sum())

        def loss_fn(model):
            loss, stats = value_loss(response_values(model, batch), old, returns, mask, clip=value_clip)
            loss = loss * (tokens / share.num_tokens)  # micro-batch token mean → its share of the step's mean
            return loss, {"value_loss": loss.item(), "value_clip_ratio": stats.get("clip_ratio", 0.0)}

        return loss_fn, tokens

    lengths = [(len(p), len(r)) for p, r in zip(samples.prompt_ids, samples.response_ids)]
    counted = [sum(m) for m in samples.action_mask] if samples.action_mask is not None else None
    return run_updates(engine, lengths, plan, build, response_values, counted)
