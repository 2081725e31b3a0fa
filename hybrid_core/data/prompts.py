"""Prompt datasets: loading (local JSONL/JSON/CSV/Parquet or a dataset directory), templating and the step sampler.

Owns which prompts step k sees: episode-wise shuffles seeded by the step contract's `derive_seed`,
`rollout.batch_size` prompts a step.
It knows nothing about generation or rewards; prompts are identified by their row index in the loaded dataset.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from hybrid_core.step_contract import derive_seed

LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}


@dataclass(frozen=True)
class Prompt:
    index: int
    text: str
    label: str


def load_prompt_rows(dataset: str, input_key: str, label_key: str | None, split: str = "train",
                     max_samples: int | None = None) -> list[tuple[str, str]]:
    """Return (input, label) pairs; fails naming the key when a row lacks it."""
    import datasets

    path = Path(dataset)
    if path.suffix in LOCAL_FORMATS:
        if not path.is_file():
            raise FileNotFoundError(f"data.prompt_dataset not found: got {dataset!r}; give a local file or directory")
        ds = datasets.load_dataset(LOCAL_FORMATS[path.suffix], data_files=str(path), split="train")
    elif path.is_dir():
        ds = datasets.load_from_disk(str(path)) if (path / "dataset_info.json").exists() else \
            datasets.load_dataset(str(path), split=split)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    else:
        raise FileNotFoundError(f"data.prompt_dataset must be a local file or directory (no hub access here): "
                                f"got {dataset!r}")
    for key, flag in ((input_key, "data.input_key"), (label_key, "data.label_key")):
        if key is not None and key not in ds.column_names:
            raise ValueError(f"{flag} {key!r} is not a column of {dataset!r}: columns are {ds.column_names}")
    if max_samples is not None:
        ds = ds.select(range(min(max_samples, len(ds))))
    inputs, labels = ds[input_key], ds[label_key] if label_key else [""] * len(ds)
    empty = [i for i, x in enumerate(inputs) if x is None or (isinstance(x, str) and not x.strip())]
    if empty:  # never train on the text "None"
        raise ValueError(f"data.input_key {input_key!r} is missing or empty in {len(empty)} rows of {dataset!r} (row "
                         f"{empty[0]} first); give every prompt a non-empty input")
    return [(str(x), "" if y is None else str(y)) for x, y in zip(inputs, labels)]


def format_prompt(text: str, tokenizer, apply_chat_template: bool, input_template: str | None) -> str:
    """The prompt string sent to the model: chat template, or `input_template.format(text)`, or the text itself."""
    if apply_chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    return input_template.format(text) if input_template else text


def step_count(num_rows: int, batch_size: int, num_episodes: int, max_steps: int | None = None) -> int:
    """How many steps a run has: whole batches of the dataset per episode, times the episodes, capped by max_steps."""
    total = num_episodes * (num_rows // batch_size)
    return min(total, max_steps) if max_steps else total


class PromptSampler:
    """Maps step k (1-based) to its prompts: episode e = (k-1) // steps_per_episode, shuffled by
    derive_seed(seed, "episode", e)."""

    def __init__(self, rows: list[tuple[str, str]], batch_size: int, num_episodes: int, seed: int,
                 max_steps: int | None = None):
        if len(rows) < batch_size:
            raise ValueError(f"rollout.batch_size exceeds the prompt dataset: got {batch_size} prompts a step and "
                             f"{len(rows)} rows; lower rollout.batch_size or add prompts")
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self.steps_per_episode = len(rows) // batch_size
        self.num_steps = step_count(len(rows), batch_size, num_episodes, max_steps)

    def refill_for_step(self, step: int, exclude: set[int]) -> list[Prompt]:
        """Replacement prompts for dynamic filtering: every other row, in an order seeded by (seed, step)."""
        order = [i for i in range(len(self.rows)) if i not in exclude]
        random.Random(derive_seed(self.seed, step, "refill")).shuffle(order)
        return [Prompt(i, *self.rows[i]) for i in order]

    def for_step(self, step: int) -> list[Prompt]:
        if not 1 <= step <= self.num_steps:
            raise ValueError(f"step must be in 1..{self.num_steps}: got {step}")
        episode, offset = divmod(step - 1, self.steps_per_episode)
        order = list(range(len(self.rows)))
        random.Random(derive_seed(self.seed, "episode", episode)).shuffle(order)
        picked = order[offset * self.batch_size:(offset + 1) * self.batch_size]
        return [Prompt(i, *self.rows[i]) for i in picked]
