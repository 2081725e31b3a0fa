"""Loading prompt datasets: every kind of source `data.prompt_dataset` names, comma lists mixed by
`data.prompt_probs`, and the checks of each row.

A source is a local JSONL/JSON/CSV/Parquet/Arrow file, a folder of such files, a `save_to_disk` folder (a Dataset, or
a DatasetDict whose `data.prompt_split` is taken), or a hub name passed to `datasets.load_dataset(name,
split=data.prompt_split)`; an unreachable hub is an error naming the dataset, HF_HUB_OFFLINE and a local path.
A comma list is mixed as OpenRLHF's `blending_datasets` mixes it: with `data.prompt_probs`,
`datasets.interleave_datasets(probabilities, seed=train.seed, stopping_strategy="all_exhausted")` (OpenRLHF's
default: the mix draws until every source has been used up once, so the smaller ones repeat); without, the sources
are concatenated in order. `data.max_samples` caps each source and then the mix (OpenRLHF's `max_count`, then its
`select`). Every row keeps the source it came from, written as in the list (`PromptRow.source`).

It knows nothing about sampling, templates or tokenizers.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from hybrid_core.config_rules import prompt_probs_problems
from hybrid_core.data.hub import hub_offline, is_hub_name

LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
SAVED_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")  # what `save_to_disk` writes
STOPPING_STRATEGY = "all_exhausted"  # OpenRLHF's blending_datasets default


class PromptRow(NamedTuple):
    """One prompt of the loaded dataset: its input text, its label ("" without `data.label_key`) and the source it
    came from (a name of the `data.prompt_dataset` list, as given)."""
    text: str
    label: str
    source: str


class HubUnreachableError(ConnectionError):
    """A hub dataset was named but the hub cannot be reached (offline mode, no network, DNS failure)."""


def source_names(dataset: str) -> list[str]:
    """The comma list of `data.prompt_dataset`, stripped; an empty entry is an error."""
    names = [name.strip() for name in dataset.split(",")]
    if not all(names):
        raise ValueError(f"data.prompt_dataset has an empty entry: got {dataset!r}; separate dataset names with "
                         "single commas")
    return names


def mix_probabilities(probs: str | None, names: list[str]) -> list[float] | None:
    """`data.prompt_probs` as one probability per dataset (normalised), or None (concatenate); a bad list (a count
    other than the datasets', a negative, a sum far from 1) is a ValueError naming both flags."""
    if problems := prompt_probs_problems(",".join(names), probs):
        raise ValueError(problems[0])
    if probs is None or not probs.strip():
        return None
    values = [float(p) for p in probs.split(",")]
    return [v / sum(values) for v in values]


def open_source(name: str, split: str):
    """One source as a `datasets.Dataset`."""
    import datasets

    path = Path(name)
    if path.suffix.lower() in LOCAL_FORMATS:
        if not path.is_file():
            raise FileNotFoundError(f"data.prompt_dataset {name!r} does not exist; give a local file, a folder or a "
                                    "hub dataset name")
        return datasets.load_dataset(LOCAL_FORMATS[path.suffix.lower()], data_files=str(path), split="train")
    if path.is_dir():
        is_saved = any((path / marker).is_file() for marker in SAVED_MARKERS)
        ds = datasets.load_from_disk(str(path)) if is_saved else datasets.load_dataset(str(path), split=split)
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"data.prompt_split {split!r} is not a split of {name!r}: its splits are "
                                 f"{sorted(ds)}; pass --data.prompt_split one of them")
            ds = ds[split]
        return ds
    if not is_hub_name(name):
        raise FileNotFoundError(f"data.prompt_dataset {name!r} does not exist and is not a hub dataset name; give "
                                "a local file, a folder or a hub name such as owner/dataset")
    return _hub_dataset(name, split)


