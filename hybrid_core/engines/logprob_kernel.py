"""The vocabulary head's maths on CUDA as two fused Triton kernels: the taken token's logprob and the entropy of each
row of a chunk's (C, V) logits in one read of the logits, and their gradient in one read and one write.

Owns the kernels, the autograd Function around them and which chunks take them (`fused_applies`): CUDA logits of
16- or 32-bit floats unless `--ds.logprob_kernel torch` asks for `algorithms.logprobs`' PyTorch ops. The maths is
that module's (log p_y = z_y − logsumexp z and H = −Σ p·log p in fp32; the written-out backward
−p·(g_logprob + g_entropy·(log p + H)) + g_logprob·onehot), so the two agree to fp32 rounding; the PyTorch ops read
and write the whole fp32 block about 3 times in the forward and 8 times in the backward, which at a Qwen3 vocabulary
costs as much GPU time as the head's matmuls. The forward keeps a running max and sum per row (online softmax), so it
reads each bf16 logit once; the backward reads each once and writes its gradient once, in the logits' dtype.
It knows nothing about models, chunks, DeepSpeed or where the logits come from.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybrid_core.switches import switch_value

FUSED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BLOCK = 8192  # vocabulary entries a program reads per loop step (16 KB of bf16)
NUM_WARPS = 16


@triton.jit
def _forward_kernel(logits_ptr, row_stride, tokens_ptr, logprobs_ptr, lse_ptr, entropy_ptr, num_cols,
                    WITH_ENTROPY: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    running_max = -1.0e30  # finite: a first block of -inf logits rescales by exp(0), not exp(nan)
    total = 0.0
    weighted = 0.0  # Σ e^(z − max)·(z − max): H = log(total) − weighted / total, with no large terms
    for start in range(0, num_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        z = tl.load(row_ptr + cols, mask=cols < num_cols, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(running_max, tl.max(z, axis=0))
        rescale = tl.exp(running_max - new_max)
        e = tl.exp(z - new_max)
        if WITH_ENTROPY:
            shifted = (weighted + total * (running_max - new_max)) * rescale
            weighted = shifted + tl.sum(tl.where(e > 0, e * (z - new_max), 0.0), axis=0)
        total = total * rescale + tl.sum(e, axis=0)
        running_max = new_max
    lse = running_max + tl.log(total)
    taken = tl.load(row_ptr + tl.load(tokens_ptr + row)).to(tl.float32)
    tl.store(logprobs_ptr + row, taken - lse)
    tl.store(lse_ptr + row, lse)
    if WITH_ENTROPY:
        tl.store(entropy_ptr + row, tl.log(total) - weighted / total)


@triton.jit
def _backward_kernel(logits_ptr, row_stride, tokens_ptr, lse_ptr, entropy_ptr, grad_logprobs_ptr, grad_entropy_ptr,
                     grad_ptr, num_cols, HAS_LOGPROB_GRAD: tl.constexpr, HAS_ENTROPY_GRAD: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lse = tl.load(lse_ptr + row)
    token = tl.load(tokens_ptr + row)
    grad_logprob = 0.0
    grad_entropy = 0.0
    entropy = 0.0
    if HAS_LOGPROB_GRAD:
        grad_logprob = tl.load(grad_logprobs_ptr + row)
    if HAS_ENTROPY_GRAD:
        grad_entropy = tl.load(grad_entropy_ptr + row)
        entropy = tl.load(entropy_ptr + row)
    for start in range(0, num_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        inside = cols < num_cols
        log_p = tl.load(logits_ptr + row * row_stride + cols, mask=inside, other=float("-inf")).to(tl.float32) - lse
        p = tl.exp(log_p)
        coef = grad_logprob + grad_entropy * (log_p + entropy)
        grad = tl.where(p > 0, -p * coef, 0.0)  # p = 0 (a -inf logit): no gradient, and no 0·inf
        grad = tl.where(cols == token, grad + grad_logprob, grad)
        tl.store(grad_ptr + row * row_stride + cols, grad.to(grad_ptr.dtype.element_ty), mask=inside)


def kernel_choice(configured: str | None = None) -> str:
    """`ds.logprob_kernel` (`configured`) as it applies: `triton` (the default) or `torch` (see `switches`)."""
    return switch_value("logprob_kernel", configured)


def fused_applies(logits: torch.Tensor, kernel: str | None = None) -> bool:
    """Whether `fused_token_logprobs_and_entropy` serves these logits: CUDA, 16- or 32-bit floats, not turned off
    (`kernel`: `ds.logprob_kernel`)."""
    return logits.is_cuda and logits.dtype in FUSED_DTYPES and kernel_choice(kernel) == "triton"


class _FusedTokenLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, token_ids: torch.Tensor, with_entropy: bool, block: int):
        rows, cols = logits.shape
        logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(logprobs)
        entropy = torch.empty_like(logprobs) if with_entropy else logprobs.new_zeros(0)
        if rows:
            _forward_kernel[(rows,)](logits, logits.stride(0), token_ids, logprobs, lse,
                                     entropy if with_entropy else lse, cols, WITH_ENTROPY=with_entropy,
                                     BLOCK_SIZE=block, num_warps=NUM_WARPS)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, token_ids, lse, entropy)
        ctx.block = block
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        logits, token_ids, lse, entropy = ctx.saved_tensors
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None
        rows, cols = logits.shape
        grad = torch.empty_like(logits)
        if rows:
            _backward_kernel[(rows,)](logits, logits.stride(0), token_ids, lse, entropy if entropy.numel() else lse,
                                      _contiguous_or(grad_logprobs, lse), _contiguous_or(grad_entropy, lse), grad,
                                      cols, HAS_LOGPROB_GRAD=grad_logprobs is not None,
                                      HAS_ENTROPY_GRAD=grad_entropy is not None, BLOCK_SIZE=ctx.block,
                                      num_warps=NUM_WARPS)
        return grad, None, None, None


def _contiguous_or(tensor: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """A kernel argument that may be absent: the tensor itself (contiguous), or a placeholder the kernel never reads."""
    return placeholder if tensor is None else tensor.float().contiguous()


def fused_token_logprobs_and_entropy(logits: torch.Tensor, token_ids: torch.Tensor, with_entropy: bool = False,
                                     block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`algorithms.logprobs.token_logprobs_and_entropy`'s results and gradient through the fused kernels: (C,) fp32
    logprobs of `token_ids` and, with `with_entropy`, (C,) fp32 entropy of (C, V) `logits`. `block`: vocabulary
    entries per loop step, a power of two (tests run Triton's interpreter on CPU with small ones)."""
    if logits.dim() != 2 or token_ids.shape != logits.shape[:1]:
        raise ValueError(f"logits must be (C, V) and token_ids (C,): got shapes {tuple(logits.shape)} and "
                         f"{tuple(token_ids.shape)}")
    logprobs, entropy = _FusedTokenLogprobEntropy.apply(logits.contiguous(), token_ids.long().contiguous(),
                                                        with_entropy, block)
    return logprobs, entropy if with_entropy else None
