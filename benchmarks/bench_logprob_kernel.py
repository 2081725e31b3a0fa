"""The vocabulary head's per-chunk maths on the GPU: the fused Triton kernels (`engines.logprob_kernel`, the default
on CUDA) against `algorithms.logprobs`' PyTorch ops, on one chunk of the default size (4,096 tokens × Qwen3's
151,936-entry vocabulary, bf16 logits), the head's matmuls left out.

Figures (milliseconds per chunk, median of 20 CUDA-event timings): `logprob_chunk_forward_ms_{torch,triton}` (no
grad: the advantage stage's forwards), `logprob_chunk_train_ms_{torch,triton}` (what an update spends per chunk:
the forward, its recompute under checkpointing and the backward), each kernel's bytes read and written over its
time against the device copy bandwidth; and the largest differences between the two (logprobs, entropy, gradient).
"""
from __future__ import annotations

CHUNK_TOKENS, VOCAB, REPEATS = 4096, 151936, 20


def _inputs():
    import torch

    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(CHUNK_TOKENS, VOCAB, device="cuda", generator=generator) * 3).to(torch.bfloat16)
    tokens = torch.randint(0, VOCAB, (CHUNK_TOKENS,), device="cuda", generator=generator)
    weights = torch.randn(CHUNK_TOKENS, device="cuda", generator=generator)
    return logits, tokens, weights


def _stats_fn(kernel: str):
    from hybrid_core.algorithms.logprobs import token_logprobs_and_entropy
    from hybrid_core.engines.logprob_kernel import fused_token_logprobs_and_entropy

    return fused_token_logprobs_and_entropy if kernel == "triton" else token_logprobs_and_entropy


def _train_step(stats, logits, tokens, weights, with_entropy: bool):
    """Forward, the checkpointed recompute's forward, backward: what one chunk costs an update."""
    import torch

    with torch.no_grad():
        stats(logits, tokens, with_entropy)
    leaf = logits.detach().requires_grad_()
    logprobs, entropy = stats(leaf, tokens, with_entropy)
    loss = (logprobs * weights).sum() + (entropy.sum() * 1e-3 if with_entropy else 0.0)
    loss.backward()
    return logprobs.detach(), entropy, leaf.grad


def _differences(logits, tokens, weights) -> dict:
    torch_out = _train_step(_stats_fn("torch"), logits, tokens, weights, True)
    triton_out = _train_step(_stats_fn("triton"), logits, tokens, weights, True)
    names = ("logprobs", "entropy", "gradient")
    return {name: float((a.float() - b.float()).abs().max()) for name, a, b in zip(names, torch_out, triton_out)}


def bench_logprob_kernel(results, copy_gbps: float) -> None:
    import torch

    from run_all import _median_cuda_seconds

    logits, tokens, weights = _inputs()
    logit_bytes = logits.numel() * logits.element_size()
    for kernel in ("torch", "triton"):
        stats = _stats_fn(kernel)
        with torch.no_grad():
            forward_s = _median_cuda_seconds(lambda: stats(logits, tokens, False), repeats=REPEATS)
        train_s = _median_cuda_seconds(lambda: _train_step(stats, logits, tokens, weights, False), repeats=REPEATS)
        results.figure(f"logprob_chunk_forward_ms_{kernel}", forward_s * 1e3,
                       note=f"{CHUNK_TOKENS} × {VOCAB} bf16 logits, no grad; {logit_bytes / forward_s / 1e9:.0f} GB/s "
                            f"of logits read against a {copy_gbps:.0f} GB/s device copy")
        results.figure(f"logprob_chunk_train_ms_{kernel}", train_s * 1e3,
                       note="forward, recompute and backward of one chunk (logprobs only)")
    results.figure("logprob_kernel_max_difference", _differences(logits, tokens, weights),
                   note="triton against torch on the same bf16 chunk, entropy in the loss")
