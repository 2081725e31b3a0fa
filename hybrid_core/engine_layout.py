"""Where a run's vLLM engines and their tensor-parallel (TP) workers sit, and which actor rank feeds each worker.

Engine e of T workers takes the T bundles `first + e·T … first + e·T + T − 1` of the rollout's bundles (its own
process sits on the first). Colocated (`E × T` = the actor's ranks, OpenRLHF's rule), bundle b is also actor rank b's
GPU, so rank r shares its GPU with a TP worker of engine r // T and is the one that hands that worker its weights by
CUDA IPC; rank e·T leads engine e (it sends the engine every rank's handles of a bucket). Which TP rank vLLM gives
the worker on a GPU is vLLM's business: the handles are matched to workers by GPU, not by TP rank.
Pure arithmetic: no Ray, no torch, no configuration.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLayout:
    """`num_engines` engines of `tensor_parallel_size` workers each, from bundle `first_bundle` on."""

    num_engines: int
    tensor_parallel_size: int
    first_bundle: int = 0

    def __post_init__(self) -> None:
        if self.num_engines < 1 or self.tensor_parallel_size < 1:
            raise ValueError(f"an engine layout needs engines and workers: got {self.num_engines} engines of "
                             f"{self.tensor_parallel_size} TP workers")

    def bundles(self, engine: int) -> range:
        """The bundles of engine `engine`'s TP workers, in order (the engine's own process sits on the first)."""
        if not 0 <= engine < self.num_engines:
            raise ValueError(f"engine {engine} is outside the run's {self.num_engines} engines")
        start = self.first_bundle + engine * self.tensor_parallel_size
        return range(start, start + self.tensor_parallel_size)

    def engine_of(self, actor_rank: int) -> int | None:
        """The engine with a TP worker on actor rank `actor_rank`'s GPU (colocated); None past the engines' GPUs (a
        run without vllm.num_engines has one engine, beside rank 0)."""
        engine = actor_rank // self.tensor_parallel_size
        return engine if engine < self.num_engines else None

    def feeders(self, engine: int) -> range:
        """The actor ranks on engine `engine`'s GPUs (colocated), the first of them leading its weight sync."""
        return range(engine * self.tensor_parallel_size, (engine + 1) * self.tensor_parallel_size)

    def leads(self, actor_rank: int) -> bool:
        """Whether `actor_rank` is the one that sends its engine the bucket handles of all the engine's ranks."""
        return self.engine_of(actor_rank) is not None and actor_rank % self.tensor_parallel_size == 0


def engine_lines(layout: EngineLayout, by_cuda_ipc: bool) -> list[str]:
    """What `hybrid plan` shows of engines with several TP workers: each engine's bundles (and, fed by CUDA IPC, the
    actor ranks that feed its workers); nothing for TP 1."""
    if layout.tensor_parallel_size == 1:
        return []
    lines = []
    for engine in range(layout.num_engines):
        bundles = layout.bundles(engine)
        line = f"    engine {engine}: TP workers on bundles {bundles.start}-{bundles.stop - 1}"
        if by_cuda_ipc:
            ranks = layout.feeders(engine)
            line += f", weights by CUDA IPC from actor ranks {ranks.start}-{ranks.stop - 1} (one per GPU)"
        lines.append(line)
    return lines
