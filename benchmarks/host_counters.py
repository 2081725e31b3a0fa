"""Machine counters sampled beside a benchmark run by `nvidia-smi -lms` (it opens no CUDA context of its own): the
GPU memory's peak (`GpuMemorySampler`, for the memory plan's check), and, to tell a slow machine from slow code
(issue 17: the same rollout took 8.1 s in one step and 9.7 s in the next, s32), the GPU's utilization, SM and memory
clocks and power draw with the host's CPU busy fraction (/proc/stat between two samples), each sample stamped with
the wall clock (`CounterSampler`), and their means over a stage's window from a run's events.jsonl. The host's
memory in use (`HostMemorySampler`, /proc/meminfo's MemTotal − MemAvailable, every process of the machine together:
DeepSpeed's pinned buffers, Ray's object store, the workers' heaps) with its peak over the run and each stage.

It knows nothing about what runs meanwhile.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time

QUERY = {"gpu_util_pct": "utilization.gpu", "sm_mhz": "clocks.sm", "mem_mhz": "clocks.mem", "power_w": "power.draw"}


def parse_sample(line: str) -> dict[str, float] | None:
    """One `nvidia-smi --format=csv,noheader,nounits` line of QUERY's fields, without those the GPU does not report
    ("[N/A]"); None for any other line (a header, an error)."""
    fields = [field.strip() for field in line.split(",")]
    if len(fields) != len(QUERY):
        return None
    values = {name: float(field) for name, field in zip(QUERY, fields) if _is_number(field)}
    return values or None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def cpu_times(stat_line: str) -> tuple[int, int]:
    """(busy, total) jiffies of /proc/stat's first line: idle and iowait are not busy."""
    ticks = [int(value) for value in stat_line.split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return sum(ticks) - idle, sum(ticks)


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the host's CPU time that was busy between two `cpu_times` readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


def _read_cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as stat:
        return cpu_times(stat.readline())


class NvidiaSmiSampler:
    """`nvidia-smi --query-gpu=<query> -lms <interval_ms>` on the first GPU this process sees (nvidia-smi ignores
    CUDA_VISIBLE_DEVICES, so the GPU is named; another job on another GPU of the machine does not count), each line
    it prints handed to `take` in a background thread until `stop`. Subclasses set their state before this starts."""

    def __init__(self, query: str, interval_ms: int):
        gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
        self.process = subprocess.Popen(["nvidia-smi", f"--id={gpu}", f"--query-gpu={query}",
                                         "--format=csv,noheader,nounits", "-lms", str(interval_ms)],
                                        stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.take(line)

    def take(self, line: str) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.process.terminate()
        self.thread.join(timeout=5)


class GpuMemorySampler(NvidiaSmiSampler):
    """Largest GPU memory in use (MiB) while running, sampled every 50 ms; `timeline` keeps every sample as
    (wall-clock time, GiB), for the peaks of a run's stages (`window_peak`)."""

    def __init__(self):
        self.peak_mib, self.samples = 0, 0
        self.timeline: list[tuple[float, float]] = []
        super().__init__("memory.used", interval_ms=50)

    def take(self, line: str) -> None:
        if line.strip().isdigit():
            self.peak_mib, self.samples = max(self.peak_mib, int(line)), self.samples + 1
            self.timeline.append((time.time(), int(line) / 1024))

    def stop(self) -> tuple[float, int]:
        super().stop()
        return self.peak_mib / 1024, self.samples


class CounterSampler(NvidiaSmiSampler):
    """QUERY every `interval_ms`, each sample with the CPU busy fraction since the previous one."""

    def __init__(self, interval_ms: int = 200):
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._cpu = _read_cpu_times()
        super().__init__(",".join(QUERY.values()), interval_ms)

    def take(self, line: str) -> None:
        values = parse_sample(line)
        if values is None:
            return
        now = _read_cpu_times()
        self.samples.append((time.time(), values | {"cpu_busy": busy_fraction(self._cpu, now)}))
        self._cpu = now

    def stop(self) -> list[tuple[float, dict[str, float]]]:
        super().stop()
        return self.samples


def stage_windows(events: list[dict], stage: str) -> dict[int, tuple[float, float]]:
    """step → (start, commit) wall-clock times of `stage`, for the steps where both were logged (the last start
    of a retried stage)."""
    starts = {e["step"]: e["time"] for e in events if e["stage"] == stage and e["event"] == "start"}
    commits = {e["step"]: e["time"] for e in events if e["stage"] == stage and e["event"] == "commit"}
    return {step: (starts[step], commits[step]) for step in sorted(starts) if step in commits}


def window_means(samples: list[tuple[float, dict[str, float]]], start: float, end: float) -> dict[str, float]:
    """Each counter's mean over the samples stamped within [start, end] that report it, the lowest SM clock among
    them, and the sample count; {"samples": 0} when none fell there."""
    inside = [values for stamp, values in samples if start <= stamp <= end]
    means = {}
    for name in dict.fromkeys(name for values in inside for name in values):
        reported = [values[name] for values in inside if name in values]
        means[name] = sum(reported) / len(reported)
    clocks = [values["sm_mhz"] for values in inside if "sm_mhz" in values]
    return means | ({"sm_mhz_min": min(clocks)} if clocks else {}) | {"samples": len(inside)}


def window_peak(timeline: list[tuple[float, float]], start: float, end: float) -> float | None:
    """The largest value of a (time, value) timeline stamped within [start, end]; None when none fell there."""
    inside = [value for stamp, value in timeline if start <= stamp <= end]
    return max(inside) if inside else None


def used_gib(meminfo: str) -> float:
    """The host memory in use, GiB, from /proc/meminfo's text: MemTotal − MemAvailable (page cache that the kernel
    can drop does not count)."""
    fields = {}
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0])  # kB
    return (fields["MemTotal"] - fields["MemAvailable"]) / 2**20


def _read_used_gib() -> float:
    with open("/proc/meminfo") as meminfo:
        return used_gib(meminfo.read())


class HostMemorySampler:
    """The host memory in use (`used_gib`) every `interval_s` in a background thread until `stop`: `baseline_gib`
    as it was before the run, `timeline` of (wall-clock time, GiB)."""

    def __init__(self, interval_s: float = 0.1, read=_read_used_gib):
        self.read, self.interval_s = read, interval_s
        self.baseline_gib = read()
        self.timeline: list[tuple[float, float]] = []
        self._stopped = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self._stopped.is_set():
            self.timeline.append((time.time(), self.read()))
            self._stopped.wait(self.interval_s)

    def stop(self) -> float:
        """Stop sampling; returns the peak seen (the baseline when no sample was taken)."""
        self._stopped.set()
        self.thread.join(timeout=5)
        return max([self.baseline_gib, *(value for _, value in self.timeline)])
