"""The reward model (`reward.model_name_or_path`): a causal LM's backbone plus a linear value head, frozen, scoring
each prompt+response at its last token.

As OpenRLHF 0.11 (`openrlhf/models/model.py`, `get_llm_for_sequence_regression(..., "reward")` and its
`RewardModel.forward`): the head is the checkpoint's `<value_head_prefix>.weight` (the model config's own
`value_head_prefix` wins over `ds.value_head_prefix`), the reward is the head's value at the last token the
attention mask keeps, and `reward.normalize_enable` maps it to (reward − mean) / std with the config's `mean` and
`std` (0 and 1 when absent). transformers' `*ForSequenceClassification` checkpoints (num_labels 1) have this layout.
`reward.offload`: OpenRLHF asks DeepSpeed for ZeRO-3 parameter offload (`get_eval_ds_config(offload=True)`; it does
nothing below ZeRO-3); this project's frozen models are not DeepSpeed engines, so the weights wait in host memory
and visit the GPU for the reward stage's forwards only (`frozen_offload`, as the reference's with `--ref.offload`).
It knows nothing about Ray, the store or where the samples came from.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from hybrid_core.engines.frozen_model import attn_implementation_for, device_name
from hybrid_core.engines.frozen_offload import HostResidentWeights
from hybrid_core.engines.sequence_batch import (MicroBatching, SequenceBatch, make_sequence_batch, model_inputs,
                                                split_micro_batches)
from hybrid_core.engines.value_model import ValueModel, load_value_model

# Padded positions are masked out (and come after the last token, which is all a causal model's reward reads), so
# the id they hold never matters; 0 is in every vocabulary.
PAD_ID = 0


@dataclass(frozen=True, kw_only=True)
class RewardModelSettings:
    model_path: str
    param_dtype: str
    value_head_prefix: str  # ds.value_head_prefix; the model config's `value_head_prefix` wins when it has one
    is_normalized: bool     # reward.normalize_enable
    is_offloaded: bool      # reward.offload
    batching: MicroBatching


@dataclass(frozen=True)
class RewardScore:
    """One sample's reward (normalised when `reward.normalize_enable`) and the head's raw value."""

    reward: float
    raw: float


def head_prefix_of(model_path: str, value_head_prefix: str) -> str:
    """The value head's name: the model config's `value_head_prefix` (OpenRLHF's train_rm saves it), else the flag."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    return config.get("value_head_prefix", value_head_prefix)


def read_head_weight(model_path: str, head_prefix: str) -> torch.Tensor:
    """`<head_prefix>.weight` from the checkpoint's safetensors files (or pytorch_model.bin)."""
    from safetensors import safe_open

    key = f"{head_prefix}.weight"
    for file in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as weights:
            if key in weights.keys():
                return weights.get_tensor(key)
    bin_file = Path(model_path) / "pytorch_model.bin"
    if bin_file.is_file():
        state = torch.load(bin_file, map_location="cpu", weights_only=True, mmap=True)
        if key in state:
            return state[key]
    raise ValueError(f"reward.model_name_or_path {model_path!r} holds no value head {key!r} (ds.value_head_prefix "
                     f"{head_prefix!r}); pass --ds.value_head_prefix with the head's name, or give a reward model")


def last_token_positions(batch: SequenceBatch) -> torch.Tensor:
    """(B,) flat positions of each sample's last token: right-padded rows end where their mask does; a packed row's
    samples end at their boundaries."""
    if batch.attention_mask is None:
        return batch.cu_seq_lens[1:].long() - 1
    B, L = batch.attention_mask.shape
    return torch.arange(B, device=batch.input_ids.device) * L + batch.attention_mask.sum(-1) - 1


def sample_rewards(model: ValueModel, batch: SequenceBatch) -> torch.Tensor:
    """(B,) fp32 head values at each sample's last token."""
    return model(**model_inputs(batch)).float().flatten()[last_token_positions(batch)]


class RewardModel:
    """Loaded once, never trained; answers reward forwards only."""

    def __init__(self, settings: RewardModelSettings):
        self.settings = settings
        if not (Path(settings.model_path) / "config.json").is_file():
            raise FileNotFoundError(f"reward.model_name_or_path must be a local HF model directory: got "
                                    f"{settings.model_path!r}; no config.json there")
        prefix = head_prefix_of(settings.model_path, settings.value_head_prefix)
        model = load_value_model(settings.model_path, settings.param_dtype, prefix,
                                 attn_implementation_for(settings.batching.is_packed,
                                                         kernel=settings.batching.packed_attention))
        getattr(model, prefix).weight.data.copy_(read_head_weight(settings.model_path, prefix).reshape(1, -1))
        model = model.eval().requires_grad_(False)
        self.weights = HostResidentWeights(model, device_name()) if settings.is_offloaded else None
        self.model = model if settings.is_offloaded else model.to(device_name())
        config = json.loads((Path(settings.model_path) / "config.json").read_text())
        self.mean, self.std = float(config.get("mean", 0.0)), float(config.get("std", 1.0))

    def score(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[RewardScore]:
        """Every sample's reward, micro-batched by the settings' batching; sample order is kept."""
        if not prompt_ids:  # an empty share: nothing to bring to the GPU for
            return []
        lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
        raw: list[float] = []
        with self.weights.on_device() if self.weights else contextlib.nullcontext(self.model) as model, \
                torch.no_grad():
            device = next(model.parameters()).device
            for indices in split_micro_batches(list(range(len(prompt_ids))), lengths, self.settings.batching):
                batch = make_sequence_batch([prompt_ids[i] for i in indices], [response_ids[i] for i in indices],
                                            PAD_ID, self.settings.batching.is_packed)
                raw += sample_rewards(model, batch.to(device)).cpu().tolist()
        if torch.cuda.is_available():  # the rollout engine and the trainers (other processes) need the memory next
            torch.cuda.empty_cache()
        return [RewardScore(reward=self.normalized(x), raw=x) for x in raw]

    def normalized(self, raw: float) -> float:
        return (raw - self.mean) / self.std if self.settings.is_normalized else raw
