"""Packed samples on CUDA: `flex_attention` (what `ds.packing_samples` loads there) gives the padded layout's
per-token logprobs and gradients, so packing changes the kernel and the memory, never the maths.

Only torch and transformers: the tiny model is built here. fp32 compares to the padded sdpa forward; bf16 compares
both layouts to the fp32 result, since bf16 kernels differ from each other by more than 1e-5 anyway.
"""
from __future__ import annotations

import runpy

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.gpu
PROMPT_LENGTHS, RESPONSE_LENGTHS = [5, 1, 9, 3, 4, 40, 17], [4, 7, 1, 0, 6, 64, 30]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return runpy.run_path(str(REPO_ROOT / "data" / "build_tiny_model.py"))["build"](tmp_path_factory.mktemp("tiny"))


def _load(tiny_dir, is_packed: bool, dtype: str):
    from hybrid_core.engines.frozen_model import attn_implementation_for, load_causal_lm

    model = load_causal_lm(str(tiny_dir), dtype, attn_implementation_for(is_packed)).cuda().eval()
    assert model.config._attn_implementation == ("flex_attention" if is_packed else "sdpa")
    return model


def _samples():
    import torch

    g = torch.Generator().manual_seed(0)
    return ([torch.randint(3, 100, (n,), generator=g).tolist() for n in PROMPT_LENGTHS],
            [torch.randint(3, 100, (n,), generator=g).tolist() for n in RESPONSE_LENGTHS])


def _logprobs_and_grads(model, is_packed: bool, weights):
    from hybrid_core.engines.sequence_batch import make_sequence_batch, response_logprobs

    prompts, responses = _samples()
    model.zero_grad()
    logprobs = response_logprobs(model, make_sequence_batch(prompts, responses, 0, is_packed).to("cuda"))
    (logprobs * weights).sum().backward()
    return logprobs.detach(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


def test_flex_attention_packed_equals_padded_fp32(tiny_dir):
    import torch

    weights = torch.randn(len(PROMPT_LENGTHS), max(RESPONSE_LENGTHS), device="cuda",
                          generator=torch.Generator("cuda").manual_seed(1))
    padded, padded_grads = _logprobs_and_grads(_load(tiny_dir, False, "fp32"), False, weights)
    packed_model = _load(tiny_dir, True, "fp32")
    packed, packed_grads = _logprobs_and_grads(packed_model, True, weights)
    print(f"fp32 logprobs max |packed − padded| = {float((packed - padded).abs().max()):.2e}")
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-4)
    for name, g in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], g, rtol=0, atol=1e-4 * max(1.0, float(g.abs().max())),
                                   msg=name)

    from hybrid_core.engines.sequence_batch import make_sequence_batch, response_logprobs

    prompts, responses = _samples()  # control: positions 0 … N−1 make one sequence: the per-sample mask matters
    leaked_batch = make_sequence_batch(prompts, responses, 0, is_packed=True).to("cuda")
    leaked_batch.position_ids = torch.arange(leaked_batch.input_ids.shape[1], device="cuda").unsqueeze(0)
    with torch.no_grad():
        leaked = response_logprobs(packed_model, leaked_batch)
    assert float((leaked[1:] - padded[1:]).abs().max()) > 1e-2


def test_flex_attention_packed_bf16_is_as_close_to_fp32_as_padded(tiny_dir):
    import torch

    weights = torch.zeros(len(PROMPT_LENGTHS), max(RESPONSE_LENGTHS), device="cuda")
    exact, _ = _logprobs_and_grads(_load(tiny_dir, False, "fp32"), False, weights)
    padded, _ = _logprobs_and_grads(_load(tiny_dir, False, "bf16"), False, weights)
    packed, _ = _logprobs_and_grads(_load(tiny_dir, True, "bf16"), True, weights)
    padded_error, packed_error = float((padded - exact).abs().max()), float((packed - exact).abs().max())
    print(f"bf16 max error vs fp32: padded sdpa {padded_error:.3e}, packed flex {packed_error:.3e}")
    assert packed_error <= 2 * padded_error + 1e-3
