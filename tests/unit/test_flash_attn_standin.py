"""The flash_attn stand-in of the OpenRLHF peer benchmark (benchmarks/peers/flash_attn_standin) on CPU.

`torch.nn.attention.varlen.varlen_attn` has no CPU kernel (torch 2.13: `aten::_flash_attention_forward` is CUDA
only), so on CPU the stand-in takes its exact per-sample path; that path and the argument handling are checked here
against a naive softmax attention written out position by position, in float64. The CUDA kernel path is
tests/gpu/test_flash_attn_standin_gpu.py.
"""
from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDIN = REPO_ROOT / "benchmarks" / "peers" / "flash_attn_standin"


@pytest.fixture(scope="module")
def flash_attn():
    """The stand-in imported from its folder, and forgotten afterwards (no other test sees a flash_attn)."""
    sys.path.insert(0, str(STANDIN))
    try:
        import flash_attn
        import flash_attn.bert_padding  # noqa: F401

        assert Path(flash_attn.__file__).is_relative_to(STANDIN)
        yield flash_attn
    finally:
        sys.path.remove(str(STANDIN))
        for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
            del sys.modules[name]


def naive_varlen(q, k, v, cu_q, cu_k, scale, causal, window=(-1, -1)):
    """Per sample and head: softmax(q·kᵀ·scale over the keys query i may read) · v, the mask written position by
    position (key j of a sample sits at j − (i + Lk − Lq) from query i: bottom-right alignment)."""
    group = q.shape[1] // k.shape[1]
    rows = []
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[s]), int(cu_q[s + 1]), int(cu_k[s]), int(cu_k[s + 1])
        len_q, len_k = q1 - q0, k1 - k0
        allowed = torch.zeros(len_q, len_k, dtype=torch.bool)
        for i in range(len_q):
            for j in range(len_k):
                rel = j - (i + len_k - len_q)
                right = 0 if causal else window[1]
                allowed[i, j] = (right < 0 or rel <= right) and (window[0] < 0 or rel >= -window[0])
        heads = []
        for h in range(q.shape[1]):
            scores = q[q0:q1, h] @ k[k0:k1, h // group].T * scale
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            heads.append(weights @ v[k0:k1, h // group])
        rows.append(torch.stack(heads, dim=1))
    return torch.cat(rows)


def _packed(lengths, num_q_heads=4, num_kv_heads=2, head_dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(total, h, head_dim, generator=g, dtype=torch.float64, requires_grad=True)
               for h in (num_q_heads, num_kv_heads, num_kv_heads))
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    return q, k, v, cu


def _grads(out, inputs, seed=1):
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad((out * weights).sum(), inputs)


@pytest.mark.parametrize("causal, window", [(True, (-1, -1)), (True, (1, -1)), (False, (-1, -1)), (False, (1, 1))])
def test_packed_grouped_query_attention_matches_naive_softmax(flash_attn, causal, window):
    q, k, v, cu = _packed([3, 5, 1])
    out = flash_attn.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, softmax_scale=0.3, causal=causal,
                                            window_size=window)
    expected = naive_varlen(q, k, v, cu, cu, 0.3, causal, window)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    for got, want in zip(_grads(out, (q, k, v)), _grads(expected, (q, k, v))):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_batched_attention_aligns_causal_masks_bottom_right(flash_attn):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 2, 2, 4, generator=g, dtype=torch.float64)  # (B, Lq, H, D)
    k, v = (torch.randn(2, 5, 1, 4, generator=g, dtype=torch.float64) for _ in range(2))  # one KV head
    out = flash_attn.flash_attn_func(q, k, v, causal=True)
    cu_q, cu_k = torch.tensor([0, 2, 4]), torch.tensor([0, 5, 10])
    expected = naive_varlen(q.reshape(4, 2, 4), k.reshape(10, 1, 4), v.reshape(10, 1, 4), cu_q, cu_k, 0.5, True)
    torch.testing.assert_close(out, expected.reshape(2, 2, 2, 4), rtol=0, atol=1e-12)
    # query 0 of 2 over 5 keys reads keys 0..3: the last key moves its output, the first query's does not see it
    moved = v.clone()
    moved[:, 4] += 1.0
    changed = flash_attn.flash_attn_func(q, k, moved, causal=True)
    assert torch.equal(changed[:, 0], out[:, 0]) and not torch.equal(changed[:, 1], out[:, 1])


def test_rows_past_the_last_sample_are_zero(flash_attn):
    q, k, v, _ = _packed([4])
    cu = torch.tensor([0, 3], dtype=torch.int32)
    out = flash_attn.flash_attn_varlen_func(q, k, v, cu, cu, 3, 3, causal=True)
    assert out.shape == q.shape and torch.equal(out[3], torch.zeros_like(out[3]))


def test_unpad_and_pad_are_inverse_layouts(flash_attn):
    from flash_attn.bert_padding import index_first_axis, pad_input, rearrange, unpad_input

    x = torch.arange(2 * 4 * 3, dtype=torch.float64).reshape(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    tokens, indices, cu, longest, used = unpad_input(x, mask)
    assert indices.tolist() == [0, 1, 4, 5, 6] and cu.tolist() == [0, 2, 5] and cu.dtype == torch.int32
    assert (longest, used.tolist()) == (3, [2, 3])
    assert torch.equal(tokens, x.reshape(8, 3)[[0, 1, 4, 5, 6]])
    assert torch.equal(pad_input(tokens, indices, 2, 4), x * mask[..., None])
    assert torch.equal(index_first_axis(rearrange(x, "b s d -> (b s) d"), indices), tokens)
    _, unused_indices, unused_cu, _, unused_used = unpad_input(x, mask, torch.tensor([[0, 0, 1, 0], [0, 0, 0, 0]]))
    assert unused_indices.tolist() == [0, 1, 2, 4, 5, 6] and unused_cu.tolist() == [0, 3, 6]
    assert unused_used.tolist() == [2, 3]


def test_what_it_does_not_serve_is_refused(flash_attn):
    q, k, v, cu = _packed([2])
    for option, message in (({"dropout_p": 0.1}, "dropout_p must be 0"), ({"softcap": 30.0}, "softcap must be 0"),
                            ({"return_attn_probs": True}, "return_attn_probs must be False")):
        with pytest.raises(ValueError, match=message):
            flash_attn.flash_attn_varlen_func(q, k, v, cu, cu, 2, 2, **option)
    with pytest.raises(NotImplementedError, match="training forwards only"):
        flash_attn.flash_attn_with_kvcache(q, k, v)


def test_options_follow_the_torch_varlen_api(flash_attn):
    from flash_attn.flash_attn_interface import varlen_options

    newer = frozenset({"window_size", "scale", "enable_gqa"})  # torch 2.11 and later
    assert varlen_options(newer, (-1, 0), 0.3, 64, 16, 8) == ({"window_size": (-1, 0), "scale": 0.3,
                                                              "enable_gqa": True}, False)
    assert varlen_options(newer, (-1, -1), 0.3, 64, 8, 8) == ({"window_size": (-1, -1), "scale": 0.3}, False)
    older = frozenset({"is_causal"})  # torch 2.10: no scale, no GQA, no windows
    assert varlen_options(older, (-1, 0), 64 ** -0.5, 64, 16, 8) == ({"is_causal": True}, True)
    with pytest.raises(ValueError, match="no scale and 0.3 was asked for"):
        varlen_options(older, (-1, 0), 0.3, 64, 16, 8)
    with pytest.raises(ValueError, match=r"no window_size: got \(4, 0\)"):
        varlen_options(older, (4, 0), 64 ** -0.5, 64, 16, 8)


# flash-attn 2.8.3's flash_attn_interface.flash_attn_varlen_func, parameter by parameter
FLASH_ATTN_2_8_3_VARLEN = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "dropout_p",
                           "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes", "deterministic",
                           "return_attn_probs", "block_table")


def test_transformers_finds_flash_attn_2_8_3_and_its_keyword_arguments(flash_attn):
    """transformers' flash_attention_2 check reads the distribution named flash-attn; it passes the keyword
    arguments the varlen function's signature names (`_lazy_define_process_function`): the same as for the real
    2.8.3, whose signature the stand-in has."""
    import inspect

    from transformers.modeling_flash_attention_utils import _lazy_define_process_function

    (dist,) = metadata.distributions(path=[str(STANDIN)])
    assert (dist.metadata["Name"], dist.version, dist.read_text("top_level.txt").split()) == (
        "flash-attn", "2.8.3", ["flash_attn"])
    assert tuple(inspect.signature(flash_attn.flash_attn_varlen_func).parameters) == FLASH_ATTN_2_8_3_VARLEN
    supports = _lazy_define_process_function(flash_attn.flash_attn_varlen_func).keywords["supports_mapping"]
    assert {name for name, supported in supports.items() if supported} == set(supports) & set(FLASH_ATTN_2_8_3_VARLEN)
    assert {"dropout_p", "window_size", "max_seqlen_q"} <= set(supports)  # the names transformers 5 asks about
