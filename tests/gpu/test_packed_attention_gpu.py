"""Packed samples on CUDA: both packed kernels, PyTorch's varlen flash attention (what `ds.packing_samples` loads
there) and `flex_attention` (`HYBRID_PACKED_ATTENTION=flex`), give the padded layout's per-token logprobs and
gradients, so packing changes the kernel and the memory, never the maths.

Only torch and transformers: the tiny model is built here. fp32 compares to the padded sdpa forward (the varlen kernel
runs its exact per-sample fallback in fp32: flash attention is bf16/fp16 only); bf16 compares both layouts to the
fp32 result, since bf16 kernels differ from each other by more than 1e-5 anyway, and checks the flash kernel ran.
"""
from __future__ import annotations

import runpy

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.gpu
PROMPT_LENGTHS, RESPONSE_LENGTHS = [5, 1, 9, 3, 4, 40, 17], [4, 7, 1, 0, 6, 64, 30]
KERNELS = {"varlen": "hybrid_varlen", "flex": "flex_attention"}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return runpy.run_path(str(REPO_ROOT / "data" / "build_tiny_model.py"))["build"](tmp_path_factory.mktemp("tiny"))


def _load(tiny_dir, is_packed: bool, dtype: str, kernel: str, monkeypatch):
    from hybrid_core.engines.frozen_model import attn_implementation_for, load_causal_lm

    monkeypatch.setenv("HYBRID_PACKED_ATTENTION", kernel)
    model = load_causal_lm(str(tiny_dir), dtype, attn_implementation_for(is_packed)).cuda().eval()
    assert model.config._attn_implementation == (KERNELS[kernel] if is_packed else "sdpa")
    return model


def _samples():
    import torch

    g = torch.Generator().manual_seed(0)
    return ([torch.randint(3, 100, (n,), generator=g).tolist() for n in PROMPT_LENGTHS],
            [torch.randint(3, 100, (n,), generator=g).tolist() for n in RESPONSE_LENGTHS])


def _logprobs_and_grads(model, is_packed: bool, weights):
    from hybrid_core.engines.sequence_batch import make_sequence_batch
    from hybrid_core.engines.vocab_head import response_logprobs

    prompts, responses = _samples()
    model.zero_grad()
    logprobs = response_logprobs(model, make_sequence_batch(prompts, responses, 0, is_packed).to("cuda"))
    (logprobs * weights).sum().backward()
    return logprobs.detach(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


def _weights():
    import torch

    return torch.randn(len(PROMPT_LENGTHS), max(RESPONSE_LENGTHS), device="cuda",
                       generator=torch.Generator("cuda").manual_seed(1))


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_packed_equals_padded_fp32(tiny_dir, kernel, monkeypatch):
    import torch

    weights = _weights()
    padded, padded_grads = _logprobs_and_grads(_load(tiny_dir, False, "fp32", kernel, monkeypatch), False, weights)
    packed_model = _load(tiny_dir, True, "fp32", kernel, monkeypatch)
    packed, packed_grads = _logprobs_and_grads(packed_model, True, weights)
    print(f"{kernel} fp32 logprobs max |packed − padded| = {float((packed - padded).abs().max()):.2e}")
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-4)
    for name, g in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], g, rtol=0, atol=1e-4 * max(1.0, float(g.abs().max())),
                                   msg=name)

    from hybrid_core.engines.sequence_batch import make_sequence_batch
    from hybrid_core.engines.vocab_head import response_logprobs

    prompts, responses = _samples()  # control: one sequence of the whole row: the per-sample boundaries matter
    leaked_batch = make_sequence_batch(prompts, responses, 0, is_packed=True).to("cuda")
    length = leaked_batch.input_ids.shape[1]
    leaked_batch.position_ids = torch.arange(length, device="cuda").unsqueeze(0)
    leaked_batch.cu_seq_lens = torch.tensor([0, length], dtype=torch.int32, device="cuda")
    leaked_batch.max_length = length
    with torch.no_grad():
        leaked = response_logprobs(packed_model, leaked_batch)
    assert float((leaked[1:] - padded[1:]).abs().max()) > 1e-2


def _relative_error(grads: dict, exact: dict) -> float:
    import torch

    return float(torch.sqrt(sum(((grads[n] - g) ** 2).sum() for n, g in exact.items())
                            / sum((g ** 2).sum() for g in exact.values())))


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_packed_bf16_is_as_close_to_fp32_as_padded(tiny_dir, kernel, monkeypatch):
    from hybrid_core.engines import varlen_attention

    flash_calls = []
    real_flash = varlen_attention._flash_varlen
    monkeypatch.setattr(varlen_attention, "_flash_varlen", lambda *a: flash_calls.append(1) or real_flash(*a))
    weights = _weights()
    exact, exact_grads = _logprobs_and_grads(_load(tiny_dir, False, "fp32", kernel, monkeypatch), False, weights)
    padded, padded_grads = _logprobs_and_grads(_load(tiny_dir, False, "bf16", kernel, monkeypatch), False, weights)
    packed, packed_grads = _logprobs_and_grads(_load(tiny_dir, True, "bf16", kernel, monkeypatch), True, weights)
    padded_error, packed_error = float((padded - exact).abs().max()), float((packed - exact).abs().max())
    padded_grad_error = _relative_error(padded_grads, exact_grads)
    packed_grad_error = _relative_error(packed_grads, exact_grads)
    print(f"{kernel} bf16 vs fp32: logprobs max error padded sdpa {padded_error:.3e}, packed {packed_error:.3e}; "
          f"gradient relative error padded {padded_grad_error:.3e}, packed {packed_grad_error:.3e}")
    assert packed_error <= 2 * padded_error + 1e-3
    assert packed_grad_error <= 2 * padded_grad_error + 1e-3
    assert bool(flash_calls) == (kernel == "varlen")  # bf16 on CUDA takes the flash kernel, not the fallback
