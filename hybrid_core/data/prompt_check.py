"""Checking a prompt dataset before a run starts: it opens, holds at least a step's prompts, and every row has a
non-empty input (a bad row is named by file and row number, with the keys it has).

Reads local JSONL/JSON/CSV/Parquet/Arrow files and dataset directories (`datasets.save_to_disk` output, or a folder of
such files) with pyarrow and json only, so it takes well under a second where `datasets` would take seconds to
import. It knows nothing about how prompts are sampled or templated.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

MAX_ROWS_NAMED = 3
FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".arrow")


def _json_records(path: Path) -> Iterator[tuple[str, object]]:
    text = path.read_text()
    if path.suffix == ".json":
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None  # JSON lines in a .json file: read line by line below
        if isinstance(whole, list):
            yield from ((f"{path} item {i}", row) for i, row in enumerate(whole, start=1))
            return
        if isinstance(whole, dict):  # columns: {"input": [...], "label": [...]}
            columns = {k: v for k, v in whole.items() if isinstance(v, list)}
            num_rows = max((len(v) for v in columns.values()), default=0)
            yield from ((f"{path} row {i + 1}", {k: v[i] for k, v in columns.items() if i < len(v)})
                        for i in range(num_rows))
            return
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield f"{path} line {number}", json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} line {number} is not valid JSON ({err.msg} at column {err.colno}); fix or "
                                 "remove the line") from None


def _arrow_records(path: Path) -> Iterator[tuple[str, object]]:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        table = pq.read_table(path)
    elif path.suffix == ".csv":
        table = pcsv.read_csv(path)
    else:
        try:
            table = pa.ipc.open_stream(pa.memory_map(str(path))).read_all()  # datasets.save_to_disk writes streams
        except pa.ArrowInvalid:
            table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    yield from ((f"{path} row {i}", row) for i, row in enumerate(table.to_pylist(), start=1))


def _data_files(path: Path, split: str) -> list[Path]:
    if path.is_file():
        return [path]
    if (path / "dataset_dict.json").is_file() and (path / split).is_dir():
        path = path / split
    return sorted(p for p in path.rglob("*") if p.suffix in FILE_SUFFIXES and p.is_file()
                  and not p.name.startswith(("dataset_info", "state", "dataset_dict")))


def iter_records(dataset: str, split: str = "train") -> Iterator[tuple[str, object]]:
    """(where, row) for every row of a local prompt dataset, `where` naming the file and the row or line (both
    counted from 1)."""
    for file in _data_files(Path(dataset), split):
        yield from _json_records(file) if file.suffix in (".jsonl", ".json") else _arrow_records(file)


def _bad_row(where: str, row: object, input_key: str) -> str | None:
    if not isinstance(row, dict):
        return f"{where} is not an object with named fields: got {str(row)[:60]!r}"
    value = row.get(input_key)
    if value is None or (isinstance(value, str) and not value.strip()):
        what = "has no" if input_key not in row else f"has an empty ({value!r})"
        return (f"{where} {what} {input_key!r} (data.input_key): its keys are {sorted(row)}; give every prompt a "
                "non-empty input")
    if not isinstance(value, str):  # str() would train on "['a', 'b']"; chat message lists are not read either
        return (f"{where} has {input_key!r} (data.input_key) of type {type(value).__name__}, not a string: got "
                f"{str(value)[:60]!r}; write every prompt as a string (a chat conversation as its user message)")
    return None


def prompt_dataset_problems(dataset: str, input_key: str, label_key: str | None, batch_size: int,
                            max_samples: int, split: str = "train", field: str = "data.prompt_dataset") -> list[str]:
    """Why the dataset cannot feed the run (empty when it can): unreadable, a key no row has, rows without an
    input (the first few named), or fewer rows than `rollout.batch_size`. `field`: the flag that names it."""
    bad, keys, num_rows = [], set(), 0
    try:
        for where, row in iter_records(dataset, split):
            num_rows += 1
            keys |= set(row) if isinstance(row, dict) else set()
            if (problem := _bad_row(where, row, input_key)) and len(bad) < MAX_ROWS_NAMED:
                bad.append(problem)
    except (OSError, ValueError, UnicodeDecodeError) as err:  # pyarrow's ArrowInvalid is a ValueError
        return [f"{field} {dataset!r} cannot be read: {err}"]
    if num_rows and input_key not in keys:
        return [f"data.input_key {input_key!r} is not a column of {dataset!r}: its columns are {sorted(keys)}; set "
                "--data.input_key to one of them"]
    if num_rows == 0 and batch_size == 0:  # a mix's or eval's source: the loader would fail on it a minute later
        return [f"{field} {dataset!r} has no rows: add prompts or remove it from --{field}"]
    problems = [f"{field} row {problem}" for problem in bad]
    if label_key is not None and num_rows and label_key not in keys:
        problems.append(f"data.label_key {label_key!r} is not a column of {dataset!r}: its columns are "
                        f"{sorted(keys)}; set --data.label_key to one of them, or leave it unset")
    usable = min(num_rows, max_samples)
    if usable < batch_size:
        capped = f" ({usable} within data.max_samples {max_samples})" if usable < num_rows else ""
        problems.append(f"data.prompt_dataset {dataset!r} has {num_rows} rows{capped}, fewer than rollout.batch_size "
                        f"{batch_size}: lower --rollout.batch_size or add prompts")
    return problems
