"""Unit tests for hybrid_core.engines.sequence_batch: the padded and packed layouts, micro-batching, response
logprobs (packed = padded, values and gradients) and unpad/pad."""

from pathlib import Path

import pytest
import torch

from hybrid_core.engines.sequence_batch import (HostCopy, MicroBatching, SequenceBatch, make_sequence_batch,
                                                micro_batch_tokens, pad, split_micro_batches, to_response_layout, unpad)
from hybrid_core.engines.vocab_head import response_logprobs

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
    _equal(batch.position_ids, [[0, 1, 2, 3, 4], [0, 1, 2, 3, 3]])  # the pad repeats the last position
    # the logits at position len(prompt) − 1 + t predict response token t: row 0 → 2, 3; row 1 → 0, 1, 2,
    # flattened over the rows (row 1 starts at 5) → 5, 6, 7
    _equal(batch.response_index, [[2, 3, 0], [5, 6, 7]])
    _equal(batch.response_ids, [[9, 10, 0], [11, 12, 13]])
    _equal(batch.response_mask, [[1, 1, 0], [1, 1, 1]], dtype=torch.float32)


def test_layout_with_an_empty_response_and_a_custom_pad():
    batch = make_sequence_batch([[4, 5], [6]], [[], [7]], pad_id=99)
    # rows: 4 5 (L = 2) and 6 7; T = 1
    _equal(batch.input_ids, [[4, 5], [6, 7]])
    _equal(batch.attention_mask, [[1, 1], [1, 1]])
    _equal(batch.response_index, [[0], [2]])  # row 1 starts at flat position 2; its prompt ends there
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


def test_pad_rounds_each_value_as_torch_tensor_does():
    """pad converts the whole batch at once (numpy); each value must still be the float32 that `torch.tensor` of its
    row gives: round to nearest, subnormals, overflow to inf, signed zero, NaN."""
    rows = [[0.1, 1 / 3, -2.5e-40, 1e-46, 3.5e38, -0.0], [], [float("nan"), 16777217.0], [2.0 ** -149]]
    got = pad(rows, T=7)
    for i, row in enumerate(rows):
        expected = torch.tensor(row, dtype=torch.float32)
        assert torch.equal(got[i, :len(row)].view(torch.int32), expected.view(torch.int32)), (row, got[i])
        assert not got[i, len(row):].any()
    assert got.shape == (4, 7)


def test_pad_takes_null_rows_as_empty_and_refuses_rows_wider_than_t():
    _equal(pad([None, [1.5, 2.5]]), [[0, 0], [1.5, 2.5]], torch.float32)
    assert pad([]).shape == (0, 1)
    with pytest.raises(ValueError, match="a row of 3 values does not fit in 2 columns"):
        pad([[1.0], [1.0, 2.0, 3.0]], T=2)


