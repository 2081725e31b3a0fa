"""`--ds.use_liger_kernel` on CUDA: Liger's RMSNorm, rotary and SwiGLU kernels replace the model's, and the policy's
logprobs and gradients in bf16 stay as close to the fp32 result as the model's own bf16 kernels (packed samples,
varlen attention, as the product trains). Needs the liger-kernel package (the GPU payload carries its wheel)."""
from __future__ import annotations

import pytest
from gpu_helpers import qwen3_own_kernels
from test_packed_attention_gpu import _logprobs_and_grads, _relative_error, _weights, tiny_dir  # noqa: F401

pytestmark = pytest.mark.gpu


def _load(tiny_dir, dtype: str, use_liger: bool):
    """use_liger False: the model's own kernels (not the default, which is Liger on CUDA)."""
    from hybrid_core.engines.frozen_model import attn_implementation_for, load_causal_lm

    return load_causal_lm(str(tiny_dir), dtype, attn_implementation_for(True), use_liger).cuda().eval()


@pytest.fixture
def qwen3_module_restored(monkeypatch):
    """Liger patches the Qwen3 module's rotary function and classes process-wide, and it is the default on CUDA, so
    an earlier test of the session may have patched them already: the model's own kernels (read when the tests were
    collected, before any model loaded) are put back for this test, and whatever was there is restored after it."""
    from transformers.models.qwen3 import modeling_qwen3

    for name, own in qwen3_own_kernels().items():
        monkeypatch.setattr(modeling_qwen3, name, own)


def test_liger_kernels_replace_the_modules_and_keep_bf16_accuracy(tiny_dir, qwen3_module_restored):  # noqa: F811
    weights = _weights()
    exact, exact_grads = _logprobs_and_grads(_load(tiny_dir, "fp32", False), True, weights)
    plain, plain_grads = _logprobs_and_grads(_load(tiny_dir, "bf16", False), True, weights)
    liger_model = _load(tiny_dir, "bf16", True)
    assert liger_model.model.norm._get_name() == "LigerRMSNorm"
    assert liger_model.model.layers[0].mlp._get_name() == "LigerSwiGLUMLP"
    liger, liger_grads = _logprobs_and_grads(liger_model, True, weights)
    plain_error, liger_error = float((plain - exact).abs().max()), float((liger - exact).abs().max())
    plain_grad_error, liger_grad_error = _relative_error(plain_grads, exact_grads), _relative_error(liger_grads,
                                                                                                   exact_grads)
    print(f"bf16 vs fp32: logprobs max error plain {plain_error:.3e}, liger {liger_error:.3e}; gradient relative "
          f"error plain {plain_grad_error:.3e}, liger {liger_grad_error:.3e}")
    assert liger_error <= 2 * plain_error + 1e-3
    assert liger_grad_error <= 2 * plain_grad_error + 1e-3
    assert float((liger - plain).abs().max()) > 0  # other kernels ran: not the same bits
