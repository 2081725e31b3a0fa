"""flash-attn 2.8.3's attention entry points with its signatures (transformers reads them to decide which keyword
arguments to pass), served by PyTorch's varlen flash attention on CUDA in bf16/fp16 and, elsewhere (CPU, fp32), by
an exact per-sample scaled-dot-product attention that the unit tests check against a naive softmax.

Layouts are flash-attn's: varlen q (total_q, Hq, D), k/v (total_k, Hkv, D) with int32 cumulative lengths; batched
(B, L, H, D). Hkv may divide Hq (grouped-query attention). `causal` aligns the mask to the bottom right, as
flash-attn ≥ 2.1 does; `window_size=(left, right)` with -1 for unbounded. Dropout, softcap, ALiBi, returned
attention probabilities, paged KV caches and `flash_attn_with_kvcache` are refused with a clear error rather than
ignored: the training forwards the peer benchmarks run use none of them.
"""
import functools
import inspect

import torch
import torch.nn.functional as F

FLASH_DTYPES = (torch.bfloat16, torch.float16)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """Attention of each sample `cu_seqlens_q[i]:cu_seqlens_q[i+1]` over its keys `cu_seqlens_k[i]:[i+1]`."""
    _refuse_unsupported(dropout_p=dropout_p, softcap=softcap, alibi_slopes=alibi_slopes,
                        return_attn_probs=return_attn_probs, block_table=block_table)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    window = effective_window(window_size, causal)
    if q.is_cuda and q.dtype in FLASH_DTYPES:
        return _torch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), scale, window)
    return reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, window)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """Batched attention, (B, Lq, H, D) over (B, Lk, Hkv, D): the varlen call with every row one sample."""
    batch, len_q, len_k = q.shape[0], q.shape[1], k.shape[1]
    cu_q = torch.arange(0, (batch + 1) * len_q, len_q, dtype=torch.int32, device=q.device)
    cu_k = torch.arange(0, (batch + 1) * len_k, len_k, dtype=torch.int32, device=q.device)
    out = flash_attn_varlen_func(q.reshape(batch * len_q, *q.shape[2:]), k.reshape(batch * len_k, *k.shape[2:]),
                                 v.reshape(batch * len_k, *v.shape[2:]), cu_q, cu_k, len_q, len_k,
                                 dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                                 window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                                 deterministic=deterministic, return_attn_probs=return_attn_probs)
    return out.reshape(q.shape[:-1] + (v.shape[-1],))


def flash_attn_with_kvcache(*args, **kwargs):
    raise NotImplementedError("the flash_attn stand-in (benchmarks/peers/flash_attn_standin) serves training "
                              "forwards only: generate with vLLM or another attention implementation")


def effective_window(window_size, causal: bool) -> tuple[int, int]:
    """flash-attn's (left, right) window with `causal` folded in (a causal mask is a window with no right side)."""
    left, right = (int(w) for w in window_size)
    return (left, 0) if causal else (left, right)


def _refuse_unsupported(**options) -> None:
    if options["dropout_p"]:
        raise ValueError(f"flash_attn stand-in: dropout_p must be 0: got {options['dropout_p']}; it has no dropout")
    if options["softcap"]:
        raise ValueError(f"flash_attn stand-in: softcap must be 0: got {options['softcap']}")
    for name in ("alibi_slopes", "block_table"):
        if options[name] is not None:
            raise ValueError(f"flash_attn stand-in: {name} must be None: it serves neither ALiBi nor paged caches")
    if options["return_attn_probs"]:
        raise ValueError("flash_attn stand-in: return_attn_probs must be False: it returns the output only")


def varlen_options(params: frozenset[str], window: tuple[int, int], scale: float, head_dim: int, num_q_heads: int,
                   num_kv_heads: int) -> tuple[dict, bool]:
    """(keyword arguments for this torch's `varlen_attn`, whether k/v heads must be repeated first) across its API
    versions: 2.10 has `is_causal`; 2.11 and later `window_size`, `scale` and `enable_gqa`."""
    options: dict = {}
    if "window_size" in params:
        options["window_size"] = window
    elif window in ((-1, -1), (-1, 0)):
        options["is_causal"] = window == (-1, 0)
    else:
        raise ValueError(f"flash_attn stand-in: this torch's varlen_attn has no window_size: got {window}")
    if "scale" in params:
        options["scale"] = scale
    elif abs(scale - head_dim ** -0.5) > 1e-12:
        raise ValueError(f"flash_attn stand-in: this torch's varlen_attn has no scale and {scale} was asked for")
    repeat_kv = num_kv_heads != num_q_heads and "enable_gqa" not in params
    if num_kv_heads != num_q_heads and not repeat_kv:
        options["enable_gqa"] = True
    return options, repeat_kv


@functools.cache
def _varlen_attn_params() -> frozenset[str]:
    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


def _torch_varlen(q, k, v, cu_q, cu_k, max_q: int, max_k: int, scale: float, window: tuple[int, int]):
    from torch.nn.attention.varlen import varlen_attn

    options, repeat_kv = varlen_options(_varlen_attn_params(), window, scale, q.shape[-1], q.shape[1], k.shape[1])
    if repeat_kv:
        k, v = _repeat_kv_heads(k, q.shape[1]), _repeat_kv_heads(v, q.shape[1])
    return varlen_attn(q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k, **options)


def _repeat_kv_heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(L, Hkv, D) → (L, Hq, D): query head h reads key/value head h // (Hq / Hkv), as flash-attn's GQA."""
    return t.repeat_interleave(num_heads // t.shape[1], dim=1)


def reference_varlen(q, k, v, cu_q, cu_k, scale: float, window: tuple[int, int]) -> torch.Tensor:
    """Exact varlen attention, one scaled-dot-product call per sample; rows of q past the last sample are zero."""
    k, v = _repeat_kv_heads(k, q.shape[1]), _repeat_kv_heads(v, q.shape[1])
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    parts = []
    for (q0, q1), (k0, k1) in zip(zip(bounds_q[:-1], bounds_q[1:]), zip(bounds_k[:-1], bounds_k[1:])):
        if q1 == q0:
            continue
        mask = _window_mask(q1 - q0, k1 - k0, window, q.device)
        out = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q[q0:q1], k[k0:k1], v[k0:k1])),
                                             attn_mask=mask, scale=scale)
        parts.append(out.transpose(0, 1))
    tail = q.shape[0] - bounds_q[-1]
    if tail:
        parts.append(q.new_zeros((tail, q.shape[1], v.shape[-1])))
    return torch.cat(parts) if parts else q.new_zeros((0, q.shape[1], v.shape[-1]))


def _window_mask(len_q: int, len_k: int, window: tuple[int, int], device) -> torch.Tensor | None:
    """(len_q, len_k) bool mask, True where query i may read key j: j − (i + len_k − len_q) within [−left, right]
    (bottom-right aligned, as flash-attn); None when unbounded both ways."""
    left, right = window
    if left < 0 and right < 0:
        return None
    offset = (torch.arange(len_k, device=device)[None, :] - torch.arange(len_q, device=device)[:, None]
              - (len_k - len_q))
    allowed = torch.ones(len_q, len_k, dtype=torch.bool, device=device)
    if right >= 0:
        allowed &= offset <= right
    if left >= 0:
        allowed &= offset >= -left
    return allowed
