"""The actor's update for one step: PPO/GSPO micro-batch losses over the step's samples.

Owns turning the committed samples into the maths' tensors per micro-batch (current logprobs and entropy from the
policy's vocabulary head in chunks, `vocab_head`; IS-correction weights from the rollout engine's logprobs). The
loop is `minibatch_updates`; the maths `hybrid_core.algorithms.experience`. It knows nothing about Ray or the store.
"""
from __future__ import annotations

from dataclasses import dataclass

from hybrid_core.algorithms.correction import is_weights
from hybrid_core.algorithms.experience import ActorLossSettings, PolicyMicroBatch, actor_objective
from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine
from hybrid_core.engines.minibatch_updates import BatchPlan, MicroBatchShare, micro_batch_tensors, run_updates
from hybrid_core.engines.vocab_head import response_token_stats


@dataclass(frozen=True, kw_only=True)
class ISCorrection:
    kind: str
    low: float
    high: float


@dataclass(frozen=True)
class TrainSamples:
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    old_logprobs: list[list[float]]
    ref_logprobs: list[list[float]] | None
    advantages: list[list[float]]
    rollout_logprobs: list[list[float]] | None = None

    def __len__(self) -> int:
        return len(self.prompt_ids)


def _policy_loss_builder(engine: DeepSpeedTrainEngine, samples: TrainSamples, s: ActorLossSettings,
                         correction: ISCorrection | None, logit_chunk_tokens: int):
    def build(share: MicroBatchShare):
        batch, take = micro_batch_tensors(engine, samples.prompt_ids, samples.response_ids, share)
        old, adv, mask = take(samples.old_logprobs), take(samples.advantages), batch.response_mask
        ref = take(samples.ref_logprobs) if samples.ref_logprobs is not None else None
        weights = None
        if correction is not None:
            weights = is_weights(old, take(samples.rollout_logprobs), mask, kind=correction.kind,
                                 low=correction.low, high=correction.high)

        def loss_fn(model):
            logprobs, entropy = response_token_stats(model, batch, logit_chunk_tokens,
                                                     with_entropy=s.entropy_coef is not None)
            mb = PolicyMicroBatch(logprobs, old, adv, mask, ref, entropy, weights)
            return actor_objective(mb, s, share.num_tokens, share.sequence_share)

        return loss_fn, float(mask.sum())

    return build


def fit_actor(engine: DeepSpeedTrainEngine, samples: TrainSamples, s: ActorLossSettings, plan: BatchPlan,
              correction: ISCorrection | None = None) -> dict:
    """Run the step's policy updates; returns per-optimizer-step losses and token-weighted stat means."""
    if correction is not None and samples.rollout_logprobs is None:
        raise ValueError("IS correction needs the rollout engine's logprobs: got none in the samples")
    lengths = [(len(p), len(r)) for p, r in zip(samples.prompt_ids, samples.response_ids)]
    build_loss = _policy_loss_builder(engine, samples, s, correction, plan.batching.logit_chunk_tokens)
    return run_updates(engine, lengths, plan, build_loss)
