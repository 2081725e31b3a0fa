"""The critic's value model: a causal LM's backbone plus a linear value head, and its per-token response values.

Owns loading (backbone weights from a local HF directory; the head, named `ds.value_head_prefix`, starts at zero so
initial values are 0) and value forwards in either layout of `sequence_batch` (padded or packed).
It knows nothing about training loops, Ray or the store.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from hybrid_core.engines.frozen_model import TORCH_DTYPES
from hybrid_core.engines.liger_kernels import apply_fast_kernels
from hybrid_core.engines.ring_attention import RingGroup
from hybrid_core.engines.sequence_batch import (MicroBatching, SequenceBatch, batched_response_forward, model_inputs,
                                               to_response_layout)


class ValueModel(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int, head_prefix: str):
        super().__init__()
        self.model, self.head_prefix = backbone, head_prefix
        head = nn.Linear(hidden_size, 1, bias=False, dtype=next(backbone.parameters()).dtype)
        nn.init.zeros_(head.weight)
        self.add_module(head_prefix, head)

    def forward(self, input_ids, attention_mask, position_ids, use_cache: bool = False, **kwargs) -> torch.Tensor:
        """Values (R, L): V of the state that ends at each position (`kwargs`: the attention kernel's, e.g. the
        packed samples' boundaries)."""
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=use_cache, **kwargs).last_hidden_state
        return getattr(self, self.head_prefix)(hidden).squeeze(-1)


def load_value_model(model_path: str, param_dtype: str, head_prefix: str,
                     attn_implementation: str | None = None, use_liger: bool | None = None) -> ValueModel:
    from transformers import AutoConfig, AutoModel

    if Path(model_path).is_dir() and not (Path(model_path) / "config.json").is_file():  # else a hub id
        raise FileNotFoundError(f"critic.model_name_or_path must be an HF model directory or a hub id: got "
                                f"{model_path!r}, a folder with no config.json")
    backbone = AutoModel.from_pretrained(model_path, dtype=TORCH_DTYPES[param_dtype],
                                         attn_implementation=attn_implementation)
    apply_fast_kernels(backbone, use_liger)
    return ValueModel(backbone, AutoConfig.from_pretrained(model_path).hidden_size, head_prefix)


def response_values(model: nn.Module, batch: SequenceBatch) -> torch.Tensor:
    """(B, T) values at the positions that precede each response token, zero where `response_mask` is 0."""
    values = model(**model_inputs(batch))
    return to_response_layout(values.float().flatten()[batch.response_positions], batch)


def batched_values(model: nn.Module, prompt_ids, response_ids, pad_id: int, batching: MicroBatching,
                   ring: RingGroup | None = None):
    """Ragged per-sample values of every response, micro-batched by `batching`, without gradients (with a `ring`,
    this rank's chunks of them, gathered)."""
    return batched_response_forward(response_values, model, prompt_ids, response_ids, pad_id, batching, ring)
