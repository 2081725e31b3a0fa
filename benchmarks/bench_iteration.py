"""The product on one GPU: `hybrid train` runs (Prefect flow on the embedded server, Ray workers sharing the GPU,
vLLM, DeepSpeed, a Python reward), timed per stage, and the memory plan's peak checked against the measured one.

- iteration: 3 steps on the stand-in; per step the stages' seconds (rollout, reward, advantage, train, sync) with
  the sleep/wake inside them, and the wall between consecutive metrics commits (events.jsonl). Steps 2–3 count
  (step 1 warms up). Overhead = vLLM sleep + wake + DeepSpeed sleep + wake + sync + orchestration (wall − stages).
  Each step's generation against its decode roofline (issue 17: ≥ 60% in every step), from its committed rollout
  and the device copy bandwidth measured once the run has left the GPU. The machine's counters over each step's
  rollout and train stages (`host_counters`), to tell a slow machine from slow code. The GPU's memory peak
  (`nvidia-smi`, over the run and each stage of each step) against `hybrid plan`'s estimate for the same config,
  phase by phase, and the host's memory peak over the baseline before the run (/proc/meminfo).
  The config is benchmarks/configs/h200-iteration.yaml (1.7B stand-in) unless another is named, e.g. h200-grpo-4b.
- memory: two configurations, one where vLLM's reservation sets the peak and one where DeepSpeed's training does;
  the measured peak is the largest `memory.used` that `nvidia-smi -lms 50` reports during the run (a sampler that
  opens no CUDA context of its own), against `hybrid plan`'s estimate for the same configuration.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable

from host_counters import (CounterSampler, GpuMemorySampler, HostMemorySampler, stage_windows, window_means,
                           window_peak)

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = REPO_ROOT / "benchmarks" / "configs"
OVERHEAD_KEYS = ("timing_s/vllm_wake", "timing_s/vllm_sleep", "timing_s/ds_wake", "timing_s/ds_sleep", "timing_s/sync")
WITHIN_SYNC_KEYS = ("timing_s/ds_sleep_wait",)  # part of the sync's seconds: DeepSpeed's sleep copy ending there
STAGES = ("rollout", "reward", "advantage", "train", "sync")
ITERATION_CONFIG = "h200-iteration"
PLAN_PHASE_OF_STAGE = {"rollout": "rollout", "advantage": "experience", "train": "train"}  # memory_plan's phases


def run_train(config: Path, model_dir: Path, root: Path, run_id: str, *flags: str, timeout_s: float = 540) -> Path:
    """`hybrid train` in a child process (its own session) whose output streams to `<root>/<run_id>.log`, so a run
    cut off keeps its log; returns the run directory, or fails with the log's tail after killing the child's group."""
    root.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PREFECT_HOME": str(root / "prefect"), "RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, "-m", "flows.cli", "train", "--config", str(config), "--run_id", run_id,
           "--actor.model_name_or_path", str(model_dir), "--store.root", str(root / "runs"), *flags]
    log_path = root / f"{run_id}.log"
    with log_path.open("w") as log:
        child = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code = f"cut off after {timeout_s:.0f} s"
    if code != 0:
        tail = log_path.read_text()[-4000:]
        raise RuntimeError(f"hybrid train {run_id} failed ({code}); log {log_path}:\n{tail}")
    return root / "runs" / run_id


def step_rows(run_dir: Path) -> dict[int, dict]:
    import pyarrow.dataset as pds

    rows = {}  # a step cut off before its metrics commit has no row
    for path in sorted((run_dir / "steps").iterdir(), key=lambda p: int(p.name)):
        if (path / "metrics" / "_SUCCESS").is_file():
            rows[int(path.name)] = pds.dataset(str(path / "metrics"), format="parquet").to_table().to_pylist()[0]
    return rows


def read_events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def step_walls(run_dir: Path) -> dict[int, float]:
    """Seconds between the metrics commits of consecutive steps (step k's whole iteration, orchestration included)."""
    events = read_events(run_dir)
    done = {e["step"]: e["time"] for e in events if e["stage"] == "metrics" and e["event"] == "commit"}
    return {k: done[k] - done[k - 1] for k in sorted(done) if k - 1 in done}


def bench_iteration(results, model_dir: Path, root: Path, flags: tuple[str, ...] = (),
                    measure_copy_gbps: Callable[[], float] | None = None, config_name: str = ITERATION_CONFIG,
                    gpu_total_gib: float | None = None) -> None:
    """Figures from the steps the run committed, even when it was cut off (then from fewer steps); `flags` are
    extra `hybrid train` flags (recorded in the results), `config_name` the benchmarks/configs/ file (no `.yaml`).
    `measure_copy_gbps` (run once the run has ended and left the GPU) gives the device copy bandwidth of the
    generation's roofline; `gpu_total_gib` (the GPU's size) lets the memory plan's estimate sit beside the peak."""
    run_dir = root / "runs" / "iteration"
    config = CONFIGS / f"{config_name}.yaml"
    results.data["meta"]["iteration_flags"] = list(flags)
    results.data["meta"]["iteration_config"] = str(config.relative_to(REPO_ROOT))
    if gpu_total_gib is not None:
        results.section("iteration_plan", lambda: _plan_figures(results, config, model_dir, flags, gpu_total_gib))
    from bench_common import bench_config

    kv_cache_dtype = bench_config(config, model_dir, flags).vllm.kv_cache_dtype  # the roofline's bytes a value
    sampler = CounterSampler()
    gpu_memory = GpuMemorySampler()
    host_memory = HostMemorySampler()
    try:
        run_train(config, model_dir, root, "iteration", *flags)
    finally:
        samples = sampler.stop()
        gpu_peak_gib, gpu_samples = gpu_memory.stop()
        host_peak_gib = host_memory.stop()
        if (run_dir / "events.jsonl").is_file():
            rows = step_rows(run_dir)
            _iteration_figures(results, run_dir, rows)
            _counter_figures(results, run_dir, samples)
            _gpu_memory_figures(results, run_dir, gpu_peak_gib, gpu_samples, gpu_memory.timeline)
            _host_memory_figures(results, run_dir, host_memory, host_peak_gib)
            if measure_copy_gbps is not None:
                _generation_figures(results, run_dir, rows, model_dir, measure_copy_gbps(), kv_cache_dtype)


def _plan_figures(results, config: Path, model_dir: Path, flags: tuple[str, ...], gpu_total_gib: float) -> None:
    """`hybrid plan`'s estimate for the run's config and flags: the peak, each phase's total and its notes (the
    host memory that sleeping roles use)."""
    from bench_common import bench_config
    from hybrid_core.plan.memory import estimate_memory

    cfg = bench_config(config, model_dir, flags)
    plan = estimate_memory(cfg, gpu_total_gib)
    phases = {phase.name: phase.total_gib for phase in plan.phases}
    results.figure("iteration_plan_peak_gib", plan.peak_gib, trials=phases,
                   note=f"hybrid plan for a {gpu_total_gib} GiB GPU: phase {plan.peak_phase.name}, largest term "
                        f"{plan.largest_term.name}; trials: each phase's total; notes: {'; '.join(plan.notes)}")


def stage_peaks(events: list[dict], timeline: list[tuple[float, float]],
                stages: tuple[str, ...] = STAGES) -> dict[int, dict[str, float]]:
    """step → stage → the largest value of a (time, GiB) timeline within that stage's window (stages with no
    sample in their window are left out)."""
    per_step: dict[int, dict[str, float]] = {}
    for stage in stages:
        for step, (start, end) in stage_windows(events, stage).items():
            peak = window_peak(timeline, start, end)
            if peak is not None:
                per_step.setdefault(step, {})[stage] = peak
    return dict(sorted(per_step.items()))


def timed_phase_peaks(per_step: dict[int, dict[str, float]]) -> dict[str, float]:
    """The memory plan's phase → the largest peak of its stage over the timed steps (2 and later)."""
    peaks = {}
    for stage, phase in PLAN_PHASE_OF_STAGE.items():
        values = [stages[stage] for step, stages in per_step.items() if step >= 2 and stage in stages]
        if values:
            peaks[phase] = max(values)
    return peaks


def _gpu_memory_figures(results, run_dir: Path, peak_gib: float, samples: int,
                        timeline: list[tuple[float, float]]) -> None:
    per_step = stage_peaks(read_events(run_dir), timeline)
    results.figure("iteration_gpu_peak_gib", peak_gib, trials=per_step,
                   note=f"the largest nvidia-smi memory.used of the whole run, start-up included ({samples} samples "
                        f"at 50 ms); trials: each step's stages' peaks")
    phase_peaks = timed_phase_peaks(per_step)
    results.figure("iteration_gpu_phase_peak_gib", phase_peaks,
                   note="steps 2 and later: the largest peak of the rollout, advantage (the plan's experience) and "
                        "train stages")
    plan = results.data["figures"].get("iteration_plan_peak_gib")
    if plan is None or not phase_peaks:
        return
    measured = max(phase_peaks.values())
    results.figure("iteration_plan_vs_measured", plan / measured - 1,
                   note="the plan's peak over the largest stage peak of steps 2 and later, less 1 (within ±0.15 is "
                        "issue 48's bar)")


def _host_memory_figures(results, run_dir: Path, sampler: HostMemorySampler, peak_gib: float) -> None:
    per_step = stage_peaks(read_events(run_dir), sampler.timeline)
    results.figure("iteration_host_peak_gib", peak_gib, trials=per_step,
                   note=f"the host's memory in use (MemTotal - MemAvailable, the whole machine), largest of "
                        f"{len(sampler.timeline)} samples at 100 ms; trials: each step's stages' peaks")
    results.figure("iteration_host_baseline_gib", sampler.baseline_gib, note="in use before the run started")
    results.figure("iteration_host_peak_over_baseline_gib", peak_gib - sampler.baseline_gib)


def stage_counters(events: list[dict], samples: list,
                   stages: tuple[str, ...] = ("rollout", "advantage", "train")) \
        -> dict[int, dict[str, dict]]:
    """step → stage → the machine's counters over that stage's window (`host_counters.window_means`)."""
    per_step: dict[int, dict[str, dict]] = {}
    for stage in stages:
        for step, (start, end) in stage_windows(events, stage).items():
            per_step.setdefault(step, {})[stage] = window_means(samples, start, end)
    return dict(sorted(per_step.items()))


def _counter_figures(results, run_dir: Path, samples: list) -> None:
    results.figure("iteration_machine_counters", stage_counters(read_events(run_dir), samples),
                   note="per step and stage: means of the GPU's utilization (%), SM and memory clocks (MHz), power "
                        "(W) and the host's CPU busy fraction, sampled every 200 ms; sm_mhz_min the lowest")


def generation_vs_roofline(run_dir: Path, rows: dict[int, dict], model_dir: Path, copy_gbps: float,
                           kv_cache_dtype: str = "auto") -> dict[int, dict]:
    """Per step: the rollout's generation rate (its committed response tokens over the engine's generate seconds, the
    metrics row's `timing_s/generate`) against the decode roofline of that step's batch (bench_vllm's: every decode
    step reads the weights and each sequence's KV cache at the batch's mean context, prompt + half the response, at
    `copy_gbps`, its elements of the run's `kv_cache_dtype`), every sequence decoding at once."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pds
    from bench_vllm import _roofline

    figures = {}
    for step, row in rows.items():
        rollout = pds.dataset(str(run_dir / "steps" / str(step) / "rollout"), format="parquet")
        table = rollout.to_table(columns=["prompt_ids", "response_ids"])
        lengths = {name: pc.list_value_length(table.column(name)) for name in ("prompt_ids", "response_ids")}
        mean_context = pc.mean(lengths["prompt_ids"]).as_py() + pc.mean(lengths["response_ids"]).as_py() / 2
        roofline, _ = _roofline(model_dir, copy_gbps, table.num_rows, mean_context=mean_context,
                                kv_cache_dtype=kv_cache_dtype)
        tok_s = pc.sum(lengths["response_ids"]).as_py() / row["timing_s/generate"]
        figures[step] = {"tok_s": tok_s, "roofline_tok_s": roofline, "fraction": tok_s / roofline,
                         "sequences": table.num_rows, "mean_context": mean_context}
    return figures


def _generation_figures(results, run_dir: Path, rows: dict[int, dict], model_dir: Path, copy_gbps: float,
                        kv_cache_dtype: str) -> None:
    per_step = generation_vs_roofline(run_dir, rows, model_dir, copy_gbps, kv_cache_dtype)
    timed = [k for k in sorted(per_step) if k >= 2]
    results.figure("iteration_gen_copy_gbps", copy_gbps, note="device copy, read + write bytes, after the run")
    if timed:
        results.figure("iteration_gen_fraction_of_roofline", min(per_step[k]["fraction"] for k in timed),
                       trials=per_step, note="the slowest of steps 2–3: generate's tokens/s over the step's decode "
                                             "roofline")


def _iteration_figures(results, run_dir: Path, rows: dict[int, dict]) -> None:
    walls = step_walls(run_dir)
    results.figure("iteration_steps_committed", len(rows))
    timed = [k for k in sorted(walls) if k >= 2]
    if not timed:
        return
    stage_s = {s: statistics.fmean(rows[k][f"timing_s/{s}"] for k in timed) for s in STAGES}
    for key in OVERHEAD_KEYS[:4] + WITHIN_SYNC_KEYS:
        stage_s[key.split("/")[1]] = statistics.fmean(rows[k].get(key, 0.0) for k in timed)
    wall = statistics.fmean(walls[k] for k in timed)
    orchestration = wall - sum(stage_s[s] for s in STAGES)
    overhead = sum(stage_s[k.split("/")[1]] for k in OVERHEAD_KEYS) + orchestration
    results.figure("iteration_wall_s", wall, trials={k: walls[k] for k in sorted(walls)})
    if all("sync/bytes" in rows[k] for k in timed):  # what each sync pushed: every weight, or a LoRA's adapter
        results.figure("iteration_sync_bytes", statistics.fmean(rows[k]["sync/bytes"] for k in timed),
                       trials={k: rows[k]["sync/bytes"] for k in timed})
    per_step = {k: {key: value for key, value in row.items() if key.startswith(("timing_s/", "memory_gib/"))}
                for k, row in rows.items()}
    results.figure("iteration_stage_s", stage_s | {"orchestration": orchestration}, trials=per_step)
    results.figure("iteration_overhead_s", overhead, note="vLLM sleep+wake, DeepSpeed sleep+wake, sync, orchestration")
    results.figure("iteration_overhead_fraction", overhead / wall)
    parts = {k: orchestration_parts(run_dir, rows, k) for k in timed}
    results.figure("iteration_orchestration_parts_s", {key: statistics.fmean(p[key] for p in parts.values())
                                                       for key in next(iter(parts.values()))}, trials=parts,
                   note="from events.jsonl: between a stage's commit and the next stage's start (task + Ray call), "
                        "a stage's start to commit beyond its own seconds (writing, hashing, the manifest), the "
                        "metrics stage, and the previous step's metrics commit to this step's rollout start")


def orchestration_parts(run_dir: Path, rows: dict[int, dict], step: int) -> dict[str, float]:
    """Where step `step`'s orchestration went, from the run's events (wall-clock stamps of each stage's start and
    commit) and its metrics row (each stage's own seconds)."""
    events = read_events(run_dir)
    stamp = {(e["step"], e["stage"], e["event"]): e["time"] for e in events if e["event"] in ("start", "commit")}
    order = [s for s in (*STAGES, "metrics") if (step, s, "start") in stamp and (step, s, "commit") in stamp]
    between = sum(stamp[(step, b, "start")] - stamp[(step, a, "commit")] for a, b in zip(order, order[1:]))
    committing = sum(stamp[(step, s, "commit")] - stamp[(step, s, "start")] - rows[step][f"timing_s/{s}"]
                     for s in order if s != "metrics")
    return {"between_stages": between, "committing": committing,
            "metrics_stage": stamp[(step, "metrics", "commit")] - stamp[(step, "metrics", "start")],
            "before_rollout": stamp[(step, "rollout", "start")] - stamp[(step - 1, "metrics", "commit")]}


def bench_memory(results, model_dir: Path, root: Path, gpu_total_gib: float,
                 names: list[str] = ("vllm-peak", "ds-peak")) -> None:
    from bench_common import bench_config
    from hybrid_core.plan.memory import estimate_memory

    for name in names:
        config = CONFIGS / f"h200-memory-{name}.yaml"
        cfg = bench_config(config, model_dir)
        plan = estimate_memory(cfg, gpu_total_gib)
        sampler = GpuMemorySampler()
        try:
            run_dir = run_train(config, model_dir, root, f"memory-{name}")
        finally:
            measured, samples = sampler.stop()
        actor = {key: value for row in step_rows(run_dir).values() for key, value in row.items()
                 if key.startswith("memory_gib/")}
        key = name.replace("-", "_")
        results.figure(f"plan_peak_gib_{key}", plan.peak_gib, note=f"phase {plan.peak_phase.name}, largest term "
                                                                  f"{plan.largest_term.name}")
        results.figure(f"measured_peak_gib_{key}", measured, trials=actor,
                       note=f"{samples} nvidia-smi samples at 50 ms; trials: the actor's own peaks per stage")
        results.figure(f"plan_vs_measured_{key}", plan.peak_gib / measured - 1)
