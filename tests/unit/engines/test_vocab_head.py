"""Unit tests for hybrid_core.engines.vocab_head: the vocabulary head in token chunks gives the unchunked head's
logprobs, entropy and parameter gradients (fp32, padded and packed, untied and tied embeddings, a chunk that does
not divide the response tokens and one larger than all of them, with gradient checkpointing), and a forward+backward
never allocates (tokens × vocabulary) logits: its allocations, seen by torch's profiler, grow with the chunk. On CPU a
token's logits do not depend on how many tokens share its chunk (bit for bit)."""
from pathlib import Path

import pytest
import torch

from hybrid_core.engines.sequence_batch import make_sequence_batch, model_inputs
from hybrid_core.engines.vocab_head import head_token_stats, response_token_stats

TINY_MODEL = Path(__file__).resolve().parents[3] / "data" / "tiny-qwen3"
PROMPT_LENGTHS, RESPONSE_LENGTHS = [5, 1, 9, 3, 4], [4, 7, 1, 0, 6]  # N = 18 response tokens, T = 7


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    """The tiny policy, and the same with its head tied to the embedding (which then holds the embedding's weights)."""
    from transformers import AutoModelForCausalLM

    untied = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32).eval()
    return {"untied": untied, "tied": tied_copy(untied).eval()}


def tied_copy(model: torch.nn.Module) -> torch.nn.Module:
    """`model` rebuilt with tie_word_embeddings: one weight, the embedding's, for the embedding and the head
    (transformers will not tie a checkpoint whose two matrices differ, so the head's is left out)."""
    from transformers import AutoModelForCausalLM

    config = model.config.__class__.from_dict(model.config.to_dict() | {"tie_word_embeddings": True})
    tied = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tied.load_state_dict({k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}, strict=False)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    return tied


def _batch(is_packed: bool):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 100, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    responses = [torch.randint(3, 100, (n,), generator=g).tolist() for n in RESPONSE_LENGTHS]
    return make_sequence_batch(prompts, responses, pad_id=0, is_packed=is_packed)


WEIGHTS = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(1))  # a loss mixing logprobs and entropy


def _unchunked(model, batch):
    """Logprobs, entropy and gradients from the whole (N, V) logits of the model's own forward, by plain autograd."""
    model.zero_grad()
    logits = model(**model_inputs(batch)).logits.flatten(0, 1)[batch.response_positions].float()
    log_p = torch.log_softmax(logits, dim=-1)
    mask = batch.response_mask.bool()
    logprobs = torch.zeros(mask.shape).masked_scatter(mask, log_p.gather(-1, batch.flat_response_ids[:, None])[:, 0])
    entropy = torch.zeros(mask.shape).masked_scatter(mask, -(log_p.exp() * log_p).sum(-1))
    ((logprobs * WEIGHTS[0]).sum() + (entropy * WEIGHTS[1]).sum()).backward()
    return logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _chunked(model, batch, chunk_tokens: int):
    model.zero_grad()
    logprobs, entropy = response_token_stats(model, batch, chunk_tokens, with_entropy=True)
    ((logprobs * WEIGHTS[0]).sum() + (entropy * WEIGHTS[1]).sum()).backward()
    return logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_same(got, expected) -> None:
    """fp32, the same maths summed in another order (chunks, a written-out backward): 1e-6 relative."""
    for name, value in zip(("logprobs", "entropy"), expected[:2]):
        torch.testing.assert_close(got[:2][name == "entropy"], value, rtol=1e-6, atol=1e-6, msg=name)
    assert got[2].keys() == expected[2].keys()
    for name, grad in expected[2].items():
        assert float(grad.abs().max()) > 0, name
        torch.testing.assert_close(got[2][name], grad, rtol=0, atol=1e-6 * float(grad.abs().max()), msg=name)


