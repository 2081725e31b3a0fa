"""When a worker began each stage call, and the seconds its Python garbage collector paused it since its last one.

Owns the `stamped` decorator of the workers' stage methods and a process-wide GC pause counter (Python's
`gc.callbacks`). The flow's task logs the dispatch (call → worker start); `timing_s/gc_<stage>` says how much of a
stage, and of the worker's time before it, went to collection. It knows nothing about what the stages do.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import time

_gc_clock = {"paused_s": 0.0, "started": 0.0, "reported_s": 0.0}


def _time_collection(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_clock["started"] = time.perf_counter()
    else:
        _gc_clock["paused_s"] += time.perf_counter() - _gc_clock["started"]


def gc_seconds_since_last_report() -> float:
    """Seconds the collector paused this process since the previous call (counting starts with the first)."""
    if _time_collection not in gc.callbacks:
        gc.callbacks.append(_time_collection)
    paused = _gc_clock["paused_s"] - _gc_clock["reported_s"]
    _gc_clock["reported_s"] = _gc_clock["paused_s"]
    return paused


def stamped(method):
    """Decorate a worker's stage method: its StageResult records when the worker began the call (`entered_at`) and
    `timing_s/gc_<stage>`, the collector's pauses in this process since the previous stamped call returned."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        entered = time.time()
        result = method(self, *args, **kwargs)
        metrics = result.metrics | {f"timing_s/gc_{result.stage}": gc_seconds_since_last_report()}
        return dataclasses.replace(result, entered_at=entered, metrics=metrics)

    return wrapper
