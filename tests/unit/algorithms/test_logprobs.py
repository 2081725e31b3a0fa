"""Unit tests for hybrid_core.algorithms.logprobs: the taken token's logprob and the entropy of a block of logits,
by hand, against a reference loop, and the hand-written backward against autograd's numerical check."""

import math

import pytest
import torch

from hybrid_core.algorithms.logprobs import token_logprobs_and_entropy


def _close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32), rtol=0, atol=atol)


def test_logprobs_and_entropy_by_hand():
    # logits [0, ln 3] → softmax [1/4, 3/4]: log(3/4) = −0.2876820725, log(1/4) = −1.3862943611;
    # entropy −(0.25·ln 0.25 + 0.75·ln 0.75) = 0.3465735903 + 0.2157615544 = 0.5623351447
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    logprobs, entropy = token_logprobs_and_entropy(logits, torch.tensor([1, 0]), with_entropy=True)
    _close(logprobs, [-0.2876820725, -1.3862943611])
    _close(entropy, [0.5623351447, 0.5623351447])
    # uniform over 4: ln 4 = 1.3862943611; [0, −inf, −inf]: p = [1, 0, 0] → entropy 0, no NaN from 0·log 0
    _close(token_logprobs_and_entropy(torch.zeros(1, 4), torch.tensor([2]), True)[1], [1.3862943611])
    _close(token_logprobs_and_entropy(torch.tensor([[0.0, -math.inf, -math.inf]]), torch.tensor([0]), True)[1], [0.0])
    half, no_entropy = token_logprobs_and_entropy(logits.to(torch.bfloat16), torch.tensor([1, 0]))
    assert half.dtype == torch.float32 and no_entropy is None  # computed in fp32 whatever the logits' dtype


def test_logprobs_and_entropy_match_a_reference_loop():
    logits = torch.randn(6, 5, generator=torch.Generator().manual_seed(17)) * 3
    tokens = torch.tensor([0, 4, 2, 2, 1, 3])
    expected_logprobs, expected_entropy = torch.zeros(6), torch.zeros(6)
    for c in range(6):
        exps = [math.exp(x) for x in logits[c].tolist()]
        probs = [e / sum(exps) for e in exps]
        expected_logprobs[c] = math.log(probs[tokens[c]])
        expected_entropy[c] = -sum(p * math.log(p) for p in probs)
    logprobs, entropy = token_logprobs_and_entropy(logits, tokens, with_entropy=True)
    _close(logprobs, expected_logprobs, atol=2e-6)
    _close(entropy, expected_entropy, atol=2e-6)


@pytest.mark.parametrize("outputs", ["both", "logprobs", "entropy"])
def test_the_written_out_backward_passes_gradcheck(outputs):
    # float64 finite differences of whichever outputs enter the loss, against the closed-form gradient
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 7, generator=generator, dtype=torch.float64, requires_grad=True)
    tokens = torch.tensor([6, 0, 3, 3])
    weights = torch.randn(2, 4, generator=generator, dtype=torch.float64)

    def loss(z):
        logprobs, entropy = token_logprobs_and_entropy(z, tokens, with_entropy=outputs != "logprobs")
        terms = {"logprobs": [logprobs], "entropy": [entropy], "both": [logprobs, entropy]}[outputs]
        return sum((term * w).sum() for term, w in zip(terms, weights))

    assert torch.autograd.gradcheck(loss, (logits,), eps=1e-6, atol=1e-7)


def test_the_gradient_reaches_bf16_logits_in_their_dtype():
    logits = torch.randn(3, 5, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).requires_grad_()
    logprobs, _ = token_logprobs_and_entropy(logits, torch.tensor([0, 1, 2]))
    logprobs.sum().backward()
    # d Σ log p_y / dz = onehot − p: each row sums to 1 − 1 = 0
    assert logits.grad.dtype == torch.bfloat16
    _close(logits.grad.float().sum(-1), [0.0, 0.0, 0.0], atol=2e-2)


def test_a_masked_logit_gets_no_gradient_and_no_nan_from_a_large_entropy_weight():
    # p = [1/2, 1/2, 0]: d(3·H)/dz = −3·p·(log p + H) = −3·(1/2)·(ln ½ + ln 2) = 0 for the two open entries, and the
    # masked one gets 0, not 0·inf (its log p is clamped to fp32's lowest, times 3 overflows)
    logits = torch.tensor([[0.0, 0.0, -math.inf]], requires_grad=True)
    _, entropy = token_logprobs_and_entropy(logits, torch.tensor([0]), with_entropy=True)
    (3.0 * entropy).sum().backward()
    _close(logits.grad, [[0.0, 0.0, 0.0]])


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match=r"logits must be \(C, V\) and token_ids \(C,\): got shapes \(4,\) and \(1,\)"):
        token_logprobs_and_entropy(torch.zeros(4), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"got shapes \(2, 3\) and \(3,\)"):
        token_logprobs_and_entropy(torch.zeros(2, 3), torch.tensor([0, 1, 2]))
