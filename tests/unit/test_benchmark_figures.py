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


def test_generation_is_judged_against_the_decode_roofline_of_its_own_step(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bench = runpy.run_path(str(REPO_ROOT / "benchmarks" / "bench_iteration.py"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_1P7B))
    with (model / "model.safetensors").open("wb") as weights:
        weights.truncate(3_000_000_000)  # only its size counts: the weights read at every decode step
    rollout = tmp_path / "steps" / "2" / "rollout"
    rollout.mkdir(parents=True)
    pq.write_table(pa.table({"prompt_ids": [[1] * 90, [1] * 110], "response_ids": [[2] * 1024, [2] * 512]}),
                   rollout / "part-00000.parquet")
    rows = {2: {"timing_s/rollout": 1.2, "timing_s/generate": 1.0}}  # a metrics row's keys: no token count
    figures = bench["generation_vs_roofline"](tmp_path, rows, model, copy_gbps=4000.0)
    # mean context 100 + 768 / 2 = 484; KV bytes a token 28 layers · 2 · 8 heads · 128 · 2 bytes = 114,688; a decode
    # step reads 3e9 + 2 · 484 · 114,688 = 3,111,017,984 bytes at 4 TB/s: 2 tokens in 777.754496 µs, 2,571.5 tok/s
    roofline = 2 / (3_111_017_984 / 4e12)
    assert figures == {2: {"tok_s": 1536, "roofline_tok_s": roofline, "fraction": 1536.0 / roofline,
                           "sequences": 2, "mean_context": 484.0}}
    assert abs(figures[2]["fraction"] - 0.597315) < 1e-6
    # an fp8 KV cache: a byte a value, 57,344 bytes a token; 3e9 + 2 · 484 · 57,344 = 3,055,508,992 bytes a step
    fp8 = bench["generation_vs_roofline"](tmp_path, rows, model, copy_gbps=4000.0, kv_cache_dtype="fp8")
    assert fp8[2]["roofline_tok_s"] == 2 / (3_055_508_992 / 4e12)


def test_machine_counters_are_parsed_and_averaged_over_each_stage_window():
    counters = runpy.run_path(str(REPO_ROOT / "benchmarks" / "host_counters.py"))
    assert counters["parse_sample"]("87, 1980, 3201, 412.57\n") == {"gpu_util_pct": 87.0, "sm_mhz": 1980.0,
                                                                      "mem_mhz": 3201.0, "power_w": 412.57}
    assert counters["parse_sample"]("87, 1980, 3201, [N/A]") == {"gpu_util_pct": 87.0, "sm_mhz": 1980.0,
                                                                  "mem_mhz": 3201.0}  # no power reading
    assert counters["parse_sample"]("[N/A], [N/A], [N/A], [N/A]") is None
    assert counters["parse_sample"]("utilization.gpu [%], clocks.sm [MHz]") is None
    # user nice system idle iowait irq softirq steal: busy 100+0+50+0+10+5+0 = 165 of 1,265, then 265 of 1,465
    before = counters["cpu_times"]("cpu  100 0 50 1000 100 10 5 0 0 0")
    after = counters["cpu_times"]("cpu  150 0 100 1100 100 10 5 0 0 0")
    assert (before, after) == ((165, 1265), (265, 1465))
    assert counters["busy_fraction"](before, after) == 0.5
    events = [{"step": 2, "stage": "rollout", "event": "start", "time": 10.0},
              {"step": 2, "stage": "rollout", "event": "start", "time": 11.0},  # a retry: its last start counts
              {"step": 2, "stage": "rollout", "event": "commit", "time": 13.0},
              {"step": 2, "stage": "advantage", "event": "start", "time": 13.0},
              {"step": 2, "stage": "advantage", "event": "commit", "time": 13.5},
              {"step": 2, "stage": "train", "event": "start", "time": 14.0},
              {"step": 3, "stage": "rollout", "event": "start", "time": 20.0}]  # cut off before its commit
    samples = [(10.5, {"sm_mhz": 1000.0, "cpu_busy": 0.9}),
               (11.0, {"sm_mhz": 1980.0, "cpu_busy": 0.25, "power_w": 400.0}),  # the only power reading
               (12.0, {"sm_mhz": 1500.0, "cpu_busy": 0.5}), (13.0, {"sm_mhz": 1800.0, "cpu_busy": 0.75})]
    stage_counters = runpy.run_path(str(REPO_ROOT / "benchmarks" / "bench_iteration.py"))["stage_counters"]
    assert stage_counters(events, samples) == {2: {"rollout": {"sm_mhz": 1760.0, "cpu_busy": 0.5, "power_w": 400.0,
                                                               "sm_mhz_min": 1500.0, "samples": 3},
                                                   "advantage": {"sm_mhz": 1800.0, "cpu_busy": 0.75,
                                                                 "sm_mhz_min": 1800.0, "samples": 1}}}
    assert counters["window_means"](samples, 14.0, 15.0) == {"samples": 0}


def test_gpu_idle_time_is_attributed_to_the_innermost_host_call_and_the_activity_that_ended_it(tmp_path):
    gap_figures = runpy.run_path(str(REPO_ROOT / "benchmarks" / "gpu_gaps.py"))["gap_figures"]

    def event(name, start, duration, category):
        return {"ph": "X", "name": name, "ts": start, "dur": duration, "cat": category}

    # two engine steps, 0–100 µs and 100–180 µs; the GPU works 0–30, 20–50 (overlapping), 70–130 and 170–180
    trace = [event("host:engine_step", 0, 100, "user_annotation"),
             event("host:sample_tokens", 55, 5, "gpu_user_annotation"),  # a range's GPU-side shadow: not host
             event("host:schedule", 40, 40, "user_annotation"),
             event("host:engine_step", 100, 80, "user_annotation"),
             event("host:update_from_output", 130, 30, "user_annotation"),
             event("graph", 0, 30, "kernel"), event("graph", 20, 30, "kernel"),
             event("sampler", 70, 60, "kernel"), event("copy", 170, 10, "gpu_memcpy"),
             event("aten::mm", 55, 500, "cpu_op")]  # host work outside the ranges is not GPU activity
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": trace}))
    figures = gap_figures(tmp_path / "trace.json")
    # idle 50–70 (schedule open from 40 to 80 → all of it schedule) and 130–170 (update 130–160, engine_step 160–170)
    assert figures["steps"] == 2
    assert figures["gaps"] == 2
    assert figures["gpu_idle_s"] == 60e-6
    assert figures["gpu_busy_fraction"] == 1 - 60 / 180
    assert figures["idle_ms_a_step_by_host_range"] == {"host:update_from_output": 30e-3 / 2,
                                                        "host:schedule": 20e-3 / 2, "host:engine_step": 10e-3 / 2}
    assert figures["idle_ms_a_step_by_next_gpu_activity"] == {"copy": 40e-3 / 2, "sampler": 20e-3 / 2}


def test_an_update_s_gpu_idle_time_is_read_in_its_own_window_range(tmp_path):
    import pytest

    gap_figures = runpy.run_path(str(REPO_ROOT / "benchmarks" / "gpu_gaps.py"))["gap_figures"]
    # one update 0–1,000 µs; a micro-batch 0–600 holds its tensors' building (0–100) and its backward (300–600)
    trace = [{"ph": "X", "name": name, "ts": start, "dur": duration, "cat": category}
             for name, start, duration, category in (
                 ("host:fit_actor", 0, 1000, "user_annotation"), ("host:micro_batch", 0, 600, "user_annotation"),
                 ("host:build_micro_batch", 0, 100, "user_annotation"), ("host:backward", 300, 300, "user_annotation"),
                 ("fwd", 100, 200, "kernel"), ("bwd", 350, 600, "kernel"))]
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": trace}))
    figures = gap_figures(tmp_path / "trace.json", window="host:fit_actor")
    # idle 0–100 (building), 300–350 (backward's launch) and 950–1,000 (the update's end, outside the micro-batch)
    assert figures["steps"] == 1
    assert figures["gpu_idle_s"] == 200e-6
    assert figures["idle_ms_a_step_by_host_range"] == {"host:build_micro_batch": 0.1, "host:fit_actor": 0.05,
                                                        "host:backward": 0.05}
    with pytest.raises(ValueError, match="no host:engine_step range"):
        gap_figures(tmp_path / "trace.json")


def test_overlap_saving_is_the_serial_time_the_overlap_hid_over_the_shorter_job():
    overlap_summary = runpy.run_path(str(REPO_ROOT / "benchmarks" / "probe_gpu_overlap.py"))["overlap_summary"]
    hidden_half = overlap_summary({"decode": 2.0, "forward": 1.0}, {"decode": 2.5, "forward": 1.5})
    assert hidden_half == {"wall_s": 2.5, "serial_s": 3.0, "saving_fraction": 0.5, "decode_slowdown": 1.25,
                           "forward_slowdown": 1.5}
    serial = overlap_summary({"decode": 2.0, "forward": 1.0}, {"decode": 3.0, "forward": 1.0})
    assert serial["saving_fraction"] == 0.0
    assert overlap_summary({"decode": 2.0, "forward": 1.0}, {"decode": 2.0, "forward": 1.0})["saving_fraction"] == 1.0
