"""How a run's bundles fall on nodes: each role group's bundles cut into per-node blocks, one placement group each.

A group of `num_nodes × gpus_per_node` bundles becomes `num_nodes` blocks of `gpus_per_node` bundles (a group whose
size is not a multiple, the engines' own group, fills its nodes in turn and leaves the rest to the last). Each block
is one placement group whose bundles must share a node (Ray's STRICT_PACK), so rank r of a role sits on node
r // gpus_per_node of its group, beside ranks of the same node — what OpenRLHF reaches by regrouping one PACK group's
bundles by node (`get_bundle_indices`, ray#51117), here by construction. Bundles keep one index across the run
(the groups one after another), so the roles' slots stay plain numbers.
Pure arithmetic: no Ray, no configuration.
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
    """The blocks of the run's groups, given each group's `(num_bundles, per_node)` in the run's bundle order."""
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


def node_lines(blocks: Sequence[NodeBlock], group: int) -> list[str]:
    """What `hybrid plan` shows of a group on several nodes: each node's bundles and the ranks on them."""
    mine = [block for block in blocks if block.group == group]
    if len(mine) < 2:
        return []
    lines = []
    for block in mine:
        ranks = rank_span(blocks, block)
        shown = f"rank {ranks.start}" if len(ranks) == 1 else f"ranks {ranks.start}-{ranks.stop - 1}"
        bundles = "1 bundle" if block.num_bundles == 1 else f"{block.num_bundles} bundles"
        lines.append(f"    node {block.node}: {bundles} (a placement group of its own), {shown}")
    return lines
