"""Packed-sample attention through PyTorch's built-in variable-length flash attention
(`torch.nn.attention.varlen`), registered with transformers as the attention kernel `hybrid_varlen`.

Owns the kernel call and its registration. The caller passes each micro-batch's sample boundaries as transformers'
flash-attention keyword arguments (`cu_seq_lens_q`/`_k`, `max_length_q`/`_k`: see `sequence_batch.model_inputs`), so
nothing is recomputed per layer, nothing is compiled and no mask is built (transformers builds none for a kernel
without a mask function). Where the flash kernel cannot run (CPU, fp32) the same boundaries drive one causal sdpa call
per sample: exact, and what the CPU tests check the plumbing with. Queries and keys may have boundaries of their own
(`VarlenBounds`: ring attention gives a rank's queries the keys of the samples' earlier tokens too); a sample's
queries are then its last keys' positions (causal, bottom-right aligned, as flash attention's). It knows nothing
about models, DeepSpeed or RL.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

VARLEN_ATTENTION = "hybrid_varlen"
FLASH_DTYPES = (torch.bfloat16, torch.float16)


def has_flash_varlen() -> bool:
    """Whether this torch ships `torch.nn.attention.varlen` (2.10 and later) and a GPU can run it."""
    try:
        from torch.nn.attention import varlen  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def register_varlen_attention() -> str:
    """Make `hybrid_varlen` a transformers attention kernel in this process (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
    return VARLEN_ATTENTION


def varlen_attention_forward(module, query, key, value, attention_mask, scaling: float | None = None,
                             dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-kernel signature: query (1, Hq, L, D), key/value (1, Hkv, L, D) of one packed row →
    ((1, L, Hq, D), no weights). Each sample attends causally within `cu_seq_lens_q[i]:cu_seq_lens_q[i+1]`; the
    boundaries alone say what attends to what, so a mask transformers may have built from the positions is unused."""
    cu_seq_lens, max_length = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if cu_seq_lens is None or max_length is None:
        raise ValueError(f"the {VARLEN_ATTENTION} attention kernel needs the packed samples' boundaries "
                         "(cu_seq_lens_q, max_length_q): build the batch with sequence_batch.make_sequence_batch("
                         "is_packed=True) and call the model with sequence_batch.model_inputs(batch)")
    if query.shape[0] != 1:
        raise ValueError(f"the {VARLEN_ATTENTION} attention kernel takes one packed row: got {query.shape[0]} rows")
    if dropout:
        raise ValueError(f"the {VARLEN_ATTENTION} attention kernel has no dropout: got {dropout}")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (L, H, D)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = causal_varlen_attention(q, k, v, VarlenBounds.same(cu_seq_lens, int(max_length)), scale)
    return out.unsqueeze(0), None


@dataclass(frozen=True)
class VarlenBounds:
    """Each sample's queries `cu_q[i]:cu_q[i+1]` and keys `cu_k[i]:cu_k[i+1]` (int32) in their packed rows, and the
    longest of each. A sample has at least as many keys as queries: its queries are its last keys' positions."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int

    @classmethod
    def same(cls, cu_seq_lens: torch.Tensor, max_length: int) -> "VarlenBounds":
        """Queries and keys of the same tokens (a whole packed row)."""
        cu = cu_seq_lens.to(torch.int32)
        return cls(cu_q=cu, cu_k=cu, max_q=max_length, max_k=max_length)


def causal_varlen_attention(q, k, v, bounds: VarlenBounds, scale: float) -> torch.Tensor:
    """q (Lq, Hq, D), k/v (Lk, Hkv, D) → (Lq, Hq, D): each sample's queries attend causally to its keys. The flash
    kernel on CUDA in bf16/fp16, else the exact per-sample sdpa."""
    if q.is_cuda and q.dtype in FLASH_DTYPES and has_flash_varlen():
        return _flash_varlen(q, k, v, bounds, scale)
    return _per_sample_sdpa(q, k, v, bounds, scale)


def _flash_varlen(q, k, v, bounds: VarlenBounds, scale: float) -> torch.Tensor:
    """Causal varlen flash attention, across the API changes of torch 2.10 (`is_causal`) and 2.11+
    (`window_size=(-1, 0)`, `scale`, `enable_gqa`). Both align the causal mask bottom-right when a sample has more
    keys than queries."""
    from torch.nn.attention.varlen import varlen_attn

    params = _parameter_names(varlen_attn)
    options: dict = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    if "scale" in params:
        options["scale"] = scale
    elif abs(scale - q.shape[-1] ** -0.5) > 1e-12:
        raise ValueError(f"this torch's varlen_attn has no `scale` and the model asks for {scale}: upgrade torch "
                         f"or use another attention kernel")
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            options["enable_gqa"] = True
        else:
            k, v = _repeat_kv_heads(k, q.shape[1]), _repeat_kv_heads(v, q.shape[1])
    return varlen_attn(q, k, v, bounds.cu_q, bounds.cu_k, bounds.max_q, bounds.max_k, **options)


@functools.cache
def _parameter_names(fn) -> frozenset[str]:
    """The keyword names `fn` takes, read once per function (the kernel runs once per layer and micro-batch)."""
    return frozenset(inspect.signature(fn).parameters)


def _repeat_kv_heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(L, Hkv, D) → (L, Hq, D): query head h reads key/value head h // (Hq / Hkv), as transformers' repeat_kv."""
    return t.repeat_interleave(num_heads // t.shape[1], dim=1)


def _per_sample_sdpa(q, k, v, bounds: VarlenBounds, scale: float) -> torch.Tensor:
    """The exact fallback: sdpa on each sample's slices, concatenated back into the packed row. With as many keys as
    queries the mask is sdpa's own causal one; with more, query j of n sees the keys up to m − n + j of m."""
    k, v = _repeat_kv_heads(k, q.shape[1]), _repeat_kv_heads(v, q.shape[1])
    q_bounds, k_bounds = bounds.cu_q.tolist(), bounds.cu_k.tolist()
    parts = []
    for qs, qe, ks, ke in zip(q_bounds[:-1], q_bounds[1:], k_bounds[:-1], k_bounds[1:]):
        if qe == qs:
            continue
        heads_first = [t.transpose(0, 1) for t in (q[qs:qe], k[ks:ke], v[ks:ke])]  # (H, L, D)
        num_q, num_k = qe - qs, ke - ks
        mask = None if num_q == num_k else \
            torch.ones(num_q, num_k, dtype=torch.bool, device=q.device).tril(num_k - num_q)
        parts.append(F.scaled_dot_product_attention(*heads_first, attn_mask=mask, is_causal=mask is None,
                                                    scale=scale).transpose(0, 1))
    return torch.cat(parts) if parts else q.new_zeros(q.shape)
