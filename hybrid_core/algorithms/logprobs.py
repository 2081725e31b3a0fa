"""Per-token log-probability of the taken token and softmax entropy from one block of logits.

Owns the maths of a block of C positions × V vocabulary logits (any float dtype; computed in fp32, or fp64 for fp64
logits): the forward returns log p(token) and, when asked, H = −Σ p·log p. The backward is written out
(d log p_y/dz = onehot − p, dH/dz = −p·(log p + H)), so autograd keeps only the block's logits, not the fp32 copies
and softmax that `logsumexp`/`softmax`/`entr` would save, and the gradient is built in place. Peak memory per logit:
the logits (2 bytes in bf16) plus two fp32 blocks (log p and p, or the fp32 copy and logsumexp's temporary).
Callers keep blocks small (`engines.vocab_head` runs the vocabulary head in token chunks). It knows nothing about
models, chunks or where the logits come from.
"""

import torch
from torch import Tensor


def _log_softmax_copy(logits: Tensor, lse: Tensor) -> Tensor:
    """A new fp32 (fp64 for fp64 logits) log p. −inf logits (a masked vocabulary entry) give p = 0 and log p = −inf:
    log p is clamped to the dtype's smallest value, so p·log p stays 0 instead of NaN in the forward and backward."""
    log_p = logits.to(lse.dtype, copy=True).sub_(lse.unsqueeze(-1))
    return log_p.clamp_(min=torch.finfo(log_p.dtype).min)


class _TokenLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, token_ids: Tensor, with_entropy: bool):
        lse = torch.logsumexp(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        logprobs = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1).to(lse.dtype) - lse
        entropy = lse.new_zeros(0)
        if with_entropy:
            log_p = _log_softmax_copy(logits, lse)
            entropy = log_p.exp().mul_(log_p).sum(dim=-1).neg_()
        else:
            ctx.mark_non_differentiable(entropy)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, token_ids, lse, entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs: Tensor | None, grad_entropy: Tensor | None):
        logits, token_ids, lse, entropy = ctx.saved_tensors
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None
        log_p = _log_softmax_copy(logits, lse)
        if grad_entropy is None:
            grad = log_p.exp_().mul_(-grad_logprobs.unsqueeze(-1))  # −g·p, in the log p buffer
        else:
            p = log_p.exp()
            coef = log_p.add_(entropy.unsqueeze(-1)).mul_(-grad_entropy.unsqueeze(-1))  # −g_H·(log p + H)
            if grad_logprobs is not None:
                coef.sub_(grad_logprobs.unsqueeze(-1))
            coef.masked_fill_(p == 0, 0.0)  # a −inf logit: its clamped log p times |g_H| > 1 overflows, 0·inf is NaN
            grad = p.mul_(coef)
            del coef, log_p
        if grad_logprobs is not None:
            grad.scatter_add_(-1, token_ids.unsqueeze(-1), grad_logprobs.unsqueeze(-1))
        return grad.to(logits.dtype), None, None


def token_logprobs_and_entropy(logits: Tensor, token_ids: Tensor,
                               with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """log softmax(logits)[token] and, with `with_entropy`, the entropy of softmax(logits), both in fp32.

    Args:
        logits: (C, V) float logits of C positions (bf16, fp16 or fp32).
        token_ids: (C,) long, the token taken at each position.
        with_entropy: also return the entropy (and its gradient when it enters a loss).

    Returns:
        (C,) float32 logprobs, and (C,) float32 entropy or None.
    """
    if logits.dim() != 2 or token_ids.shape != logits.shape[:1]:
        raise ValueError(f"logits must be (C, V) and token_ids (C,): got shapes {tuple(logits.shape)} and "
                         f"{tuple(token_ids.shape)}")
    logprobs, entropy = _TokenLogprobEntropy.apply(logits, token_ids, with_entropy)
    return logprobs, entropy if with_entropy else None