def _hub_dataset(name: str, split: str):
    import datasets

    try:
        return datasets.load_dataset(name, split=split)
    except ConnectionError as err:
        why = "HF_HUB_OFFLINE=1 is set and it is not in the local cache" if hub_offline() else \
            "the hub cannot be reached (no network or DNS)"
        raise HubUnreachableError(
            f"data.prompt_dataset {name!r} is a Hugging Face hub dataset, but {why} ({err}): give a local path "
            "instead (a JSONL/Parquet file or a save_to_disk folder), or download it where the hub can be reached "
            "and run with HF_HUB_OFFLINE=1 to read it from the cache") from None


def _where(name: str, split: str, row: int) -> str:
    """The row in words: the file and line (1-based) where the source is a local file or folder, else the row."""
    from hybrid_core.data.prompt_check import iter_records

    if Path(name).exists():
        for number, (where, _) in enumerate(iter_records(name, split)):
            if number == row:
                return where
    return f"{name} row {row + 1}"


def _source_rows(name: str, split: str, input_key: str, label_key: str | None, max_samples: int | None):
    ds = open_source(name, split)
    for key, flag in ((input_key, "data.input_key"), (label_key, "data.label_key")):
        if key is not None and key not in ds.column_names:
            raise ValueError(f"{flag} {key!r} is not a column of {name!r}: its columns are {ds.column_names}; set "
                             f"--{flag} to one of them")
    if max_samples is not None and max_samples < len(ds):
        ds = ds.select(range(max_samples))
    inputs = ds[input_key]
    labels = ds[label_key] if label_key else [""] * len(inputs)
    empty = [i for i, x in enumerate(inputs) if x is None or (isinstance(x, str) and not x.strip())]
    if empty:  # never train on the text "None"
        row = ds[empty[0]]
        keys = sorted(k for k, v in row.items() if v is not None)
        what = "an empty" if row[input_key] is not None else "no"
        raise ValueError(f"{_where(name, split, empty[0])} has {what} {input_key!r} (data.input_key): its keys are "
                         f"{keys} ({len(empty)} of the {len(inputs)} rows of {name!r} lack one): give every prompt a "
                         "non-empty input")
    if not_text := [i for i, x in enumerate(inputs) if not isinstance(x, str)]:  # hub data, unseen by the preflight
        first = not_text[0]
        raise ValueError(f"{_where(name, split, first)} has {input_key!r} (data.input_key) of type "
                         f"{type(inputs[first]).__name__}, not a string ({len(not_text)} of the {len(inputs)} rows of {name!r}): "
                         "write every prompt as a string")
    return list(inputs), ["" if y is None else str(y) for y in labels]


def load_prompt_rows(dataset: str, input_key: str, label_key: str | None, split: str = "train",
                     max_samples: int | None = None, probs: str | None = None, seed: int = 42) -> list[PromptRow]:
    """The run's prompts: every source of the comma list loaded and checked, then concatenated or mixed by `probs`
    (seeded by `seed`), then capped at `max_samples`."""
    import datasets

    names = source_names(dataset)
    weights = mix_probabilities(probs, names)
    parts = []
    for name in names:
        texts, labels = _source_rows(name, split, input_key, label_key, max_samples)
        if not texts and weights is not None and weights[len(parts)] > 0:
            raise ValueError(f"data.prompt_dataset {name!r} has no rows but data.prompt_probs gives it "
                             f"{weights[len(parts)]:g}: add prompts or drop it from the mix")
        parts.append(datasets.Dataset.from_dict({"text": texts, "label": labels, "source": [name] * len(texts)}))
    if len(parts) == 1:
        mixed = parts[0]
    elif weights is None:
        mixed = datasets.concatenate_datasets(parts)
    else:
        mixed = datasets.interleave_datasets(parts, probabilities=weights, seed=seed,
                                             stopping_strategy=STOPPING_STRATEGY)
    if max_samples is not None and max_samples < len(mixed):
        mixed = mixed.select(range(max_samples))
    return [PromptRow(*row) for row in zip(mixed["text"], mixed["label"], mixed["source"])]
