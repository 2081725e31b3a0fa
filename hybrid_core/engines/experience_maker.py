"""The advantage stage on the actor side: committed rollout + reward datasets → the `advantage` dataset.

Owns reading the two datasets in the same sample order, the actor's old logprobs, the reference logprobs and critic
values (through callables, so this module needs no Ray), length penalties, and the conversion to and from the maths'
(B, T) tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import torch

from hybrid_core.algorithms.experience import (AdvantageSettings, PenaltySettings, apply_length_penalties,
                                               compute_advantages, sequence_mean_kl)
from hybrid_core.algorithms.losses import masked_mean
from hybrid_core.data.stage_tables import advantage_table, sample_keys
from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine
from hybrid_core.engines.sequence_batch import MicroBatching, pad, unpad

SequenceForward = Callable[[list[list[int]], list[list[int]]], list[list[float]]]


@dataclass(frozen=True)
class ExperienceSources:
    """Where the non-actor per-token figures come from (None when the role does not exist)."""

    ref_logprobs: SequenceForward | None = None
    values: SequenceForward | None = None


def make_advantage_table(engine: DeepSpeedTrainEngine, rollout: pa.Table, reward: pa.Table, sources: ExperienceSources,
                         settings: AdvantageSettings, penalties: PenaltySettings,
                         batching: MicroBatching) -> tuple[pa.Table, dict]:
    """Returns the advantage table and experience statistics (KL to the reference, per token and per sequence)."""
    keys = sample_keys(rollout)
    if keys != sample_keys(reward):
        raise RuntimeError("reward rows are not in the rollout's sample order; the reward stage must be redone")
    prompt_ids = rollout.column("prompt_ids").to_pylist()
    response_ids = rollout.column("response_ids").to_pylist()
    old = engine.logprobs(prompt_ids, response_ids, batching)
    ref = sources.ref_logprobs(prompt_ids, response_ids) if sources.ref_logprobs else None
    values = sources.values(prompt_ids, response_ids) if sources.values else None
    T = max(1, max(len(r) for r in response_ids))
    mask = pad([[1.0] * len(r) for r in response_ids], T)
    rewards = apply_length_penalties(
        torch.tensor(reward.column("reward").to_pylist(), dtype=torch.float32),
        torch.tensor([len(r) for r in response_ids], dtype=torch.long),
        torch.tensor([f == "length" for f in rollout.column("finish_reason").to_pylist()]), penalties)
    result = compute_advantages(rewards, pad(old, T), pad(ref, T) if ref else None, mask, settings,
                                pad(values, T) if values else None)
    empty = [[] for _ in old]
    columns = {"old_logprobs": old, "ref_logprobs": ref or empty, "values": values or empty,
               "advantages": unpad(result.advantages, mask), "returns": unpad(result.returns, mask)}
    table = advantage_table(keys, columns)
    return table, experience_stats(table, settings.kl_estimator)


def experience_stats(table: pa.Table, kl_estimator: str) -> dict:
    """The statistics `make_advantage_table` reports, recomputed from a committed advantage table (replays)."""
    from hybrid_core.algorithms.kl import kl_penalty

    old, ref = table.column("old_logprobs").to_pylist(), table.column("ref_logprobs").to_pylist()
    if not any(ref):
        return {"experience_kl": 0.0, "experience_kl_seq": 0.0}
    T = max(1, max(len(r) for r in old))
    mask = pad([[1.0] * len(r) for r in old], T)
    kl = kl_penalty(pad(old, T), pad(ref, T), kl_estimator) * mask
    return {"experience_kl": float(masked_mean(kl, mask)), "experience_kl_seq": sequence_mean_kl(kl, mask)}
