"""Unit tests for hybrid_core.engines.logprob_kernel: the fused Triton kernels give `algorithms.logprobs`' logprobs,
entropy and gradients (fp32 and bf16 logits, each output alone and both, masked entries, a vocabulary that is not a
multiple of the block, by hand), run by Triton's interpreter on CPU tensors in a child process
(`logprob_kernel_interpreted.py`: the interpreter is chosen when the kernels are defined); which chunks take them;
the choice's error. The same comparison on the GPU at Qwen3's vocabulary: tests/gpu/test_chunked_head_gpu.py."""

import pytest
import torch

from hybrid_core.engines.logprob_kernel import fused_applies, kernel_choice
from tests.unit.engines.triton_interpreter import run_interpreted


def test_the_kernels_match_the_pytorch_maths_under_the_interpreter():
    run = run_interpreted("logprob_kernel_interpreted.py")
    assert run.returncode == 0, run.stdout + run.stderr
    cases = [f"ok torch.{dtype} {outputs}" for dtype in ("float32", "bfloat16")
             for outputs in ("logprobs", "entropy", "both")]
    assert run.stdout.splitlines() == ["ok by hand"] + cases


def test_only_cuda_logits_of_16_or_32_bits_take_the_kernels(monkeypatch):
    monkeypatch.delenv("HYBRID_LOGPROB_KERNEL", raising=False)
    assert kernel_choice() == "triton"
    assert not fused_applies(torch.zeros(2, 3))  # CPU: algorithms.logprobs
    monkeypatch.setenv("HYBRID_LOGPROB_KERNEL", "torch")
    assert kernel_choice() == "torch"


def test_an_unknown_kernel_choice_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv("HYBRID_LOGPROB_KERNEL", "cuda")
    with pytest.raises(ValueError, match=r"HYBRID_LOGPROB_KERNEL must be one of \['triton', 'torch'\]: got 'cuda'"):
        kernel_choice()
