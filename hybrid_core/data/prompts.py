"""Prompts of a run: the Prompt record, templating and the step sampler (loading is `prompt_sources`).

Owns which prompts step k sees: episode-wise shuffles seeded by the step contract's `derive_seed`,
`rollout.batch_size` prompts a step; with oversampling, the stream of those shuffles that the prompt ledger
(`prompt_ledger`) serves from. It knows nothing about generation or rewards; prompts are identified by their row
index in the loaded dataset.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from hybrid_core.data.prompt_sources import PromptRow, load_prompt_rows  # noqa: F401  (the loader, re-exported)
from hybrid_core.step_contract import derive_seed


@dataclass(frozen=True)
class Prompt:
    """One prompt of a step: `index` is its row in the loaded dataset, `source` the dataset of the
    `data.prompt_dataset` list it came from (as given there; "" when unknown)."""
    index: int
    text: str
    label: str
    source: str = ""


def format_prompt(text: str, tokenizer, apply_chat_template: bool, input_template: str | None) -> str:
    """The prompt string sent to the model: chat template, or `input_template.format(text)`, or the text itself."""
    if input_template is not None and "{}" not in input_template:
        raise ValueError(f"data.input_template must contain '{{}}' where the prompt goes: got {input_template!r}; "
                         "e.g. --data.input_template 'Question: {} Answer:'")
    if apply_chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    return input_template.format(text) if input_template else text


def step_count(num_rows: int, batch_size: int, num_episodes: int, max_steps: int | None = None,
               is_oversampling: bool = False) -> int:
    """How many steps a run has, capped by max_steps: whole batches of the dataset per episode, times the episodes;
    with oversampling, the whole batches of all the episodes' prompts together (a step trains `batch_size` groups
    drawn from the stream of episode orders, so an episode's last prompts are not skipped but trained beside the next
    episode's first)."""
    total = num_episodes * num_rows // batch_size if is_oversampling else num_episodes * (num_rows // batch_size)
    return min(total, max_steps) if max_steps else total


class PromptSampler:
    """Maps step k (1-based) to its prompts: episode e = (k-1) // steps_per_episode, shuffled by
    derive_seed(seed, "episode", e). With oversampling the prompt ledger draws from `stream_entry` instead."""

    def __init__(self, rows: list[PromptRow] | list[tuple[str, str]], batch_size: int, num_episodes: int, seed: int,
                 max_steps: int | None = None, is_oversampling: bool = False):
        if len(rows) < batch_size:
            raise ValueError(f"rollout.batch_size exceeds the prompt dataset: got {batch_size} prompts a step and "
                             f"{len(rows)} rows; lower rollout.batch_size or add prompts")
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self.steps_per_episode = len(rows) // batch_size
        self.num_steps = step_count(len(rows), batch_size, num_episodes, max_steps, is_oversampling)
        self._orders: dict[int, list[int]] = {}  # the episode orders the stream reads (the last two kept)

    def refill_for_step(self, step: int, exclude: set[int]) -> list[Prompt]:
        """Replacement prompts for dynamic filtering: every other row, in an order seeded by (seed, step)."""
        order = [i for i in range(len(self.rows)) if i not in exclude]
        random.Random(derive_seed(self.seed, step, "refill")).shuffle(order)
        return [Prompt(i, *self.rows[i]) for i in order]

    def episode_order(self, episode: int) -> list[int]:
        """Every row index once, shuffled by derive_seed(seed, "episode", e)."""
        if episode not in self._orders:
            order = list(range(len(self.rows)))
            random.Random(derive_seed(self.seed, "episode", episode)).shuffle(order)
            self._orders = {e: o for e, o in self._orders.items() if e == episode - 1} | {episode: order}
        return self._orders[episode]

    def stream_entry(self, position: int) -> tuple[int, int]:
        """Oversampling: the (episode, row index) at `position` of the stream of episode orders, one after another."""
        episode, offset = divmod(position, len(self.rows))
        return episode, self.episode_order(episode)[offset]

    def prompt(self, index: int) -> Prompt:
        return Prompt(index, *self.rows[index])

    def for_step(self, step: int) -> list[Prompt]:
        if not 1 <= step <= self.num_steps:
            raise ValueError(f"step must be in 1..{self.num_steps}: got {step}")
        episode, offset = divmod(step - 1, self.steps_per_episode)
        picked = self.episode_order(episode)[offset * self.batch_size:(offset + 1) * self.batch_size]
        return [self.prompt(i) for i in picked]
