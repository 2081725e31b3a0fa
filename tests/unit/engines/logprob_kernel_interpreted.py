"""Run under TRITON_INTERPRET=1 by `test_logprob_kernel.py` (Triton's interpreter runs the kernels on CPU tensors):
the fused kernels against `algorithms.logprobs` for each dtype, output and gradient the vocabulary head asks for.
Exits non-zero with the first mismatch; prints one line per case checked."""
from __future__ import annotations

import math

import torch

from hybrid_core.algorithms.logprobs import token_logprobs_and_entropy
from hybrid_core.engines.logprob_kernel import fused_token_logprobs_and_entropy

ROWS, VOCAB, BLOCK = 7, 1000, 256  # 1000 = 3 full blocks and a partial one
TOLERANCE = {torch.float32: {"rtol": 0, "atol": 3e-6}, torch.bfloat16: {"rtol": 2 ** -7, "atol": 1e-6}}


def _inputs(dtype: torch.dtype):
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(ROWS, VOCAB, generator=generator) * 4
    logits[2, 7] = -math.inf  # a masked entry: p = 0, no NaN forward or backward
    logits[4, :600] = -math.inf  # a row whose first blocks are all masked
    tokens = torch.randint(0, VOCAB, (ROWS,), generator=generator)
    tokens[4] = 999
    weights = torch.randn(2, ROWS, generator=generator)
    return logits.to(dtype), tokens, weights


def _run(stats, logits, tokens, weights, outputs: str):
    leaf = logits.clone().requires_grad_()
    logprobs, entropy = stats(leaf, tokens, outputs != "logprobs")
    terms = {"logprobs": [logprobs], "entropy": [entropy], "both": [logprobs, entropy]}[outputs]
    sum((term * w).sum() for term, w in zip(terms, weights)).backward()
    return logprobs.detach(), None if entropy is None else entropy.detach(), leaf.grad


def check(dtype: torch.dtype, outputs: str) -> None:
    logits, tokens, weights = _inputs(dtype)
    fused = _run(lambda z, t, e: fused_token_logprobs_and_entropy(z, t, e, block=BLOCK), logits, tokens, weights,
                 outputs)
    expected = _run(token_logprobs_and_entropy, logits, tokens, weights, outputs)
    for name, got, want in zip(("logprobs", "entropy", "gradient"), fused, expected):
        if want is None:
            assert got is None, f"{name}: expected None"
            continue
        assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} against {want.dtype}"
        assert not got.isnan().any(), f"{name} {dtype} {outputs}: NaN"
        torch.testing.assert_close(got.float(), want.float(), **TOLERANCE[dtype],
                                   msg=lambda m, n=name: f"{n} {dtype} {outputs}: {m}")
    print(f"ok {dtype} {outputs}", flush=True)


def check_by_hand() -> None:
    # logits [0, ln 3] → softmax [1/4, 3/4]; entropy 0.5623351447; d log p_1 / dz = onehot − p = [−1/4, 1/4]
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]], requires_grad=True)
    logprobs, entropy = fused_token_logprobs_and_entropy(logits, torch.tensor([1, 0]), True, block=2)
    torch.testing.assert_close(logprobs, torch.tensor([-0.2876820725, -1.3862943611]), rtol=0, atol=1e-6)
    torch.testing.assert_close(entropy, torch.tensor([0.5623351447, 0.5623351447]), rtol=0, atol=1e-6)
    logprobs[0].backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[-0.25, 0.25], [0.0, 0.0]]), rtol=0, atol=1e-6)
    empty, _ = fused_token_logprobs_and_entropy(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long), block=8)
    assert empty.shape == (0,), empty.shape
    strided = torch.randn(5, 40).t()  # (40, 5), not contiguous
    got, _ = fused_token_logprobs_and_entropy(strided, torch.arange(40) % 5, block=4)
    torch.testing.assert_close(got, token_logprobs_and_entropy(strided, torch.arange(40) % 5)[0], rtol=0, atol=1e-6)
    print("ok by hand", flush=True)


if __name__ == "__main__":
    check_by_hand()
    for dtype in TOLERANCE:
        for outputs in ("logprobs", "entropy", "both"):
            check(dtype, outputs)
