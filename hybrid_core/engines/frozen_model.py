"""A frozen causal LM for log-prob forwards (the reference policy), and the HF loading both sides share.

Owns model/tokenizer loading from a local directory and no-grad micro-batched response logprobs.
It knows nothing about training, Ray or where sequences come from.
"""
from __future__ import annotations

from pathlib import Path

import torch

from hybrid_core.engines.sequence_batch import batched_response_forward, response_logprobs

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def device_name() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_causal_lm(model_path: str, param_dtype: str):
    """Load a local HF causal LM; fails with the path when it is not a model directory."""
    from transformers import AutoModelForCausalLM

    if not (Path(model_path) / "config.json").is_file():
        raise FileNotFoundError(f"actor.model_name_or_path must be a local HF model directory: got {model_path!r}; "
                                f"no config.json there (this machine has no hub access: build or copy the model)")
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=TORCH_DTYPES[param_dtype])


def load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def batched_logprobs(model, prompt_ids, response_ids, pad_id: int, micro_batch_size: int) -> list[list[float]]:
    """Response logprobs of every sample, computed `micro_batch_size` rows at a time, as ragged lists."""
    return batched_response_forward(response_logprobs, model, prompt_ids, response_ids, pad_id, micro_batch_size)


class FrozenModel:
    """The reference policy: loaded once, never trained; only answers logprob forwards."""

    def __init__(self, model_path: str, param_dtype: str, pad_id: int):
        self.model = load_causal_lm(model_path, param_dtype).to(device_name()).eval()
        self.model.requires_grad_(False)
        self.pad_id = pad_id

    def logprobs(self, prompt_ids, response_ids, micro_batch_size: int) -> list[list[float]]:
        return batched_logprobs(self.model, prompt_ids, response_ids, self.pad_id, micro_batch_size)
