"""When the GPU idles during a generate or an update, what the host is doing (issues 17 and 48): reads a chrome trace
of torch's profiler (CPU and CUDA activity) whose host calls are `host:NAME` ranges (`host_split.py` with ranges on),
takes the GPU's idle intervals between the first and the last window range (`host:engine_step` of a generate,
`host:fit_actor` of an update), and gives their seconds by the innermost host range open at each moment of the gap,
and by the GPU activity that ended the gap.

Knows the chrome trace's layout (complete events: `ph` "X", `ts` and `dur` in microseconds, `cat`); nothing of
vLLM or DeepSpeed beyond the range names it is given.
"""
from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
SAMPLE_US = 2.0  # a gap is attributed at this resolution
MIN_GAP_US = 1.0


def load_events(trace: Path) -> tuple[list[tuple[float, float, str]], list[tuple[float, float, str]]]:
    """(GPU activity, host ranges) as (start µs, end µs, name), each sorted by start; `trace` may be gzipped."""
    opened = gzip.open(trace, "rt") if trace.suffix == ".gz" else trace.open()
    with opened as text:
        events = json.load(text)
    events = events["traceEvents"] if isinstance(events, dict) else events
    gpu, host = [], []
    for event in events:
        if event.get("ph") != "X" or "dur" not in event:
            continue
        interval = (float(event["ts"]), float(event["ts"]) + float(event["dur"]), str(event.get("name", "")))
        if event.get("cat") in GPU_CATEGORIES:
            gpu.append(interval)
        elif event.get("cat") == "user_annotation" and interval[2].startswith("host:"):
            host.append(interval)  # not `gpu_user_annotation`: the GPU-side shadow of a range
    return sorted(gpu), sorted(host)


def idle_gaps(gpu: list[tuple[float, float, str]], start: float, end: float) -> list[tuple[float, float, str]]:
    """The GPU's idle intervals within [start, end], each with the name of the activity that ended it."""
    gaps = []
    busy_until = start
    for begin, finish, name in gpu:
        if finish <= start or begin >= end:
            continue
        if begin - busy_until >= MIN_GAP_US:
            gaps.append((busy_until, begin, name))
        busy_until = max(busy_until, finish)
    if end - busy_until >= MIN_GAP_US:
        gaps.append((busy_until, end, "(end of window)"))
    return gaps


def innermost(host: list[tuple[float, float, str]], moment: float) -> str:
    """The shortest host range open at `moment` ("(outside the host calls)" when none)."""
    open_ranges = [r for r in host if r[0] <= moment < r[1]]
    if not open_ranges:
        return "(outside the host calls)"
    return min(open_ranges, key=lambda r: r[1] - r[0])[2]


def gap_figures(trace: Path, top: int = 12, window: str = "host:engine_step") -> dict:
    """The GPU's idle time between the first and the last `window` range (a step each), by innermost host range
    and by the GPU activity that ended each gap."""
    gpu, host = load_events(trace)
    steps = [r for r in host if r[2] == window]
    if not steps:
        raise ValueError(f"{trace}: no {window} range; profile with the host calls as ranges "
                         f"(`HostSplit(ranges=True)`)")
    start, end = steps[0][0], max(r[1] for r in steps)
    gaps = idle_gaps(gpu, start, end)
    by_range: dict[str, float] = defaultdict(float)
    by_next: dict[str, float] = defaultdict(float)
    for begin, finish, next_name in gaps:
        candidates = [r for r in host if r[0] < finish and r[1] > begin]
        moment = begin
        while moment < finish:
            width = min(SAMPLE_US, finish - moment)
            by_range[innermost(candidates, moment + width / 2)] += width
            moment += width
        by_next[next_name[:80]] += finish - begin
    window = end - start
    gap_us = sum(finish - begin for begin, finish, _ in gaps)
    return {"window_s": window / 1e6, "steps": len(steps), "gpu_idle_s": gap_us / 1e6,
            "gpu_busy_fraction": 1 - gap_us / window, "gaps": len(gaps),
            "gaps_over_100us": sum(1 for g in gaps if g[1] - g[0] > 100),
            "idle_ms_a_step_by_host_range": {k: v / 1e3 / len(steps) for k, v in _top(by_range, top)},
            "idle_ms_a_step_by_next_gpu_activity": {k: v / 1e3 / len(steps) for k, v in _top(by_next, top)}}


def _top(amounts: dict[str, float], count: int) -> list[tuple[str, float]]:
    return sorted(amounts.items(), key=lambda item: item[1], reverse=True)[:count]