def test_host_copy_reads_the_rows_of_the_response_mask():
    values = torch.tensor([[0.25, -1.0, 3.0], [4.0, 5.0, 6.0]])
    copy = HostCopy(values, torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
    assert copy.rows() == [[0.25], [4.0, 5.0, 6.0]]


def test_packed_layout_by_hand():
    batch = make_sequence_batch([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], pad_id=0, is_packed=True)
    # one row 5 6 7 9 10 | 8 11 12 13 (N = 9), positions restart at the second sample, no mask, no padding
    _equal(batch.input_ids, [[5, 6, 7, 9, 10, 8, 11, 12, 13]])
    _equal(batch.position_ids, [[0, 1, 2, 3, 4, 0, 1, 2, 3]])
    assert batch.attention_mask is None
    # sample 0 predicts its responses from positions 2, 3; sample 1 starts at 5 → 5 + 0, 1, 2
    _equal(batch.response_index, [[2, 3, 0], [5, 6, 7]])
    _equal(batch.response_ids, [[9, 10, 0], [11, 12, 13]])
    _equal(batch.response_mask, [[1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    assert batch.to("cpu").attention_mask is None
    # the varlen kernel's boundaries: samples of 5 and 4 tokens; the flat response positions skip the padding
    _equal(batch.cu_seq_lens, [0, 5, 9], dtype=torch.int32)
    assert batch.max_length == 5 and batch.to("cpu").max_length == 5
    _equal(batch.response_positions, [2, 3, 5, 6, 7])
    _equal(batch.flat_response_ids, [9, 10, 11, 12, 13])
    padded = make_sequence_batch([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], pad_id=0)
    assert padded.cu_seq_lens is None and padded.max_length == 0


def test_to_response_layout_fills_the_mask_in_order_and_passes_gradients():
    batch = make_sequence_batch([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], pad_id=0, is_packed=True)
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], requires_grad=True)
    laid_out = to_response_layout(values, batch)
    _equal(laid_out.detach(), [[1, 2, 0], [3, 4, 5]], dtype=torch.float32)
    (laid_out * torch.tensor([[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]])).sum().backward()
    _equal(values.grad, [10, 20, 40, 50, 60], dtype=torch.float32)  # the padded slot's 30 reaches no value


def test_transformers_finds_the_packed_samples_from_the_positions():
    from transformers.masking_utils import find_packed_sequence_indices

    batch = make_sequence_batch([[1, 2], [3, 4, 5], [6]], [[7], [], []], pad_id=0, is_packed=True)
    # lengths 3, 3, 1 → sample ids 0 0 0 1 1 1 2 (a one-token sample still starts a new block: diff 0 ≠ 1)
    _equal(find_packed_sequence_indices(batch.position_ids), [[0, 0, 0, 1, 1, 1, 2]])
    single = make_sequence_batch([[1, 2]], [[3]], pad_id=0, is_packed=True)
    assert find_packed_sequence_indices(single.position_ids) is None  # one sample: the plain causal mask


def test_micro_batch_tokens_count_padding_only_when_padded():
    assert micro_batch_tokens([3, 5, 2], is_packed=True) == 10
    assert micro_batch_tokens([3, 5, 2], is_packed=False) == 15  # 3 rows × the longest, 5
    assert micro_batch_tokens([], is_packed=False) == 0


def test_fixed_micro_batches_cut_by_count():
    assert split_micro_batches([4, 0, 3, 1, 2], [9] * 5, MicroBatching(num_samples=2)) == [[4, 0], [3, 1], [2]]


def test_dynamic_micro_batches_by_hand():
    lengths = [6, 3, 4, 12, 2, 5]  # sample i has lengths[i] prompt+response tokens
    order = [2, 0, 1, 3, 5, 4]     # a step's seeded order: kept
    packed = split_micro_batches(order, lengths, MicroBatching(num_samples=1, max_tokens=10, is_packed=True))
    # 4+6 = 10 ≤ 10 | +3 → 13: new | 3, then 12 → 15: new | 12 alone is over the budget: its own | 5+2 = 7
    assert packed == [[2, 0], [1], [3], [5, 4]]
    padded = split_micro_batches(order, lengths, MicroBatching(num_samples=1, max_tokens=10, is_packed=False))
    # padded cost = rows × longest: 4, 6 → 2·6 = 12 > 10: 4 alone | 6, 3 → 12: 6 alone | 3 | 12 | 5, 2 → 10
    assert padded == [[2], [0], [1], [3], [5, 4]]
    for micro_batches, is_packed in ((packed, True), (padded, False)):
        assert [i for mb in micro_batches for i in mb] == order
        for mb in micro_batches:
            assert len(mb) == 1 or micro_batch_tokens([lengths[i] for i in mb], is_packed) <= 10


def _random_samples(prompt_lengths, response_lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 100, (n,), generator=g).tolist() for n in prompt_lengths]
    responses = [torch.randint(3, 100, (n,), generator=g).tolist() for n in response_lengths]
    return prompts, responses


PROMPT_LENGTHS, RESPONSE_LENGTHS = [5, 1, 9, 3, 4], [4, 7, 1, 0, 6]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_equal_the_padded_ones(tiny_model, attn):
    tiny_model.set_attn_implementation(attn)
    prompts, responses = _random_samples(PROMPT_LENGTHS, RESPONSE_LENGTHS)
    with torch.no_grad():
        padded = response_logprobs(tiny_model, make_sequence_batch(prompts, responses, pad_id=0))
        packed_batch = make_sequence_batch(prompts, responses, pad_id=0, is_packed=True)
        packed = response_logprobs(tiny_model, packed_batch)
        # control: the same row with positions 0 … N−1 is one long sequence, so later samples see earlier ones
        packed_batch.position_ids = torch.arange(packed_batch.input_ids.shape[1]).unsqueeze(0)
        leaked = response_logprobs(tiny_model, packed_batch)
    tiny_model.set_attn_implementation("sdpa")
    assert packed.shape == padded.shape == (5, 7)
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-5)
    assert (leaked[1:] - padded[1:]).abs().max() > 1e-2  # the equality above needs the per-sample mask