@pytest.mark.parametrize("tying", ["untied", "tied"])
@pytest.mark.parametrize("is_packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("chunk_tokens", [4, 64])  # 18 tokens: chunks of 4, 4, 4, 4, 2; one chunk larger than N
def test_chunks_give_the_unchunked_logprobs_entropy_and_gradients(models, tying, is_packed, chunk_tokens):
    model, batch = models[tying], _batch(is_packed)
    expected = _unchunked(model, batch)
    assert bool((expected[0][batch.response_mask == 1] < 0).all())
    _assert_same(_chunked(model, batch, chunk_tokens), expected)
    model.zero_grad()


def test_chunks_under_gradient_checkpointing(models):
    model, batch = models["tied"], _batch(is_packed=True)
    expected = _unchunked(model, batch)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()  # transformers recomputes the layers only in training mode (the tiny model has no dropout)
    try:
        _assert_same(_chunked(model, batch, 5), expected)
    finally:
        model.gradient_checkpointing_disable()
        model.eval()
        model.zero_grad()


def test_the_head_sees_no_position_in_the_model_forward(models):
    model, batch = models["untied"], _batch(is_packed=False)
    rows = []
    handle = model.lm_head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[-2]))
    try:
        with torch.no_grad():
            response_token_stats(model, batch, chunk_tokens=8)
    finally:
        handle.remove()
    # the model's own call gets zero positions, then the chunks of 18: on CPU the last one's 2 rows padded to 8
    assert rows == [0, 8, 8, 8]


def test_on_cpu_a_tokens_logits_do_not_depend_on_how_many_tokens_share_its_chunk(models):
    # MKL's matmul sums a row of fewer than 8 rows in another order than of more, so the chunks run over a full
    # chunk's rows: 3 tokens alone and the same 3 among 20 (chunks of 32) give the same bits
    head = models["untied"].lm_head
    hidden = torch.randn(20, 128, generator=torch.Generator().manual_seed(3))
    token_ids = torch.randint(0, 128, (20,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        alone = head_token_stats(head, hidden[:3], token_ids[:3], chunk_tokens=32, with_entropy=True)
        among = head_token_stats(head, hidden, token_ids, chunk_tokens=32, with_entropy=True)
    assert torch.equal(alone[0], among[0][:3]) and torch.equal(alone[1], among[1][:3])


def test_bad_chunk_sizes_and_transformed_logits_are_refused(models):
    model = models["untied"]
    with pytest.raises(ValueError, match=r"chunk_tokens must be ≥ 1: got 0; set --ds.logit_chunk_tokens"):
        head_token_stats(model.lm_head, torch.zeros(2, 128), torch.tensor([1, 2]), 0)
    model.config.final_logit_softcapping = 30.0
    try:
        with pytest.raises(ValueError, match=r"model type 'qwen3' transforms its logits \({'final_logit_softcapping"):
            response_token_stats(model, _batch(is_packed=True), chunk_tokens=8)
    finally:
        del model.config.final_logit_softcapping


def _allocations(run) -> tuple[int, int]:
    """(peak of the bytes allocated and not yet freed, largest single allocation) while `run()` runs on CPU, from
    the allocator's events that torch's profiler records."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = largest = 0
    for event in events:
        live += event.nbytes()  # negative when freed
        peak, largest = max(peak, live), max(largest, event.nbytes())
    return peak, largest


def test_memory_grows_with_the_chunk_not_with_tokens_times_vocabulary():
    # 512 response tokens × a 16,384-entry vocabulary (32 MiB of fp32 logits) in chunks of 64 (4 MiB): 4,096 × 32k
    # in chunks of 512 scaled down for the suite's time; the control runs the same path in one chunk
    from transformers import Qwen3Config, Qwen3ForCausalLM

    vocab, hidden, tokens, chunk = 16384, 16, 512, 64
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                         tie_word_embeddings=True))
    response = torch.randint(3, vocab, (tokens,), generator=torch.Generator().manual_seed(1)).tolist()
    batch = make_sequence_batch([[1, 2]], [response], pad_id=0, is_packed=True)

    def forward_backward(chunk_tokens: int):
        model.zero_grad(set_to_none=True)
        logprobs, entropy = response_token_stats(model, batch, chunk_tokens, with_entropy=True)
        (logprobs.sum() + entropy.sum()).backward()

    chunked_peak, chunked_largest = _allocations(lambda: forward_backward(chunk))
    whole_peak, whole_largest = _allocations(lambda: forward_backward(tokens))
    chunk_logits, all_logits, weight = chunk * vocab * 4, tokens * vocab * 4, vocab * hidden * 4  # fp32 bytes
    assert chunked_largest <= chunk_logits  # no tensor beyond one chunk's logits
    assert whole_largest >= all_logits  # the control: in one chunk the profiler sees the (N × V) block
    # 3 fp32 blocks of a chunk at most (its logits, log p and p), and the shared weight's gradients (a chunk's, their
    # running sum, the embedding's) besides
    assert chunked_peak <= 3 * chunk_logits + 4 * weight, (chunked_peak - 4 * weight) / chunk_logits
    assert whole_peak >= 2 * all_logits
