"""Where a run's ranks sit: each role group's bundles cut into per-node blocks (one placement group each), the vLLM
engines' tensor-parallel (TP) workers on those bundles and which actor rank feeds each, and ring attention's groups.

Pure arithmetic over counts: no Ray, no torch, no configuration, so the plan, the workers and the engines read the
same numbers from this one leaf. Bundles keep one index across the run (the groups one after another).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


def node_sizes(num_bundles: int, per_node: int) -> tuple[int, ...]:
    """Bundles on each node of a group of `num_bundles`, `per_node` to a node, the last node taking the rest."""
    if num_bundles < 1 or per_node < 1:
        raise ValueError(f"a group needs bundles and a node width: got {num_bundles} bundles, {per_node} per node")
    return tuple(min(per_node, num_bundles - start) for start in range(0, num_bundles, per_node))


@dataclass(frozen=True)
class NodeBlock:
    """The bundles one group holds on one of its nodes: run-wide bundle indices [first_bundle, first_bundle +
    num_bundles), one placement group."""

    group: int  # the group's index among the run's groups
    node: int  # the node's index among the group's nodes (0: the node of the group's rank 0)
    first_bundle: int
    num_bundles: int

    @property
    def bundles(self) -> range:
        return range(self.first_bundle, self.first_bundle + self.num_bundles)


def node_blocks(groups: Sequence[tuple[int, int]]) -> tuple[NodeBlock, ...]:
    """The blocks of the run's groups, given each group's `(num_bundles, per_node)` in the run's bundle order.

    A group of `num_nodes × gpus_per_node` bundles becomes `num_nodes` blocks of `gpus_per_node` bundles (a group
    whose size is not a multiple, the engines' own group, fills its nodes in turn and leaves the rest to the last).
    Each block is one placement group whose bundles share a node (Ray's STRICT_PACK), so rank r of a role sits on
    node r // gpus_per_node of its group: what OpenRLHF reaches by regrouping one PACK group's bundles by node
    (`get_bundle_indices`, ray#51117), here by construction.
    """
    blocks, first = [], 0
    for group, (num_bundles, per_node) in enumerate(groups):
        for node, size in enumerate(node_sizes(num_bundles, per_node)):
            blocks.append(NodeBlock(group=group, node=node, first_bundle=first, num_bundles=size))
            first += size
    return tuple(blocks)


def block_of(blocks: Sequence[NodeBlock], bundle_index: int) -> tuple[NodeBlock, int]:
    """The block holding run-wide bundle `bundle_index`, and that bundle's index inside its placement group."""
    for block in blocks:
        if bundle_index in block.bundles:
            return block, bundle_index - block.first_bundle
    raise ValueError(f"bundle {bundle_index} is outside the run's {sum(b.num_bundles for b in blocks)} bundles")


def shared_block(blocks: Sequence[NodeBlock], bundles: Sequence[int]) -> tuple[NodeBlock, tuple[int, ...]]:
    """The one block holding every bundle of `bundles` (what must share a node's placement group, as a vLLM engine
    and its TP workers do) and their indices inside it, in order; a ValueError naming the blocks when they are
    several."""
    found = [block_of(blocks, bundle) for bundle in bundles]
    holders = sorted({(block.group, block.node) for block, _ in found})
    if len(holders) != 1:
        raise ValueError(f"bundles {list(bundles)} must share one node's placement group: they fall in "
                         + (", ".join(f"group {group + 1} node {node}" for group, node in holders) or "none"))
    return found[0][0], tuple(index for _, index in found)


def cpu_per_bundle(blocks: Sequence[NodeBlock]) -> float:
    """On CPU every node of the run lends one logical CPU, split between the bundles of its blocks (vLLM and torch
    bind their own threads: the count only has to fit); the most crowded node sets the share, rounded down to
    thousandths so that a node's bundles never ask for more than its one CPU."""
    per_node: dict[int, int] = {}
    for block in blocks:
        per_node[block.node] = per_node.get(block.node, 0) + block.num_bundles
    return math.floor(1000 / max(per_node.values(), default=1)) / 1000


def unplaceable(blocks: Sequence[NodeBlock], bundle: dict[str, float],
                node_totals: Sequence[dict[str, float]]) -> list[NodeBlock]:
    """The blocks that no node could hold even idle (`node_totals`: each node's resources): a block's bundles of
    `bundle` must all fit on one node, so Ray would leave its placement group pending for ever."""
    def fits(block: NodeBlock, node: dict[str, float]) -> bool:
        return all(node.get(name, 0.0) + 1e-9 >= amount * block.num_bundles for name, amount in bundle.items())

    return [block for block in blocks if not any(fits(block, node) for node in node_totals)]


def rank_span(blocks: Sequence[NodeBlock], block: NodeBlock) -> range:
    """The ranks of `block`'s group that sit on it: its bundles counted from the group's first bundle."""
    group_first = min(b.first_bundle for b in blocks if b.group == block.group)
    return range(block.first_bundle - group_first, block.first_bundle - group_first + block.num_bundles)


@dataclass(frozen=True)
class EngineLayout:
    """`num_engines` engines of `tensor_parallel_size` workers each, from bundle `first_bundle` on.

    Engine e of T workers takes the T bundles `first + e·T … first + e·T + T − 1` (its own process sits on the first).
    Colocated (`E × T` = the actor's ranks, OpenRLHF's rule), bundle b is also actor rank b's GPU, so rank r feeds the
    TP worker of engine r // T on its GPU by CUDA IPC, and rank e·T leads engine e (it sends the engine every rank's
    handles of a bucket). Which TP rank vLLM gives the worker on a GPU is vLLM's business: the handles are matched to
    workers by GPU, not by TP rank.
    """

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


def ring_group_ranks(world_size: int, ring_size: int) -> list[list[int]]:
    """The rings of `world_size` ranks: consecutive runs of `ring_size` ranks, in order."""
    if ring_size < 1 or world_size % ring_size:
        raise ValueError(f"ds.ring_attn_size must divide the ranks: got {ring_size} for {world_size} ranks")
    return [list(range(start, start + ring_size)) for start in range(0, world_size, ring_size)]
