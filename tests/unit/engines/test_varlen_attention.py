"""Unit tests for hybrid_core.engines.varlen_attention: the `hybrid_varlen` kernel on CPU (its exact per-sample
fallback) gives the padded layout's logprobs and gradients through transformers, it attends only within the
boundaries it is given, and the flash call is built right for both varlen_attn APIs (torch 2.10 and 2.11+)."""
from pathlib import Path

import pytest
import torch

from hybrid_core.engines import varlen_attention
from hybrid_core.engines.sequence_batch import make_sequence_batch, response_logprobs
from hybrid_core.engines.varlen_attention import register_varlen_attention, varlen_attention_forward

TINY_MODEL = Path(__file__).resolve().parents[3] / "data" / "tiny-qwen3"
PROMPT_LENGTHS, RESPONSE_LENGTHS = [5, 1, 9, 3, 4], [4, 7, 1, 0, 6]


@pytest.fixture(scope="module")
def models():
    from transformers import AutoModelForCausalLM

    padded = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32).eval()
    varlen = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32,
                                                  attn_implementation=register_varlen_attention()).eval()
    assert varlen.config._attn_implementation == "hybrid_varlen"
    return padded, varlen


def _samples(seed=0):
    g = torch.Generator().manual_seed(seed)
    return ([torch.randint(3, 100, (n,), generator=g).tolist() for n in PROMPT_LENGTHS],
            [torch.randint(3, 100, (n,), generator=g).tolist() for n in RESPONSE_LENGTHS])


def _grads(model, batch, weights) -> tuple[torch.Tensor, dict]:
    model.zero_grad()
    logprobs = response_logprobs(model, batch)
    (logprobs * weights).sum().backward()
    return logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_varlen_packed_equals_padded_logprobs_and_gradients(models):
    padded_model, varlen_model = models
    prompts, responses = _samples()
    weights = torch.randn(5, 7, generator=torch.Generator().manual_seed(3))
    expected, expected_grads = _grads(padded_model, make_sequence_batch(prompts, responses, 0), weights)
    got, got_grads = _grads(varlen_model, make_sequence_batch(prompts, responses, 0, is_packed=True), weights)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert all(g.abs().sum() > 0 for g in expected_grads.values())
    for name, g in expected_grads.items():
        torch.testing.assert_close(got_grads[name], g, rtol=0, atol=1e-5, msg=name)


def test_varlen_attends_within_the_given_boundaries_only(models):
    _, varlen_model = models
    prompts, responses = _samples(seed=1)
    batch = make_sequence_batch(prompts, responses, 0, is_packed=True)
    with torch.no_grad():
        separate = response_logprobs(varlen_model, batch)
        length = int(batch.cu_seq_lens[-1])  # control: one boundary pair around the row joins the samples
        batch.cu_seq_lens, batch.max_length = torch.tensor([0, length], dtype=torch.int32), length
        joined = response_logprobs(varlen_model, batch)
    torch.testing.assert_close(joined[0], separate[0], rtol=0, atol=1e-6)  # the first sample sees nothing earlier
    assert float((joined[1:] - separate[1:]).abs().max()) > 1e-2


def test_the_kernel_refuses_a_call_without_boundaries():
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="cu_seq_lens_q, max_length_q"):
        varlen_attention_forward(None, q, q, q, None)
    with pytest.raises(ValueError, match="one packed row"):
        varlen_attention_forward(None, torch.zeros(2, 2, 3, 4), q, q, None, cu_seq_lens_q=torch.tensor([0, 3]),
                                 max_length_q=3)


def _fake_api(monkeypatch, signature: str) -> list[dict]:
    """Replace varlen_attn with a recorder of the torch 2.10 (`is_causal`) or 2.11+ (`window_size`) signature."""
    import torch.nn.attention.varlen as module

    calls: list[dict] = []
    if signature == "2.10":
        def fake(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
            calls.append({"key_heads": key.shape[1], "is_causal": is_causal, "max_q": max_q})
            return torch.zeros_like(query)
    else:
        def fake(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                 window_size=(-1, -1), enable_gqa=False):
            calls.append({"key_heads": key.shape[1], "window_size": window_size, "scale": scale,
                          "enable_gqa": enable_gqa, "max_q": max_q})
            return torch.zeros_like(query)
    monkeypatch.setattr(module, "varlen_attn", fake)
    return calls


def _bounds(cu_seq_lens: list[int], max_length: int) -> varlen_attention.VarlenBounds:
    return varlen_attention.VarlenBounds.same(torch.tensor(cu_seq_lens, dtype=torch.int32), max_length)


def test_flash_call_for_torch_2_10_repeats_kv_heads(monkeypatch):
    calls = _fake_api(monkeypatch, "2.10")
    q, kv = torch.zeros(6, 4, 8), torch.zeros(6, 2, 8)
    varlen_attention._flash_varlen(q, kv, kv, _bounds([0, 2, 6], 4), 8 ** -0.5)
    assert calls == [{"key_heads": 4, "is_causal": True, "max_q": 4}]  # no enable_gqa there: heads repeated
    with pytest.raises(ValueError, match="no `scale`"):
        varlen_attention._flash_varlen(q, kv, kv, _bounds([0, 6], 6), 0.5)


def test_flash_call_for_torch_2_11_passes_causal_window_scale_and_gqa(monkeypatch):
    calls = _fake_api(monkeypatch, "2.11")
    q, kv = torch.zeros(6, 4, 8), torch.zeros(6, 2, 8)
    varlen_attention._flash_varlen(q, kv, kv, _bounds([0, 2, 6], 4), 0.25)
    assert calls == [{"key_heads": 2, "window_size": (-1, 0), "scale": 0.25, "enable_gqa": True, "max_q": 4}]


def test_repeated_kv_heads_follow_transformers_grouping():
    from transformers.models.qwen3.modeling_qwen3 import repeat_kv

    kv = torch.randn(5, 2, 3)  # (L, Hkv, D)
    expected = repeat_kv(kv.transpose(0, 1).unsqueeze(0), 3)[0].transpose(0, 1)  # (1, Hkv, L, D) → heads × 3
    torch.testing.assert_close(varlen_attention._repeat_kv_heads(kv, 6), expected, rtol=0, atol=0)