def test_packed_gradients_equal_the_padded_ones(tiny_model):
    prompts, responses = _random_samples(PROMPT_LENGTHS, RESPONSE_LENGTHS, seed=1)
    weights = torch.randn(5, 7, generator=torch.Generator().manual_seed(2))

    def grads(is_packed: bool) -> dict[str, torch.Tensor]:
        tiny_model.zero_grad()
        batch = make_sequence_batch(prompts, responses, pad_id=0, is_packed=is_packed)
        (response_logprobs(tiny_model, batch) * weights).sum().backward()
        return {name: p.grad.clone() for name, p in tiny_model.named_parameters()}

    padded, packed = grads(False), grads(True)
    tiny_model.zero_grad()
    assert padded.keys() == packed.keys() and all(g.abs().sum() > 0 for g in padded.values())
    for name in padded:
        torch.testing.assert_close(packed[name], padded[name], rtol=0, atol=1e-5, msg=name)


def test_packed_values_equal_the_padded_ones():
    from hybrid_core.engines.value_model import load_value_model, response_values

    model = load_value_model(str(TINY_MODEL), "fp32", "score").eval()
    torch.nn.init.normal_(model.score.weight, generator=torch.Generator().manual_seed(3))  # the head starts at 0
    prompts, responses = _random_samples(PROMPT_LENGTHS, RESPONSE_LENGTHS, seed=4)
    with torch.no_grad():
        padded = response_values(model, make_sequence_batch(prompts, responses, pad_id=0))
        packed = response_values(model, make_sequence_batch(prompts, responses, pad_id=0, is_packed=True))
    assert bool((padded != 0).any())
    # values reach ~3: fp32 attention with and without the block mask sums in another order (1.05e-5 absolute,
    # 3.7e-6 relative seen on one x86 machine), so the bound is relative
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-6)


def test_batched_forward_keeps_the_sample_order_under_every_batching(tiny_model):
    from hybrid_core.engines.frozen_model import batched_logprobs

    prompts, responses = _random_samples(PROMPT_LENGTHS, RESPONSE_LENGTHS, seed=5)
    expected = batched_logprobs(tiny_model, prompts, responses, 0, MicroBatching(num_samples=5))
    assert [len(r) for r in expected] == RESPONSE_LENGTHS
    for batching in (MicroBatching(num_samples=2), MicroBatching(num_samples=1, max_tokens=12),
                     MicroBatching(num_samples=1, max_tokens=12, is_packed=True),
                     MicroBatching(num_samples=3, is_packed=True)):
        got = batched_logprobs(tiny_model, prompts, responses, 0, batching)
        torch.testing.assert_close(pad(got, 7), pad(expected, 7), rtol=0, atol=1e-5, msg=str(batching))


@pytest.mark.parametrize("is_packed", [True, False])
def test_a_micro_batch_of_empty_responses_backpropagates_zero(tiny_model, is_packed):
    # no response token: the vocabulary head sees no position, yet the loss still backpropagates (zeros)
    batch = make_sequence_batch([[5, 6, 7], [8, 9]], [[], []], pad_id=0, is_packed=is_packed)
    logprobs = response_logprobs(tiny_model, batch)
    logprobs.sum().backward()
    grads = [p.grad for p in tiny_model.parameters() if p.grad is not None]
    tiny_model.zero_grad()
    assert logprobs.shape == (2, 1) and float(logprobs.detach().abs().sum()) == 0.0
    assert grads and all(float(g.abs().sum()) == 0.0 for g in grads)


@pytest.mark.parametrize("is_packed", [False, True])
def test_ranks_in_lockstep_run_placeholder_forwards_after_their_own(tiny_model, is_packed):
    """A ZeRO-3 rank with fewer micro-batches than its peers runs one-token placeholder forwards until it ran as many
    (`agree_on_count` says how many); its results are those of its own samples alone."""
    from hybrid_core.engines.frozen_model import batched_logprobs

    prompts, responses = _random_samples(PROMPT_LENGTHS, RESPONSE_LENGTHS, seed=5)
    batching = MicroBatching(num_samples=3, is_packed=is_packed)
    seen: list[tuple[int, ...]] = []
    hook = tiny_model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)),
                                                with_kwargs=True)
    try:
        own = batched_logprobs(tiny_model, prompts, responses, 0, batching)
        num_own = len(seen)
        agreed: list[int] = []
        lockstep = batched_logprobs(tiny_model, prompts, responses, 0, batching,
                                    agree_on_count=lambda count: agreed.append(count) or count + 2)
        empty = batched_logprobs(tiny_model, [], [], 0, batching, agree_on_count=lambda count: 3)
    finally:
        hook.remove()
    assert num_own == -(-len(prompts) // 3) and agreed == [num_own]
    placeholder = (1, 2)  # one row of one prompt and one response token, padded or packed
    assert seen[num_own:] == seen[:num_own] + [placeholder] * 2 + [placeholder] * 3
    torch.testing.assert_close(pad(lockstep, 7), pad(own, 7), rtol=0, atol=0)
    assert empty == []
