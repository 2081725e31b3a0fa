"""The vocabulary head in chunks on CUDA (issue #18 part 1), with the 0.6B stand-in (Qwen3's 151,936-entry
vocabulary, tied embeddings):

- bf16 logprobs, entropy and gradients in chunks stay as close to the fp32 result as the unchunked head's bf16 ones
  (the whole logits of the model's own forward, then fp32 log-softmax: the path before the chunks);
- one chunk's forward+backward allocates what the memory plan counts for the logits (4 bytes per chunk logit with the
  fused kernels, and the head weight's gradient sum), however many tokens there are;
- the fused Triton kernels that run each chunk's maths by default give the PyTorch ops' results.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
PROMPT_LENGTHS, RESPONSE_LENGTHS = [40, 7, 120, 16], [300, 90, 512, 1]  # 903 response tokens: 8 chunks of 128


def _model(standin, dtype: str):
    from hybrid_core.engines.frozen_model import attn_implementation_for, load_causal_lm

    return load_causal_lm(str(standin), dtype, attn_implementation_for(True)).cuda().eval()


def _batch():
    import torch

    from hybrid_core.engines.sequence_batch import make_sequence_batch

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 150000, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    responses = [torch.randint(3, 150000, (n,), generator=g).tolist() for n in RESPONSE_LENGTHS]
    return make_sequence_batch(prompts, responses, pad_id=0, is_packed=True).to("cuda")


def _unchunked(model, batch):
    """The path before the chunks: the model's whole logits at the response positions, log-softmax in fp32."""
    import torch

    logits = model(**_inputs(batch)).logits.flatten(0, 1)[batch.response_positions].float()
    log_p = torch.log_softmax(logits, dim=-1)
    return log_p.gather(-1, batch.flat_response_ids[:, None])[:, 0], -(log_p.exp() * log_p).sum(-1)


def _inputs(batch):
    from hybrid_core.engines.sequence_batch import model_inputs

    return model_inputs(batch)


def _chunked(model, batch):
    from hybrid_core.engines.vocab_head import response_token_stats

    logprobs, entropy = response_token_stats(model, batch, chunk_tokens=128, with_entropy=True)
    mask = batch.response_mask.bool()
    return logprobs[mask], entropy[mask]


def _run(model, batch, fn, weights):
    model.zero_grad()
    logprobs, entropy = fn(model, batch)
    ((logprobs * weights[0]).sum() + (entropy * weights[1]).sum()).backward()
    grads = {name: p.grad.float().clone() for name, p in model.named_parameters()}
    return logprobs.detach(), entropy.detach(), grads


def _relative_error(grads, exact) -> float:
    return max(float((grads[n] - g).norm() / g.norm().clamp(min=1e-30)) for n, g in exact.items())


