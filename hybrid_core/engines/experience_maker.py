"""The advantage stage on the actor side: committed rollout + reward datasets → the `advantage` dataset.

Owns reading the two datasets in the same sample order, the actor's old logprobs, the reference logprobs (through a
callable, so this module needs no Ray), and the conversion to and from the maths' (B, T) tensors.
"""
from __future__ import annotations

from typing import Callable

import pyarrow as pa
import torch

from hybrid_core.algorithms.experience import AdvantageSettings, compute_advantages
from hybrid_core.algorithms.losses import masked_mean
from hybrid_core.data.stage_tables import advantage_table, sample_keys
from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine
from hybrid_core.engines.sequence_batch import pad, unpad

RefLogprobs = Callable[[list[list[int]], list[list[int]]], list[list[float]]]


def make_advantage_table(engine: DeepSpeedTrainEngine, rollout: pa.Table, reward: pa.Table,
                         ref_logprobs: RefLogprobs | None, settings: AdvantageSettings,
                         micro_batch_size: int) -> tuple[pa.Table, dict]:
    """Returns the advantage table and experience statistics (mean KL to the reference)."""
    keys = sample_keys(rollout)
    if keys != sample_keys(reward):
        raise RuntimeError("reward rows are not in the rollout's sample order; the reward stage must be redone")
    prompt_ids = rollout.column("prompt_ids").to_pylist()
    response_ids = rollout.column("response_ids").to_pylist()
    old = engine.logprobs(prompt_ids, response_ids, micro_batch_size)
    ref = ref_logprobs(prompt_ids, response_ids) if ref_logprobs else None
    T = max(1, max(len(r) for r in response_ids))
    mask = pad([[1.0] * len(r) for r in response_ids], T)
    rewards = torch.tensor(reward.column("reward").to_pylist(), dtype=torch.float32)
    result = compute_advantages(rewards, pad(old, T), pad(ref, T) if ref else None, mask, settings)
    columns = {"old_logprobs": old, "ref_logprobs": ref or [[] for _ in old],
               "advantages": unpad(result.advantages, mask), "returns": unpad(result.returns, mask)}
    stats = {"experience_kl": float(masked_mean(result.kl, mask)) if ref else 0.0}
    return advantage_table(keys, columns), stats
