"""Where the host's time goes in a vLLM engine's generate (issue 17: generation waits on the engine's host side):
wraps, on one in-process `LLM`'s own objects, the calls of a decode step's single host thread — the scheduler's
`schedule` and `update_from_output`, the executor's `execute_model` and `sample_tokens` (the model runner's input
preparation and kernel launches), the wait for a step's sampled tokens, the front end's `process_outputs` — and the
garbage collector's pauses, and gives each one's seconds, calls and milliseconds a call.

A step's host time is everything but the wait: when it is longer than the GPU's time for the step, the GPU idles.
Knows vLLM 0.26's in-process engine layout (`LLM.llm_engine.engine_core.engine_core`); benchmarks only.
"""
from __future__ import annotations

import gc
import time
from collections import defaultdict
from contextlib import contextmanager


class HostSplit:
    """Accumulated seconds and calls by name."""

    def __init__(self, ranges: bool = False):
        self.ranges = ranges  # each timed call is also a range of torch's profiler (`gpu_gaps.py` reads them)
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._gc_started: float | None = None
        self._replaced: list[tuple[object, str, object]] = []  # (owner, name, its own attribute before, or None)

    def _replace(self, owner, method_name: str, replacement) -> None:
        self._replaced.append((owner, method_name, vars(owner).get(method_name)))
        setattr(owner, method_name, replacement)

    def restore(self) -> None:
        """Put back what `wrap` replaced, last first."""
        for owner, method_name, own in reversed(self._replaced):
            if own is None:
                vars(owner).pop(method_name, None)
            else:
                setattr(owner, method_name, own)
        self._replaced.clear()

    def timed(self, original, name: str):
        """`original`, its seconds and calls counted under `name`."""
        def timed_call(*args, **kwargs):
            start = time.perf_counter()
            try:
                if not self.ranges:
                    return original(*args, **kwargs)
                from torch.profiler import record_function

                with record_function(f"host:{name}"):
                    return original(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1

        return timed_call

    def wrap(self, owner, method_name: str, name: str) -> None:
        """Replace `owner.method_name` (on this object only) by a timed call of the original."""
        self._replace(owner, method_name, self.timed(getattr(owner, method_name), name))

    def wrap_result(self, owner, method_name: str, name: str) -> None:
        """Time, besides the call itself, the `result()` of the future that `owner.method_name` returns."""
        original = getattr(owner, method_name)

        def call_then_wrap(*args, **kwargs):
            future = original(*args, **kwargs)
            if hasattr(future, "result"):
                future.result = self.timed(future.result, name)
            return future

        self._replace(owner, method_name, call_then_wrap)

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            name = f"gc_gen{info.get('generation')}"
            self.seconds[name] += time.perf_counter() - self._gc_started
            self.calls[name] += 1
            self._gc_started = None

    def figures(self) -> dict:
        return {name: {"s": seconds, "calls": self.calls[name], "ms_a_call": 1e3 * seconds / max(self.calls[name], 1)}
                for name, seconds in sorted(self.seconds.items())}


@contextmanager
def host_split(llm, ranges: bool = False):
    """Within the block, every decode step of `llm` (an in-process vLLM `LLM`) is split by host call (`ranges`:
    each call also a `host:NAME` range of torch's profiler)."""
    split = HostSplit(ranges=ranges)
    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    split.wrap(engine, "step", "engine_step")
    split.wrap(core, "step_fn", "core_step")
    split.wrap(core.scheduler, "schedule", "schedule")
    split.wrap(core.scheduler, "update_from_output", "update_from_output")
    split.wrap(core.model_executor, "execute_model", "execute_model")
    split.wrap(core.model_executor, "sample_tokens", "sample_tokens")
    split.wrap_result(core.model_executor, "sample_tokens", "wait_sampled")
    split.wrap(engine.output_processor, "process_outputs", "process_outputs")
    gc.callbacks.append(split.on_gc)
    try:
        yield split
    finally:
        gc.callbacks.remove(split.on_gc)
        split.restore()
