"""The policy's vocabulary head in token chunks: response logprobs and entropy without (tokens × vocabulary) logits.

Owns how every logprob path (the actor's update and old logprobs, the reference, the entropy bonus and its logged
value) runs a causal LM. The model runs with its head given no position; a forward pre-hook on the head takes the
final hidden states it would have seen, and the N response positions' (N, H) rows are kept. The head then runs on
chunks of `chunk_tokens` of them; each chunk's logits go at once to the taken token's logprob and the entropy
(in fp32: `algorithms.logprobs`' maths, on CUDA through the fused kernels of `logprob_kernel`), so a forward holds one
chunk's logits at a time. With ring attention
(`batch.ring`) the forward, the positions and the tokens are this rank's share of the packed row, so its head runs in
chunks over its own response tokens, and `to_response_layout` gathers the ring's results into the whole (B, T).

Backward: each chunk is recomputed (torch.utils.checkpoint, non-reentrant), so the logits of one chunk at a time
exist there too. Chosen over a custom autograd Function that takes the head's weight because every chunk goes
through the head module: under ZeRO-3, DeepSpeed's module hooks gather the partitioned weight for the forward and
again for the recompute (the way it does for gradient-checkpointed layers), and a tied weight (embedding = head)
gets its gradient through the one shared parameter. Nothing reads the weight outside a module's forward. The cost
is one more head matmul per chunk, 2·H·V FLOPs per token (about 2% of a Qwen3-4B step at 4k tokens, less when
longer). A fused cross-entropy (Liger's) computes the gradient in the forward for a loss it knows; a PPO loss's
gradient is known only later. Exact against the unchunked head: the same matmul rows and the same fp32 maths,
summed in another order. On CPU each chunk's matmul runs over a full chunk's rows (`_head_rows`), so that a token's
logits do not depend on how many tokens share its chunk (the on-policy update's bit-for-bit equality).

It knows nothing about DeepSpeed beyond calling the head as a module and keeping the calls of ZeRO-3 ranks in step
(`_chunk_starts`), nor about RL losses or where the sequences come from.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from hybrid_core.algorithms.logprobs import token_logprobs_and_entropy
from hybrid_core.config import LOGIT_CHUNK_TOKENS
from hybrid_core.engines.sequence_batch import SequenceBatch, model_inputs, to_response_layout

# Config fields with which a model transforms the head's output (Gemma 2's softcap, Cohere's and Granite's scales):
# the chunks compute the head's output only, so such a model would get other logprobs than its own forward.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def output_head(model) -> torch.nn.Module:
    """The vocabulary head of an HF causal LM, or of the one a DeepSpeed engine wraps (its `module`)."""
    causal_lm = getattr(model, "module", model)
    changed = {name: getattr(causal_lm.config, name) for name in LOGIT_TRANSFORMS
               if getattr(causal_lm.config, name, None) not in (None, 1, 1.0)}
    if changed:
        raise ValueError(f"model type {causal_lm.config.model_type!r} transforms its logits ({changed}): the chunked "
                         "vocabulary head computes plain lm_head logits; use a model without that transform")
    return causal_lm.get_output_embeddings()


def response_hidden_states(model, batch: SequenceBatch) -> torch.Tensor:
    """(N, H) the final hidden states at the N positions that predict a response token (`batch.response_positions`),
    from one forward of `model` whose vocabulary head is handed zero positions (it computes no logits)."""
    captured = []

    def take_head_input(module, args):
        captured.append(args[0])
        return (args[0][..., :0, :], *args[1:])

    handle = output_head(model).register_forward_pre_hook(take_head_input)
    try:
        model(**model_inputs(batch))
    finally:
        handle.remove()
    (hidden,) = captured
    return hidden.flatten(0, -2)[batch.response_positions]


def _chunk_starts(head: torch.nn.Module, num_tokens: int, chunk_tokens: int, device) -> list[int]:
    """Where each chunk starts: at least one chunk (an empty one when there are no tokens). A head partitioned by
    ZeRO-3 (DeepSpeed marks its parameters with `ds_id`) is gathered by a collective at every call, forward and
    recompute, so every data-parallel rank must call it as often: the count is the ranks' largest, and a rank with
    fewer tokens runs empty chunks (starting at `num_tokens`)."""
    num_chunks = max(1, -(-num_tokens // chunk_tokens))
    is_partitioned = any(hasattr(param, "ds_id") for param in head.parameters())
    if is_partitioned and dist.is_initialized() and dist.get_world_size() > 1:
        most = torch.tensor([num_chunks], device=device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        num_chunks = int(most.item())
    return [min(i * chunk_tokens, num_tokens) for i in range(num_chunks)]


def _chunk_stats(head: torch.nn.Module, hidden: torch.Tensor, token_ids: torch.Tensor, with_entropy: bool,
                 num_rows: int, kernel: str | None):
    """The chunk's stats, the head run over at least `num_rows` rows: `hidden`'s, zero-padded when fewer (the
    padding's logits are dropped before the maths, so its rows get no gradient). An empty chunk (a ZeRO-3 rank's
    extra call) has no results to match and is not padded."""
    num_tokens = len(hidden)
    if 0 < num_tokens < num_rows:
        logits = head(F.pad(hidden, (0, 0, 0, num_rows - num_tokens)))[:num_tokens]
    else:
        logits = head(hidden)
    logprobs, entropy = _token_stats(logits, token_ids, with_entropy, kernel)
    return logprobs, entropy if with_entropy else logprobs.new_zeros(0)


def _token_stats(logits: torch.Tensor, token_ids: torch.Tensor, with_entropy: bool, kernel: str | None):
    """A chunk's maths: the fused Triton kernels on CUDA (`logprob_kernel`, imported there only: the CPU build
    need not have Triton), `algorithms.logprobs`' PyTorch ops elsewhere or when `kernel` (`ds.logprob_kernel`) is
    `torch`."""
    if logits.is_cuda:
        from hybrid_core.engines.logprob_kernel import fused_applies, fused_token_logprobs_and_entropy

        if fused_applies(logits, kernel):
            return fused_token_logprobs_and_entropy(logits, token_ids, with_entropy)
    return token_logprobs_and_entropy(logits, token_ids, with_entropy)


def _head_rows(device: torch.device, chunk_tokens: int) -> int:
    """Rows each chunk's head matmul runs over at least. On CPU a full chunk's, whatever the chunk holds: MKL's
    matmul sums a row's products in an order that depends on how many rows the matrix has (fewer than 8 rows take
    another kernel than more), so a token's logits would depend on how many tokens share its chunk. The advantage
    stage's forward and the update cut their micro-batches differently, so the on-policy update (old logprobs from
    its own forward) would differ from the separate forward in the last bit; a fixed row count makes them equal bit
    for bit. Only a call's last chunk is short, so this costs at most one chunk's rows a call. On CUDA the chunk's
    own rows: bit-for-bit equality is not asked there, and padding would cost GPU memory and time."""
    return chunk_tokens if device.type == "cpu" else 0


def head_token_stats(head: torch.nn.Module, hidden: torch.Tensor, token_ids: torch.Tensor, chunk_tokens: int,
                     with_entropy: bool = False, kernel: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N,) logprobs of `token_ids` and, with `with_entropy`, (N,) entropy, the head run on `chunk_tokens` rows of
    `hidden` (N, H) at a time, by `kernel` (`ds.logprob_kernel`); with gradients each chunk is recomputed in the
    backward. N = 0 still runs the head on the empty rows, so the result stays connected to the model (a loss over it
    backpropagates zeros)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be ≥ 1: got {chunk_tokens}; set --ds.logit_chunk_tokens")
    pieces = []
    num_rows = _head_rows(hidden.device, chunk_tokens)
    for start in _chunk_starts(head, len(token_ids), chunk_tokens, hidden.device):
        args = (head, hidden[start:start + chunk_tokens], token_ids[start:start + chunk_tokens], with_entropy,
                num_rows, kernel)
        if torch.is_grad_enabled():
            pieces.append(checkpoint(_chunk_stats, *args, use_reentrant=False, preserve_rng_state=False))
        else:
            pieces.append(_chunk_stats(*args))
    logprobs = torch.cat([chunk_logprobs for chunk_logprobs, _ in pieces])
    return logprobs, torch.cat([chunk_entropy for _, chunk_entropy in pieces]) if with_entropy else None


def response_token_stats(model, batch: SequenceBatch, chunk_tokens: int, with_entropy: bool = False,
                         kernel: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token logprobs (B, T) of the response tokens and, with `with_entropy`, their entropy (B, T); zero where
    `response_mask` is 0 (`kernel`: `ds.logprob_kernel`)."""
    hidden = response_hidden_states(model, batch)
    logprobs, entropy = head_token_stats(output_head(model), hidden, batch.flat_response_ids, chunk_tokens,
                                         with_entropy, kernel)
    return to_response_layout(logprobs, batch), to_response_layout(entropy, batch) if with_entropy else None


def response_logprobs(model, batch: SequenceBatch, chunk_tokens: int = LOGIT_CHUNK_TOKENS,
                      kernel: str | None = None) -> torch.Tensor:
    """Per-token logprobs (B, T) of the response tokens, zero where `response_mask` is 0."""
    return response_token_stats(model, batch, chunk_tokens, kernel=kernel)[0]
