"""The actor's update for one step: PPO/GSPO micro-batch losses over the step's samples.

Owns turning the committed samples into the maths' tensors per micro-batch (current logprobs and entropy from the
policy's vocabulary head in chunks, `vocab_head`; IS-correction weights from the rollout engine's logprobs) and, for
an exactly on-policy step, the old logprobs from the update's own forward (detached: the ratio is exactly 1, as with
a separate forward of the same weights, which is then skipped). The loop is `minibatch_updates`; the maths
`hybrid_core.algorithms.experience`. It knows nothing about Ray or the store.
"""
from __future__ import annotations

from dataclasses import dataclass

from hybrid_core.algorithms.correction import is_weights
from hybrid_core.algorithms.experience import ActorLossSettings, PolicyMicroBatch, actor_objective
from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine
from hybrid_core.engines.experience_maker import kl_figures
from hybrid_core.engines.minibatch_updates import BatchPlan, MicroBatchShare, micro_batch_tensors, run_updates
from hybrid_core.engines.sequence_batch import HostCopy, MicroBatching
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
    old_logprobs: list[list[float]] | None  # None: exactly on-policy, the update's own forward (detached) serves
    ref_logprobs: list[list[float]] | None
    advantages: list[list[float]]
    rollout_logprobs: list[list[float]] | None = None
    action_mask: list[list[int]] | None = None  # an agent's: 1 on generated tokens, 0 on the environment's

    def __len__(self) -> int:
        return len(self.prompt_ids)


def _policy_loss_builder(engine: DeepSpeedTrainEngine, samples: TrainSamples, s: ActorLossSettings,
                         correction: ISCorrection | None, update_logprobs: list[tuple[list[int], HostCopy]],
                         batching: MicroBatching):
    def build(share: MicroBatchShare):
        batch, take = micro_batch_tensors(engine, samples.prompt_ids, samples.response_ids, share)
        adv, mask = take(samples.advantages), batch.response_mask
        if samples.action_mask is not None:  # the environment's tokens carry no loss, KL or IS weight
            mask = mask * take(samples.action_mask)
        ref = take(samples.ref_logprobs) if samples.ref_logprobs is not None else None
        stored_old = take(samples.old_logprobs) if samples.old_logprobs is not None else None
        rollout = take(samples.rollout_logprobs) if correction is not None else None

        def loss_fn(model):
            logprobs, entropy = response_token_stats(model, batch, batching.logit_chunk_tokens,
                                                     with_entropy=s.entropy_coef is not None,
                                                     kernel=batching.logprob_kernel)
            old = stored_old
            if old is None:  # on-policy: the weights that generated the samples are these, so the ratio is exactly 1
                old = logprobs.detach()
                update_logprobs.append((share.indices, HostCopy(old, batch.response_mask)))  # read after the updates
            weights = None
            if correction is not None:
                weights = is_weights(old, rollout, mask, kind=correction.kind, low=correction.low,
                                     high=correction.high)
            mb = PolicyMicroBatch(logprobs, old, adv, mask, ref, entropy, weights)
            return actor_objective(mb, s, share.num_tokens, share.sequence_share)

        return loss_fn, float(mask.sum())

    return build


def fit_actor(engine: DeepSpeedTrainEngine, samples: TrainSamples, s: ActorLossSettings, plan: BatchPlan,
              correction: ISCorrection | None = None) -> dict:
    """Run the step's policy updates; returns per-optimizer-step losses and token-weighted stat means. Without old
    logprobs (an exactly on-policy update) it also returns the step's KL figures (`kl_figures`) from its own forward."""
    if correction is not None and samples.rollout_logprobs is None:
        raise ValueError("IS correction needs the rollout engine's logprobs: got none in the samples (generated with "
                         "--rollout.no_logprobs); drop it or --algo.advantage.is_correction_enable")
    is_on_policy = samples.old_logprobs is None
    if is_on_policy and (plan.max_epochs != 1 or len(samples) > plan.batch_size):
        raise ValueError(f"old logprobs may come from the update's own forward only for one optimizer step over one "
                         f"epoch: got {len(samples)} samples, train.batch_size {plan.batch_size}, "
                         f"train.max_epochs {plan.max_epochs}")
    lengths = [(len(p), len(r)) for p, r in zip(samples.prompt_ids, samples.response_ids)]
    counted = [sum(m) for m in samples.action_mask] if samples.action_mask is not None else None
    update_logprobs: list[tuple[list[int], HostCopy]] = []
    batching = plan.batching
    build_loss = _policy_loss_builder(engine, samples, s, correction, update_logprobs, batching)
    stats = run_updates(engine, lengths, plan, build_loss, lambda model, batch: response_token_stats(
        model, batch, batching.logit_chunk_tokens, kernel=batching.logprob_kernel)[0], counted)
    if not is_on_policy:
        return stats
    rows = {index: row for indices, copy in update_logprobs for index, row in zip(indices, copy.rows())}
    old = _every_rank_rows(engine, rows, len(samples))
    return stats | kl_figures(old, samples.ref_logprobs or [[] for _ in old], s.kl_estimator, samples.action_mask)


def _every_rank_rows(engine: DeepSpeedTrainEngine, rows: dict[int, list[float]], num_samples: int):
    """The rows each data-parallel rank kept for its samples, merged in sample order."""
    if engine.world_size > 1:
        import torch.distributed as dist

        parts: list[dict] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(parts, rows)
        rows = {index: row for part in parts for index, row in part.items()}
    return [rows[i] for i in range(num_samples)]
