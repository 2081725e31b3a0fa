"""The `eval` stage's dataset and its figures: one row per eval sample with its reward, and per data source pass@1
(the mean reward), pass@k (the mean over prompts of the best of their k rewards), response length and truncation
rate, as OpenRLHF's `compute_eval_metrics` reports them (`eval/<source>_pass1`, `eval/<source>_pass<k>`, …).

Owns the column names and the metric keys; it knows nothing about how the samples were generated or scored.
"""
from __future__ import annotations

import re
import statistics
from collections import defaultdict
from pathlib import PurePosixPath

import pyarrow as pa

ints = pa.list_(pa.int32())
EVAL_SCHEMA = pa.schema([
    ("prompt_index", pa.int64()), ("sample_index", pa.int32()), ("data_source", pa.string()),
    ("prompt_text", pa.string()), ("response_text", pa.string()), ("response_ids", ints),
    ("finish_reason", pa.string()), ("label", pa.string()), ("reward", pa.float32()), ("score", pa.float32()),
    ("extra_logs", pa.string()), ("policy_version", pa.int64()),
])
EVAL_PREFIX = "eval/"


def source_name(dataset: str) -> str:
    """A data source's name in metric keys: a file's stem, a folder's or hub dataset's last part, made of letters,
    digits, `_` and `-` only (`data/math.jsonl` → `math`, `zhuzilin/dapo-math-17k` → `dapo-math-17k`)."""
    path = PurePosixPath(dataset.rstrip("/"))
    stem = path.stem if path.suffix in (".jsonl", ".json", ".csv", ".parquet", ".arrow") else path.name
    return re.sub(r"[^A-Za-z0-9_-]+", "_", stem).strip("_") or "default"


def eval_table(samples: pa.Table, reward: pa.Table) -> pa.Table:
    """The committed rows: the generated `samples` (rollout columns), their data source's name in metric keys
    (`source_name` of the rollout's `data_source`) and their rewards."""
    columns = {name: samples.column(name) for name in EVAL_SCHEMA.names if name in samples.column_names}
    sources = [source_name(name) for name in samples.column("data_source").to_pylist()]
    columns |= {"data_source": pa.array(sources, pa.string())}
    columns |= {name: reward.column(name) for name in ("reward", "score", "extra_logs")}
    return pa.table({name: columns[name] for name in EVAL_SCHEMA.names}, schema=EVAL_SCHEMA)


def eval_figures(table: pa.Table, k: int) -> dict[str, float]:
    """Per data source: pass@1, pass@k (k > 1), mean response length (tokens) and the share of samples cut at
    max_new_tokens; plus `eval/num_samples`. Every prompt has exactly k samples."""
    groups: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    lengths: dict[str, list[int]] = defaultdict(list)
    truncated: dict[str, list[bool]] = defaultdict(list)
    rows = zip(table.column("data_source").to_pylist(), table.column("prompt_index").to_pylist(),
               table.column("reward").to_pylist(), table.column("response_ids").to_pylist(),
               table.column("finish_reason").to_pylist())
    for source, prompt, reward, response, finish in rows:
        groups[source][prompt].append(reward)
        lengths[source].append(len(response))
        truncated[source].append(finish == "length")
    figures = {f"{EVAL_PREFIX}num_samples": float(table.num_rows)}
    for source, prompts in sorted(groups.items()):
        rewards = [r for group in prompts.values() for r in group]
        figures[f"{EVAL_PREFIX}{source}_pass1"] = statistics.fmean(rewards)
        if k > 1:
            figures[f"{EVAL_PREFIX}{source}_pass{k}"] = statistics.fmean(max(g) for g in prompts.values())
        figures[f"{EVAL_PREFIX}{source}_response_length"] = statistics.fmean(lengths[source])
        figures[f"{EVAL_PREFIX}{source}_truncated"] = statistics.fmean(truncated[source])
    return figures


def eval_metric_keys(datasets: list[str], k: int) -> list[str]:
    """Every key `eval_figures` gives for samples of these `eval.dataset` sources, k samples a prompt."""
    per_source = ["pass1"] + ([f"pass{k}"] if k > 1 else []) + ["response_length", "truncated"]
    keys = {f"{EVAL_PREFIX}{source_name(name)}_{figure}" for name in datasets for figure in per_source}
    return sorted(keys | {f"{EVAL_PREFIX}num_samples"})


def metric_key_name(key: str) -> str:
    """A `ckpt.best_metric_key` as a metrics-row key: OpenRLHF's `eval_<source>_pass1` names `eval/<source>_pass1`."""
    return EVAL_PREFIX + key.removeprefix("eval_") if key.startswith("eval_") else key


def eval_only_row(entries: dict) -> dict[str, float]:
    """The metrics row of step 0 (`eval.at_start`): the evaluation's seconds and figures, nothing trained yet."""
    record = entries.get("eval") or {}
    figures = {key: float(value) for key, value in record.get("metrics", {}).items() if "/" in key}
    return {"timing_s/eval": float(record.get("seconds", 0.0))} | figures
