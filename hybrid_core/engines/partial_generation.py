"""Partial rollout: one batch generated step by step on the vLLM engine, pausing between engine steps for a weight
update and going on with the new weights, every sampled token tagged with the policy version that sampled it.

Between two engine steps `pause_point()` is called: it returns at once, or, while a weight push is waiting, lets the
push load the new weights into the engine (the in-flight requests stay queued, their KV cache as computed so far)
and returns the version now loaded; the tokens of later steps carry it. A request finished with vLLM's own
finish reason; its tokens and logprobs are those it streamed. It knows nothing about Ray or the store.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from hybrid_core.engines.vllm_rollout import Completion, SamplingSettings, VllmRolloutEngine, first_logprobs


@dataclass
class _Stream:
    """One sample's tokens so far and the version of each."""

    token_ids: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    final: object = None  # vLLM's last CompletionOutput of the sample (its logprobs and finish reason)


@dataclass(frozen=True, kw_only=True)
class PartialCompletions:
    completions: list[list[Completion]]  # per prompt, its n samples
    token_versions: list[list[list[int]]]  # per prompt, per sample, the version of each response token
    num_pauses: int


def generate_partial(engine: VllmRolloutEngine, prompt_ids: Sequence[list[int]], sampling: SamplingSettings,
                     seeds: Sequence[int] | None, pause_point: Callable[[], int]) -> PartialCompletions:
    """`sampling.n` samples of each prompt (prompt i seeded by `seeds[i]`), the engine stepped until all finish;
    `pause_point()` between steps returns the version the engine holds (see the module)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine.check_generation_ready()
    version = pause_point()
    request_ids = [f"partial-{i}" for i in range(len(prompt_ids))]
    for request_id, ids, seed in zip(request_ids, prompt_ids, seeds or [None] * len(prompt_ids)):
        params = SamplingParams(n=sampling.n, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                top_p=sampling.top_p, logprobs=0 if sampling.logprobs else None, seed=seed,
                                detokenize=False, flat_logprobs=True, ignore_eos=sampling.ignore_eos,
                                output_kind=RequestOutputKind.CUMULATIVE)
        engine.llm.llm_engine.add_request(request_id, {"prompt_token_ids": list(ids)}, params)
    streams = {(r, j): _Stream() for r in request_ids for j in range(sampling.n)}
    unfinished, pauses = set(request_ids), 0
    try:
        while unfinished:
            for out in engine.llm.llm_engine.step():
                _extend(streams, out, version)
                if out.finished:
                    unfinished.discard(out.request_id)
            if unfinished:
                loaded = pause_point()
                pauses += loaded != version
                version = loaded
    except BaseException:
        engine.llm.llm_engine.abort_request(sorted(unfinished))
        raise
    return _completions(engine, request_ids, streams, sampling.n, pauses)


def _extend(streams: dict, out, version: int) -> None:
    """Take the new tokens of each sample `out` streamed (cumulative outputs: the tokens past those seen)."""
    for sample in out.outputs:
        stream = streams[(out.request_id, sample.index)]
        new = list(sample.token_ids[len(stream.token_ids):])
        stream.token_ids += new
        stream.versions += [version] * len(new)
        stream.final = sample


def _completions(engine: VllmRolloutEngine, request_ids: list[str], streams: dict, n: int,
                 pauses: int) -> PartialCompletions:
    ordered = [[streams[(r, j)] for j in range(n)] for r in request_ids]
    flat = [s for samples in ordered for s in samples]
    texts = iter(engine.tokenizer.batch_decode([s.token_ids for s in flat], skip_special_tokens=True))
    completions = [[_completion(s, next(texts)) for s in samples] for samples in ordered]
    versions = [[list(s.versions) for s in samples] for samples in ordered]
    return PartialCompletions(completions=completions, token_versions=versions, num_pauses=pauses)


def _completion(stream: _Stream, text: str) -> Completion:
    final = stream.final
    logprobs = first_logprobs(final.logprobs, start=0) if final is not None and final.logprobs is not None else None
    reason = "length" if final is not None and final.finish_reason == "length" else "stop"
    return Completion(stream.token_ids, logprobs, reason, text)