def test_bf16_chunks_stay_as_close_to_fp32_as_the_unchunked_head(cuda, standin):
    import torch

    batch = _batch()
    weights = torch.randn(2, sum(RESPONSE_LENGTHS), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    exact = _run(_model(standin, "fp32"), batch, _unchunked, weights)
    bf16_model = _model(standin, "bf16")
    before = _run(bf16_model, batch, _unchunked, weights)
    chunked = _run(bf16_model, batch, _chunked, weights)
    for i, name in enumerate(("logprobs", "entropy")):
        before_error = float((before[i] - exact[i]).abs().max())
        chunked_error = float((chunked[i] - exact[i]).abs().max())
        print(f"bf16 vs fp32 {name}: max error unchunked {before_error:.3e}, chunked {chunked_error:.3e}")
        assert chunked_error <= 1.1 * before_error + 1e-3, name
    before_grad, chunked_grad = _relative_error(before[2], exact[2]), _relative_error(chunked[2], exact[2])
    print(f"bf16 vs fp32 gradients, largest relative error: unchunked {before_grad:.3e}, chunked {chunked_grad:.3e}")
    assert chunked_grad <= 1.1 * before_grad + 1e-3
    assert float(exact[0].abs().max()) > 1.0  # real logprobs of a 151,936-entry vocabulary


def _head_peak(head, num_tokens: int, chunk: int) -> int:
    """Bytes allocated at the peak of the head's forward+backward over `num_tokens` hidden states, beyond before."""
    import torch

    from hybrid_core.engines.vocab_head import head_token_stats

    vocab, hidden_size = head.weight.shape
    hidden = torch.randn(num_tokens, hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    token_ids = torch.randint(0, vocab, (num_tokens,), device="cuda")
    head.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    logprobs, entropy = head_token_stats(head, hidden, token_ids, chunk, with_entropy=True)
    (logprobs.sum() + entropy.sum()).backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def test_one_chunk_holds_what_the_plan_counts(cuda, standin):
    from hybrid_core.config import RunConfig
    from hybrid_core.plan.memory import GIB, logit_bytes

    chunk, head = 4096, _model(standin, "bf16").lm_head
    vocab, hidden_size = head.weight.shape
    weight_bytes = vocab * hidden_size * 2
    per_logit = logit_bytes(RunConfig())  # CUDA, bf16: the fused kernels' 4 bytes
    planned = chunk * vocab * per_logit + weight_bytes  # the plan's logits term: a chunk and the gradient sum
    peaks = {n: _head_peak(head, n, chunk) for n in (chunk, 2 * chunk, 4 * chunk)}
    for n, peak in peaks.items():
        besides = weight_bytes + n * hidden_size * 2  # the head's .grad and the hidden states' gradient
        print(f"{n} tokens: peak {peak / GIB:.3f} GiB; plan {planned / GIB:.3f} GiB + {besides / GIB:.3f} GiB "
              f"besides: {(peak - besides - weight_bytes) / (chunk * vocab):.2f} bytes per chunk logit")
        assert peak <= 1.15 * (planned + besides), n
    # from two chunks on, the head's gradient is summed (the plan's gradient-sum matrix, which one chunk does not
    # need: on the H200 one chunk peaked 0.26 GiB lower than four); twice the tokens again: only the hidden states'
    # gradient grows (8,192 more rows), never the logits
    assert peaks[4 * chunk] <= peaks[2 * chunk] + 2 * chunk * hidden_size * 2 + 2**20


def test_the_fused_kernels_give_the_pytorch_maths_at_qwen3s_vocabulary(cuda, monkeypatch):
    """The chunks' default maths on CUDA (`logprob_kernel`'s Triton kernels) against `algorithms.logprobs`' PyTorch
    ops (`HYBRID_LOGPROB_KERNEL=torch`) on the same bf16 logits: logprobs and entropy to fp32 rounding, the bf16
    gradient to a unit in its last place (the inputs are seeded: the same kernels give the same numbers)."""
    import torch

    from hybrid_core.algorithms.logprobs import token_logprobs_and_entropy
    from hybrid_core.engines.logprob_kernel import fused_applies, fused_token_logprobs_and_entropy

    generator = torch.Generator("cuda").manual_seed(2)
    logits = (torch.randn(1000, 151936, device="cuda", generator=generator) * 3).to(torch.bfloat16)
    logits[3, 11] = float("-inf")
    tokens = torch.randint(0, 151936, (1000,), device="cuda", generator=generator)
    weights = torch.randn(2, 1000, device="cuda", generator=generator)
    monkeypatch.delenv("HYBRID_LOGPROB_KERNEL", raising=False)
    assert fused_applies(logits)

    def run(stats):
        leaf = logits.clone().requires_grad_()
        logprobs, entropy = stats(leaf, tokens, True)
        ((logprobs * weights[0]).sum() + (entropy * weights[1]).sum()).backward()
        return logprobs.detach(), entropy.detach(), leaf.grad

    fused, expected = run(fused_token_logprobs_and_entropy), run(token_logprobs_and_entropy)
    torch.testing.assert_close(fused[0], expected[0], rtol=1e-6, atol=2e-5)
    torch.testing.assert_close(fused[1], expected[1], rtol=1e-5, atol=2e-5)
    assert fused[2].dtype == torch.bfloat16 and not fused[2].isnan().any()
    # a unit in the last bf16 place, or 5e-8 for the smallest entries (p ≈ 1e-6, where the kernels' exp and
    # PyTorch's differ in the last fp32 bits and the bf16 rounding flips: 62 of 152M entries, at most 3.0e-8, s30)
    torch.testing.assert_close(fused[2].float(), expected[2].float(), rtol=2 ** -7, atol=5e-8)
