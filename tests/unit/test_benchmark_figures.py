"""The arithmetic behind the GPU benchmark figures (MFU's FLOP count, iteration walls from events.jsonl)."""
from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # the scripts import their shared module, as run_all.py does
QWEN3_1P7B = {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}


def test_flops_per_step_counts_matmuls_and_attention(tmp_path):
    flops_per_step = runpy.run_path(str(REPO_ROOT / "benchmarks" / "bench_train.py"))["flops_per_step"]
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_1P7B))
    # per layer: q,k,v 2048·(2048+2·1024) = 8,388,608; o 2048·2048 = 4,194,304; MLP 3·2048·6144 = 37,748,736
    # → 50,331,648 · 28 layers = 1,409,286,144, + output projection 151936·2048 = 311,164,928
    non_embedding = 1_720_451_072
    attention = 12 * 28 * 2048 * (100**2 + 200**2)
    assert flops_per_step(tmp_path, [100, 200]) == 6 * non_embedding * 300 + attention


def test_step_walls_are_the_gaps_between_metrics_commits(tmp_path):
    step_walls = runpy.run_path(str(REPO_ROOT / "benchmarks" / "bench_iteration.py"))["step_walls"]
    events = [{"step": 1, "stage": "rollout", "event": "start", "time": 1.0},
              {"step": 1, "stage": "metrics", "event": "commit", "time": 10.0},
              {"step": 2, "stage": "metrics", "event": "commit", "time": 25.0},
              {"step": 3, "stage": "rollout", "event": "commit", "time": 30.0},
              {"step": 3, "stage": "metrics", "event": "commit", "time": 45.5}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert step_walls(tmp_path) == {2: 15.0, 3: 20.5}


def test_step_rows_skip_a_step_cut_off_before_its_metrics_committed(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    step_rows = runpy.run_path(str(REPO_ROOT / "benchmarks" / "bench_iteration.py"))["step_rows"]
    committed = tmp_path / "steps" / "1" / "metrics"
    committed.mkdir(parents=True)
    pq.write_table(pa.table({"timing_s/rollout": [18.3]}), committed / "part-00000.parquet")
    (committed / "_SUCCESS").write_text("")
    (tmp_path / "steps" / "2" / "rollout").mkdir(parents=True)  # step 2 was cut off in its advantage stage
    assert step_rows(tmp_path) == {1: {"timing_s/rollout": 18.3}}
