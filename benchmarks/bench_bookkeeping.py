"""The host-side bookkeeping of one step at the 1.7B iteration shape (issue 17's orchestration figure), on the CPU:
committing the rollout and advantage datasets (Parquet, sha256, the manifest) and building the metrics row from
what the step committed. Each figure beside its baseline, measured in the same process:
- `commit_*_s`: `RolloutStore.commit` as the stages call it, against Parquet's default encoding (a dictionary for
  every column, what the store wrote before 2026-12-02);
- `metrics_row_s`: the actor's `write_metrics` reads (`METRIC_COLUMNS` only) and `row_from_records`, against reading
  whole tables and taking the moments with `statistics` (exact fractions), as before;
- `manifest_step_s_1000`: a step's manifest reads and updates after 1,000 steps, against parsing at every read.
Shape: 32 prompts × 8 samples, 128-token prompts, 1,024-token responses (benchmarks/configs/h200-iteration.yaml).
Best of `--repeats`; prints one JSON line and writes it to `--out`.
Usage: python benchmarks/bench_bookkeeping.py [--out FILE.json] [--repeats N]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hybrid_core.data import rollout_store  # noqa: E402
from hybrid_core.data.rollout_store import RolloutStore  # noqa: E402
from hybrid_core.data.stage_tables import (METRIC_COLUMNS, advantage_table, reward_table,  # noqa: E402
                                           rollout_table, row_from_records)

NUM_SAMPLES, PROMPT_TOKENS, RESPONSE_TOKENS, SAMPLES_PER_PROMPT = 256, 128, 1024, 8


def step_tables(seed: int = 0) -> dict[str, pa.Table]:
    rng = np.random.default_rng(seed)
    keys = [(i // SAMPLES_PER_PROMPT, i % SAMPLES_PER_PROMPT) for i in range(NUM_SAMPLES)]

    def floats() -> list[list[float]]:
        return [rng.standard_normal(RESPONSE_TOKENS).astype(np.float32).tolist() for _ in keys]

    rows = [{"prompt_index": p, "sample_index": s, "prompt_ids": rng.integers(0, 151936, PROMPT_TOKENS).tolist(),
             "response_ids": rng.integers(0, 151936, RESPONSE_TOKENS).tolist(), "prompt_text": "q" * 400,
             "response_text": "a" * 4000, "rollout_logprobs": row, "finish_reason": "length", "label": "17",
             "policy_version": 1, "data_source": "data/math_prompts.jsonl"} for (p, s), row in zip(keys, floats())]
    rewards = rng.random(NUM_SAMPLES).astype(np.float32).tolist()
    columns = {"old_logprobs": [[] for _ in keys], "ref_logprobs": floats(), "values": [[] for _ in keys],
               "advantages": floats(), "returns": floats()}
    return {"rollout": rollout_table(rows), "reward": reward_table(keys, rewards, rewards, [{}] * NUM_SAMPLES),
            "advantage": advantage_table(keys, columns)}


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def commit_figures(store: RolloutStore, tables: dict[str, pa.Table], repeats: int) -> dict[str, float]:
    def mib(stage: str) -> float:
        return sum(f.stat().st_size for f in Path(store.stage_path(1, stage)).glob("*.parquet")) / 2**20

    figures = {}
    for stage in ("rollout", "advantage"):
        commit = lambda: store.commit(1, stage, tables[stage], 1)  # noqa: E731
        default = rollout_store.dictionary_columns
        rollout_store.dictionary_columns = lambda schema: True  # Parquet's default: every column
        try:
            figures[f"commit_{stage}_s_all_dictionary"] = best_of(repeats, commit)
            figures[f"commit_{stage}_mib_all_dictionary"] = mib(stage)
        finally:
            rollout_store.dictionary_columns = default
        figures[f"commit_{stage}_s"] = best_of(repeats, commit)
        figures[f"commit_{stage}_mib"] = mib(stage)
    store.commit(1, "reward", tables["reward"], 1)
    return figures


def metrics_row_figures(store: RolloutStore, repeats: int) -> dict[str, float]:
    entries = store.manifest()["steps"]["1"]
    stages = ("rollout", "reward", "advantage")
    row = lambda: row_from_records(*(store.read(1, s, METRIC_COLUMNS[s]) for s in stages), entries)  # noqa: E731

    def before() -> None:
        rollout, reward, advantage = (store.read(1, s) for s in stages)
        tokens = [a for r in advantage.column("advantages").to_pylist() for a in r]
        rewards = reward.column("reward").to_pylist()
        statistics.fmean(tokens), statistics.pstdev(tokens), statistics.fmean(rewards), statistics.pstdev(rewards)
        statistics.fmean([len(r) for r in rollout.column("response_ids").to_pylist()])

    return {"metrics_row_s": best_of(repeats, row), "metrics_row_s_whole_tables_statistics": best_of(repeats, before)}


# A step's manifest traffic, stage by stage, as the workers make it: (worker, stage, reads, then one update). Reads:
# the replay check, the invalidation before a dataset stage, the entries a stage reads, the entry returned after
# the commit; the rollout worker commits rollout and reward, the actor the rest.
STEP_MANIFEST_TRAFFIC = (("rollout", "rollout", 3), ("rollout", "reward", 3), ("actor", "advantage", 4),
                         ("actor", "train", 3), ("actor", "sync", 2), ("actor", "metrics", 4))


def manifest_figures(entries: dict, steps: int, repeats: int) -> dict[str, float]:
    """`manifest_step_s_<steps>`: one step's manifest reads and updates (STEP_MANIFEST_TRAFFIC) from two workers'
    stores, after `steps` steps of `entries` each; `..._parse_every_read` parses the file at every read, as the store
    did before 2026-12-02 (now it compares the bytes it last read or wrote)."""
    with tempfile.TemporaryDirectory() as root:
        stores = {"rollout": RolloutStore(root), "actor": RolloutStore(root)}
        stores["actor"].write_json(rollout_store.MANIFEST, {"steps": {str(k): entries for k in range(1, steps + 1)}})
        step = iter(range(steps + 1, steps + 1 + 2 * repeats))

        def one_step(parse_every_read: bool) -> None:
            k = next(step)
            for worker, stage, reads in STEP_MANIFEST_TRAFFIC:
                store = stores[worker]
                for _ in range(reads):
                    if parse_every_read:
                        store._manifest_cache = None
                    store.manifest()
                store.update_manifest(k, {stage: entries[stage]})

        figures = {f"manifest_step_s_{steps}_parse_every_read": best_of(repeats, lambda: one_step(True)),
                   f"manifest_step_s_{steps}": best_of(repeats, lambda: one_step(False))}
        figures[f"manifest_mib_{steps}"] = Path(root, rollout_store.MANIFEST).stat().st_size / 2**20
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    pq.write_table(pa.table({"x": [[1]]}), pa.BufferOutputStream())  # pyarrow's one-time set-up, off the clock
    tables = step_tables()
    with tempfile.TemporaryDirectory() as root:
        store = RolloutStore(root)
        figures = commit_figures(store, tables, args.repeats)
        figures |= metrics_row_figures(store, args.repeats)
        entries = store.manifest()["steps"]["1"]
    # train, sync and metrics records as a run commits them: the seconds and about fifteen figures each
    record = {"seconds": 0.0653, "metrics": {f"figure_{i:02d}": 0.042648226022720 + i for i in range(15)}}
    figures |= manifest_figures(entries | {stage: record for stage in ("train", "sync", "metrics")}, 1000,
                                args.repeats)
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                         text=True).stdout.strip()
    result = {"meta": {"date": date.today().isoformat(), "git_sha": sha, "machine": platform.node(),
                       "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                       "pyarrow": pa.__version__, "shape": {"samples": NUM_SAMPLES, "prompt_tokens": PROMPT_TOKENS,
                                                            "response_tokens": RESPONSE_TOKENS}},
              "figures": figures}
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
