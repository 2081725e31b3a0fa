"""The advantage stage on the actor side: committed rollout + reward datasets → the `advantage` dataset.

Owns reading the two datasets in the same sample order, the actor's old logprobs, the reference logprobs and critic
values (through callables, so this module needs no Ray), length penalties, the conversion to and from the maths'
(B, T) tensors, and the step's KL figures. Without a policy (an exactly on-policy update whose advantages do not read
the old logprobs) the `old_logprobs` column stays empty: the update's own forward serves as them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import torch

from hybrid_core.algorithms.experience import (AdvantageSettings, PenaltySettings, apply_length_penalties,
                                               compute_advantages, sequence_mean_kl)
from hybrid_core.algorithms.losses import masked_mean
from hybrid_core.data.stage_tables import action_masks, advantage_table, ragged_column, sample_keys
from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine
from hybrid_core.engines.sequence_batch import MicroBatching, pad

# In the advantage stage's record: its `old_logprobs` column is empty, the update's own forward stands for them.
OLD_FROM_UPDATE = "old_logprobs_from_update"
SequenceForward = Callable[[list[list[int]], list[list[int]]], list[list[float]]]


@dataclass(frozen=True)
class ExperienceSources:
    """Where the non-actor per-token figures come from (None when the role does not exist)."""

    ref_logprobs: SequenceForward | None = None
    values: SequenceForward | None = None


def make_advantage_table(policy: DeepSpeedTrainEngine | None, rollout: pa.Table, reward: pa.Table,
                         sources: ExperienceSources, settings: AdvantageSettings, penalties: PenaltySettings,
                         batching: MicroBatching) -> tuple[pa.Table, dict]:
    """Returns the advantage table and experience statistics (KL to the reference, per token and per sequence).
    `policy` None: no old-logprob forward (the update takes them from its own forward, and reports the KL figures)."""
    keys = sample_keys(rollout)
    if keys != sample_keys(reward):
        raise RuntimeError("reward rows are not in the rollout's sample order; the reward stage must be redone")
    prompt_ids = rollout.column("prompt_ids").to_pylist()
    response_ids = rollout.column("response_ids").to_pylist()
    old = policy.logprobs(prompt_ids, response_ids, batching) if policy is not None else None
    ref = sources.ref_logprobs(prompt_ids, response_ids) if sources.ref_logprobs else None
    values = sources.values(prompt_ids, response_ids) if sources.values else None
    lengths = [len(r) for r in response_ids]
    T = max(1, max(lengths))
    masks = action_masks(rollout)  # an agent's: the environment's tokens are no actions (no reward, no advantage)
    mask = pad(masks if masks is not None else [[1.0] * n for n in lengths], T)
    rewards = apply_length_penalties(  # length penalties count the generated tokens only
        torch.tensor(reward.column("reward").to_pylist(), dtype=torch.float32),
        mask.sum(dim=1).long(),
        torch.tensor([f == "length" for f in rollout.column("finish_reason").to_pylist()]), penalties)
    padded = {"old_logprobs": pad(old, T) if old is not None else None, "ref_logprobs": pad(ref, T) if ref else None,
              "values": pad(values, T) if values else None}
    result = compute_advantages(rewards, padded["old_logprobs"], padded["ref_logprobs"], mask, settings,
                                padded["values"])
    padded |= {"advantages": result.advantages, "returns": result.returns}
    empty = [[] for _ in response_ids]
    columns = {name: empty if tensor is None else ragged_column(tensor.numpy(), lengths)
               for name, tensor in padded.items()}
    table = advantage_table(keys, columns)
    if old is None:
        return table, {OLD_FROM_UPDATE: 1.0}
    return table, kl_figures(old, ref or empty, settings.kl_estimator, masks)



def kl_figures(old: list[list[float]], ref: list[list[float]], kl_estimator: str,
               masks: list[list[int]] | None = None) -> dict:
    """The step's KL(old ‖ ref): per token over the step, and the mean over sequences of each sequence's token mean
    (what the adaptive KL controller reads); zero without a reference. `masks`: an agent's action masks (the
    environment's tokens count in neither)."""
    from hybrid_core.algorithms.kl import kl_penalty

    if not any(ref):
        return {"experience_kl": 0.0, "experience_kl_seq": 0.0}
    T = max(1, max(len(r) for r in old))
    mask = pad(masks if masks is not None else [[1.0] * len(r) for r in old], T)
    kl = kl_penalty(pad(old, T), pad(ref, T), kl_estimator) * mask
    return {"experience_kl": float(masked_mean(kl, mask)), "experience_kl_seq": sequence_mean_kl(kl, mask)}
