"""When a worker began each stage call, how long the call waited to be dispatched, and the seconds its Python garbage
collector paused it since the previous stage.

Owns the `stamped` decorator of the workers' stage methods, a process-wide GC pause counter (Python's
`gc.callbacks`) and the freezing of a worker's start-up heap. The caller passes `called_at` (its wall clock at the
call); the figures are recorded with the stage in the run's store (`timing_s/dispatch_<stage>`,
`timing_s/gc_<stage>`). It knows nothing about what stages do.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import inspect
import time

_gc_clock = {"paused_s": 0.0, "started": 0.0, "reported_s": 0.0}


def _time_collection(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_clock["started"] = time.perf_counter()
    else:
        _gc_clock["paused_s"] += time.perf_counter() - _gc_clock["started"]


def freeze_startup_heap() -> None:
    """Move every object alive now (a worker's modules, models and engines, built once) to the collector's permanent
    generation, so the full collections a step's garbage triggers no longer walk them (vLLM does the same for its
    engine core). Objects frozen are still freed by reference counting; only cycles among them stay."""
    gc.collect()
    gc.freeze()


def gc_seconds_since_last_report() -> float:
    """Seconds the collector paused this process since the previous call (counting starts with the first)."""
    if _time_collection not in gc.callbacks:
        gc.callbacks.append(_time_collection)
    paused = _gc_clock["paused_s"] - _gc_clock["reported_s"]
    _gc_clock["reported_s"] = _gc_clock["paused_s"]
    return paused


@dataclasses.dataclass(kw_only=True)
class CallClock:
    """The stage call a worker is serving: when it was made and when the worker began it."""

    called_at: float
    entered_at: float

    def figures(self, stage: str) -> dict[str, float]:
        """Dispatch (call → start) and the collector's pauses since the previous report, for the stage's record."""
        return {f"timing_s/dispatch_{stage}": max(0.0, self.entered_at - self.called_at),
                f"timing_s/gc_{stage}": gc_seconds_since_last_report()}


def stamped(method):
    """Decorate a worker's stage method `(self, step, *, called_at=None)`: `self.clock` holds the call's clock while
    it runs, and the StageResult records when the worker began (`entered_at`)."""

    @functools.wraps(method)
    def wrapper(self, *args, called_at: float | None = None, **kwargs):
        entered = time.time()
        self.clock = CallClock(called_at=called_at or entered, entered_at=entered)
        result = method(self, *args, **kwargs)
        return dataclasses.replace(result, entered_at=entered) if hasattr(result, "entered_at") else result

    # Ray checks a remote call's arguments against the method's signature, unwrapping decorators all the way: the
    # wrapper must not point back to the method, and its signature must carry `called_at`
    signature = inspect.signature(method)
    called_at = inspect.Parameter("called_at", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="float | None")
    wrapper.__signature__ = signature.replace(parameters=[*signature.parameters.values(), called_at])
    del wrapper.__wrapped__
    return wrapper
