"""Unit tests for hybrid_core.engines.sequence_batch: the padded layout, response logprobs and unpad/pad."""

from pathlib import Path

import pytest
import torch

from hybrid_core.engines.sequence_batch import (SequenceBatch, make_sequence_batch, pad, response_logprobs,
                                                token_logprobs, unpad)

TINY_MODEL = Path(__file__).resolve().parents[3] / "data" / "tiny-qwen3"


def _equal(actual: torch.Tensor, expected, dtype=torch.long):
    expected = torch.as_tensor(expected, dtype=dtype)
    assert actual.dtype == dtype and actual.shape == expected.shape
    assert torch.equal(actual, expected), (actual, expected)


def test_layout_by_hand():
    batch = make_sequence_batch([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], pad_id=0)
    # rows: 5 6 7 | 9 10 (L = 5) and 8 | 11 12 13 (4, padded by one); T = 3, the longest response
    _equal(batch.input_ids, [[5, 6, 7, 9, 10], [8, 11, 12, 13, 0]])
    _equal(batch.attention_mask, [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    # the logits at position len(prompt) − 1 + t predict response token t: row 0 → 2, 3; row 1 → 0, 1, 2
    _equal(batch.response_index, [[2, 3, 0], [0, 1, 2]])
    _equal(batch.response_ids, [[9, 10, 0], [11, 12, 13]])
    _equal(batch.response_mask, [[1, 1, 0], [1, 1, 1]], dtype=torch.float32)


def test_layout_with_an_empty_response_and_a_custom_pad():
    batch = make_sequence_batch([[4, 5], [6]], [[], [7]], pad_id=99)
    # rows: 4 5 (L = 2) and 6 7; T = 1
    _equal(batch.input_ids, [[4, 5], [6, 7]])
    _equal(batch.attention_mask, [[1, 1], [1, 1]])
    _equal(batch.response_index, [[0], [0]])
    _equal(batch.response_ids, [[0], [7]])
    _equal(batch.response_mask, [[0], [1]], dtype=torch.float32)
    only_empty = make_sequence_batch([[4, 5, 6]], [[]], pad_id=99)
    assert only_empty.response_mask.shape == (1, 1) and only_empty.response_mask.sum() == 0  # T is at least 1


def test_mismatched_lists_are_rejected():
    with pytest.raises(AssertionError):
        make_sequence_batch([[1], [2]], [[3]], pad_id=0)


def test_to_moves_every_field():
    batch = make_sequence_batch([[1, 2]], [[3]], pad_id=0).to("cpu")
    assert isinstance(batch, SequenceBatch) and batch.input_ids.tolist() == [[1, 2, 3]]


def test_token_logprobs_by_hand():
    # logits [0, ln 3] → softmax [1/4, 3/4]; log(3/4) = −0.2876820725, log(1/4) = −1.3862943611
    logits = torch.tensor([[[0.0, 1.0986122887], [0.0, 1.0986122887]]])
    got = token_logprobs(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(got, torch.tensor([[-0.2876820725, -1.3862943611]]), rtol=0, atol=1e-6)
    half = token_logprobs(logits.to(torch.bfloat16), torch.tensor([[1, 0]]))
    assert half.dtype == torch.float32  # computed in fp32 whatever the logits' dtype


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32)
    return model.eval()


def test_response_logprobs_match_an_unpadded_reference_loop(tiny_model):
    g = torch.Generator().manual_seed(0)
    prompt_lengths, response_lengths = [5, 2, 9, 3], [4, 7, 1, 0]
    prompts = [torch.randint(3, 100, (n,), generator=g).tolist() for n in prompt_lengths]
    responses = [torch.randint(3, 100, (n,), generator=g).tolist() for n in response_lengths]
    batch = make_sequence_batch(prompts, responses, pad_id=0)
    with torch.no_grad():
        got = response_logprobs(tiny_model, batch)
        expected = torch.zeros(4, 7)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            # one sample alone, no padding and default positions: log_softmax of the logits before each token
            logits = tiny_model(input_ids=torch.tensor([p + r])).logits[0].float()
            logp = torch.log_softmax(logits, dim=-1)
            for t, token in enumerate(r):
                expected[i, t] = logp[len(p) - 1 + t, token]
    assert got.shape == (4, 7) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert bool((got[batch.response_mask == 1] < 0).all())  # real logprobs are negative; padding stays 0


def test_unpad_then_pad_round_trip():
    values = torch.tensor([[0.5, -1.0, 9.0], [2.0, 3.0, 4.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    rows = unpad(values, mask)
    assert rows == [[0.5, -1.0], [2.0, 3.0, 4.0], []]
    torch.testing.assert_close(pad(rows, T=3), values * mask, rtol=0, atol=0)
    torch.testing.assert_close(pad(rows), values * mask, rtol=0, atol=0)  # T defaults to the longest row (3)


def test_pad_widths():
    _equal(pad([[1.0], [2.0, 3.0]], T=4), [[1, 0, 0, 0], [2, 3, 0, 0]], torch.float32)
    _equal(pad([[], []]), [[0], [0]], torch.float32)  # all empty → T = 1
