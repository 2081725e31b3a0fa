"""A frozen causal LM for log-prob forwards (the reference policy), and the HF loading both sides share.

Owns model/tokenizer loading from a local directory, the device and the attention kernel each layout loads with,
this process's CUDA memory peaks (for the stage metrics), and no-grad micro-batched response logprobs (through the
chunked vocabulary head, `vocab_head`), with the weights in host memory between forwards when asked. It knows
nothing about training, Ray or where sequences come from.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from hybrid_core.engines.frozen_offload import HostResidentWeights
from hybrid_core.engines.liger_kernels import apply_fast_kernels
from hybrid_core.engines.ring_attention import RingGroup, RingSettings, register_ring_attention
from hybrid_core.engines.sequence_batch import MicroBatching, batched_response_forward
from hybrid_core.engines.varlen_attention import has_flash_varlen, register_varlen_attention
from hybrid_core.engines.vocab_head import response_logprobs
from hybrid_core.switches import switch_value

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def device_name() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def reset_memory_peak() -> None:
    """Start a new peak of this process's CUDA memory (see `memory_peak_gib`); nothing on CPU."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def free_share() -> float:
    """The fraction of this process's GPU's memory that is free now, as the driver counts it (every process's
    allocations taken off); 1.0 on CPU."""
    if not torch.cuda.is_available():
        return 1.0
    free, total = torch.cuda.mem_get_info()
    return free / total


def memory_peak_gib(name: str) -> dict[str, float]:
    """{`memory_gib/<name>`: the most memory PyTorch's cache held in this process since `reset_memory_peak`}, or {}
    on CPU. Reserved, not allocated: blocks the cache keeps are what the GPU cannot give to another process."""
    if not torch.cuda.is_available():
        return {}
    return {f"memory_gib/{name}": torch.cuda.max_memory_reserved() / 2**30}


def attn_implementation_for(is_packed: bool, is_ring: bool = False, kernel: str | None = None) -> str | None:
    """The HF attention kernel for a batch layout; None keeps the model's default (sdpa).

    With ring attention (`is_ring`: packed rows split over a ring group) it is `hybrid_ring` on every device: the
    ring's all-gathers around the varlen kernel on CUDA, around exact per-sample sdpa on CPU.

    Packed rows on CUDA use PyTorch's varlen flash attention (`varlen_attention`, registered here), which has a
    backward, needs no compile and reads the samples' boundaries from the batch (flash-attn is not installed).
    `kernel` (`ds.packed_attention`) `flex` picks `flex_attention` instead (transformers builds a BlockMask from the
    positions; compiled on first use), as does a torch without `torch.nn.attention.varlen`. On CPU the default sdpa
    gets the same samples as a dense block-diagonal causal mask: exact (the padded layout's logprobs), no faster.
    """
    if is_ring:
        return register_ring_attention()
    if not (is_packed and device_name() == "cuda"):
        return None
    if switch_value("packed_attention", kernel) == "varlen" and has_flash_varlen():
        return register_varlen_attention()
    return "flex_attention"


def load_causal_lm(model_path: str, param_dtype: str, attn_implementation: str | None = None,
                   use_liger: bool | None = None):
    """Load an HF causal LM from a local directory or a hub id, with Liger's kernels as `apply_fast_kernels` decides
    (None: on CUDA where they apply; True: required; False: never); fails with the path when a local folder is not a
    model directory."""
    from transformers import AutoModelForCausalLM

    if Path(model_path).is_dir() and not (Path(model_path) / "config.json").is_file():  # else a hub id
        raise FileNotFoundError(f"actor.model_name_or_path must be an HF model directory or a hub id: got "
                                f"{model_path!r}, a folder with no config.json")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=TORCH_DTYPES[param_dtype],
                                                 attn_implementation=attn_implementation)
    apply_fast_kernels(model, use_liger)
    return model


def load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def batched_logprobs(model, prompt_ids, response_ids, pad_id: int, batching: MicroBatching,
                     ring: RingGroup | None = None, agree_on_count=None) -> list[list[float]]:
    """Response logprobs of every sample, micro-batched by `batching` (the vocabulary head in chunks of
    `batching.logit_chunk_tokens` tokens), as ragged lists (with a `ring`, each rank's head runs over its own share
    of the response tokens; the results are gathered; `agree_on_count`: see `batched_response_forward`)."""
    logprobs = partial(response_logprobs, chunk_tokens=batching.logit_chunk_tokens, kernel=batching.logprob_kernel)
    return batched_response_forward(logprobs, model, prompt_ids, response_ids, pad_id, batching, ring, agree_on_count)


@dataclass(frozen=True, kw_only=True)
class FrozenModelSettings:
    model_path: str
    param_dtype: str
    batching: MicroBatching  # the advantage stage's no-grad forwards
    use_liger: bool | None   # see `load_causal_lm`
    is_offloaded: bool       # ref.offload: weights in host memory outside the forwards (`frozen_offload`)
    ring: RingSettings       # ds.ring_attn_size: each rank of a ring computes a chunk of the same samples


class FrozenModel:
    """The reference policy: loaded once, never trained; only answers logprob forwards (with a ring of several
    ranks, each rank of the ring a chunk of the same samples')."""

    def __init__(self, settings: FrozenModelSettings, pad_id: int):
        self.ring = settings.ring.join()
        model = load_causal_lm(settings.model_path, settings.param_dtype,
                               attn_implementation_for(settings.batching.is_packed, self.ring is not None,
                                                       settings.batching.packed_attention),
                               settings.use_liger)
        model = model.eval().requires_grad_(False)
        self.weights = HostResidentWeights(model, device_name()) if settings.is_offloaded else None
        self.model = model if settings.is_offloaded else model.to(device_name())
        self.pad_id, self.batching = pad_id, settings.batching

    def logprobs(self, prompt_ids, response_ids) -> list[list[float]]:
        """Response logprobs; on a GPU the forward's cached blocks (and offloaded weights) go back to the driver
        afterwards, since the rollout engine (another process) needs that memory next."""
        if not prompt_ids:  # an empty share (a ring's ranks share theirs): nothing to bring to the device for
            return []
        with self.weights.on_device() if self.weights else contextlib.nullcontext(self.model) as model:
            result = batched_logprobs(model, prompt_ids, response_ids, self.pad_id, self.batching, self.ring)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return result
