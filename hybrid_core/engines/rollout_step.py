"""One step's rollout and reward stages on the rollout side: prompts → n samples each → rows; rows → rewards.

Owns prompt tokenisation (template, left truncation to `max_len − max_new_tokens`), per-prompt seeds (the step
contract's `derive_seed` of run seed, step and prompt index), and turning completions and a reward source's scores
into stage rows.
It knows nothing about Ray or where rows are stored.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

from hybrid_core.data.prompts import Prompt, format_prompt
from hybrid_core.data.stage_tables import partial_rollout_table, reward_table, rollout_table, sample_keys
from hybrid_core.engines.partial_generation import generate_partial
from hybrid_core.engines.vllm_rollout import SamplingSettings, VllmRolloutEngine
from hybrid_core.rewards.sources import RewardSource
from hybrid_core.step_contract import derive_seed

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PromptFormat:
    apply_chat_template: bool
    input_template: str | None
    max_len: int


def truncate_left(ids: list[list[int]], budget: int) -> tuple[list[list[int]], int]:
    """Each token list cut to its last `budget` ids, and how many were cut."""
    num_cut = sum(len(row) > budget for row in ids)
    return [row[-budget:] for row in ids], num_cut


def tokenize_prompts(tokenizer, prompts: list[Prompt], fmt: PromptFormat, max_new_tokens: int):
    """Prompt strings and their token ids, left-truncated so prompt + response fits in `data.max_len`; a warning
    counts the prompts that were cut."""
    budget = max(1, fmt.max_len - max_new_tokens)
    texts = [format_prompt(p.text, tokenizer, fmt.apply_chat_template, fmt.input_template) for p in prompts]
    ids, num_cut = truncate_left([tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts], budget)
    if num_cut:
        logger.warning("%d of %d prompts are longer than data.max_len %d - rollout.max_new_tokens %d = %d tokens: "
                       "truncated from the left to the last %d tokens", num_cut, len(prompts), fmt.max_len,
                       max_new_tokens, budget, budget)
    return texts, ids


def generate_rows(engine: VllmRolloutEngine, tokenizer, prompts: list[Prompt], fmt: PromptFormat,
                  sampling: SamplingSettings, seed: int, step: int | str, policy_version: int,
                  pause_point: Callable[[], int] | None = None) -> pa.Table:
    """Generate `sampling.n` samples per prompt; rows are prompt-major (a prompt's samples are contiguous). Prompt
    i's seed is derive_seed(seed, step, index): `step` is the step, or "eval" for an evaluation's samples (the same
    at every evaluation, so two evaluations differ by the policy alone). With `pause_point` (partial rollout) the
    batch pauses for weight updates between engine steps and each row keeps its tokens' versions, its
    `policy_version` the oldest of them."""
    texts, ids = tokenize_prompts(tokenizer, prompts, fmt, sampling.max_new_tokens)
    seeds = [derive_seed(seed, step, p.index) for p in prompts] if sampling.seed_per_prompt else None
    if pause_point is not None:
        partial = generate_partial(engine, ids, sampling, seeds, pause_point)
        completions, token_versions = partial.completions, partial.token_versions
    else:
        completions, token_versions = engine.generate(ids, sampling, seeds), None
    rows = []
    for i, (prompt, text, prompt_ids, samples) in enumerate(zip(prompts, texts, ids, completions)):
        for j, c in enumerate(samples):
            rows.append({"prompt_index": prompt.index, "sample_index": j, "prompt_ids": prompt_ids,
                         "response_ids": c.token_ids, "prompt_text": text, "response_text": c.text,
                         "rollout_logprobs": c.logprobs, "finish_reason": c.finish_reason, "label": prompt.label,
                         "policy_version": policy_version, "data_source": prompt.source})
            if token_versions is not None:
                versions = token_versions[i][j]
                rows[-1] |= {"token_policy_version": versions, "policy_version": min(versions, default=policy_version)}
    return rollout_table(rows) if token_versions is None else partial_rollout_table(rows)


def reward_rows(rollout: pa.Table, source: RewardSource) -> pa.Table:
    """Score every sample with the reward source; query = prompt text + response text."""
    prompts = rollout.column("prompt_text").to_pylist()
    responses = rollout.column("response_text").to_pylist()
    queries = [p + r for p, r in zip(prompts, responses)]
    batch = source.score(queries, prompts, rollout.column("label").to_pylist(), sample_keys(rollout))
    return reward_table(sample_keys(rollout), batch.rewards, batch.scores, batch.extra_logs)


@dataclass(frozen=True, kw_only=True)
class GroupFilter:
    """Dynamic filtering: keep a prompt's group iff low < mean(group scores) < high."""

    low: float
    high: float


@dataclass(frozen=True, kw_only=True)
class FilteredRows:
    """What dynamic filtering kept: the passing groups' rows in the order they were generated, and every prompt
    generated (each round's, in order) with whether its group passed."""

    rows: pa.Table
    prompts: list[Prompt]
    passed: list[bool]

    @property
    def pass_rate(self) -> float:
        return sum(self.passed) / max(len(self.passed), 1)


def taking_from(prompts: list[Prompt]) -> Callable[[int], list[Prompt]]:
    """`draw(count)` over a fixed list: its next `count` prompts each call, none once it is used up."""
    left = list(prompts)

    def draw(count: int) -> list[Prompt]:
        taken, left[:] = left[:count], left[count:]
        return taken

    return draw


def filtered_rollout(generate: Callable[[list[Prompt]], pa.Table], score: Callable[[pa.Table], pa.Table],
                     prompts: list[Prompt], draw: Callable[[int], list[Prompt]], wanted: int, n: int,
                     keep: GroupFilter) -> FilteredRows:
    """Generate, score and keep the passing groups; while fewer than `wanted` passed, generate `draw(shortfall)`
    prompts more, until it gives none. Every passing group is kept: more than `wanted` only when the first prompts
    pass more (oversampling's surplus; a step's own `wanted` prompts cannot)."""
    import torch

    from hybrid_core.algorithms.filtering import keep_groups

    assert prompts, "filtered_rollout needs prompts to generate"
    accepted: list[pa.Table] = []
    tried: list[Prompt] = []
    passed: list[bool] = []
    pending = prompts
    while pending:
        table = generate(pending)
        scores = torch.tensor(score(table).column("score").to_pylist(), dtype=torch.float32)
        round_passed = keep_groups(scores, n, keep.low, keep.high).tolist()
        accepted += [table.slice(g * n, n) for g, is_passed in enumerate(round_passed) if is_passed]
        tried += pending
        passed += round_passed
        shortfall = wanted - sum(passed)
        pending = draw(shortfall) if shortfall > 0 else []
    rows = pa.concat_tables(accepted) if accepted else table.slice(0, 0)
    return FilteredRows(rows=rows, prompts=tried, passed=passed)
