"""layout (nodes): role groups cut into per-node placement groups, ranks in order across nodes, CPU shares per node."""
import pytest

from hybrid_core.layout import (NodeBlock, block_of, cpu_per_bundle, node_blocks, node_sizes, rank_span,
                                shared_block, unplaceable)
from hybrid_core.plan.report import node_lines


def test_a_group_fills_its_nodes_in_turn_and_the_last_takes_the_rest():
    assert node_sizes(8, 4) == (4, 4)
    assert node_sizes(4, 4) == (4,)
    assert node_sizes(3, 2) == (2, 1)
    assert node_sizes(5, 4) == (4, 1)
    assert node_sizes(1, 8) == (1,)
    with pytest.raises(ValueError, match=r"got 0 bundles, 2 per node"):
        node_sizes(0, 2)


def test_blocks_number_the_bundles_across_the_run_group_after_group():
    # actor+ref on 2 nodes × 2 GPUs, then 3 engines on nodes as wide as the actor's
    blocks = node_blocks([(4, 2), (3, 2)])
    assert blocks == (NodeBlock(group=0, node=0, first_bundle=0, num_bundles=2),
                      NodeBlock(group=0, node=1, first_bundle=2, num_bundles=2),
                      NodeBlock(group=1, node=0, first_bundle=4, num_bundles=2),
                      NodeBlock(group=1, node=1, first_bundle=6, num_bundles=1))
    # rank r of a group of 2 GPUs a node sits on node r // 2, bundle r % 2 of that node's placement group
    assert [block_of(blocks, rank)[0].node for rank in range(4)] == [0, 0, 1, 1]
    assert [block_of(blocks, rank)[1] for rank in range(4)] == [0, 1, 0, 1]
    assert block_of(blocks, 6) == (blocks[3], 0)  # the third engine: the second node of group 1
    assert [rank_span(blocks, block) for block in blocks] == [range(0, 2), range(2, 4), range(0, 2), range(2, 3)]
    with pytest.raises(ValueError, match=r"bundle 7 is outside the run's 7 bundles"):
        block_of(blocks, 7)


def test_bundles_that_must_share_a_node_get_their_indices_in_its_placement_group():
    blocks = node_blocks([(4, 2), (3, 2)])  # as above: bundles 0-1, 2-3 (group 0), 4-5, 6 (group 1)
    assert shared_block(blocks, [2, 2, 3]) == (blocks[1], (0, 0, 1))
    assert shared_block(blocks, [5]) == (blocks[2], (1,))
    with pytest.raises(ValueError, match=r"bundles \[3, 4\] must share one node's placement group: they fall in "
                                         r"group 1 node 1, group 2 node 0$"):
        shared_block(blocks, [3, 4])
    with pytest.raises(ValueError, match=r"they fall in none$"):
        shared_block(blocks, [])


def test_on_cpu_each_node_lends_one_cpu_split_between_its_bundles():
    assert cpu_per_bundle(node_blocks([(1, 1)])) == 1.0
    assert cpu_per_bundle(node_blocks([(2, 1)])) == 1.0  # two nodes of one bundle: a CPU on each
    assert cpu_per_bundle(node_blocks([(2, 2)])) == 0.5  # one node of two bundles, as before several nodes existed
    assert cpu_per_bundle(node_blocks([(1, 1), (1, 1), (1, 1)])) == 0.333  # three groups on one node
    # node 0 holds 2 + 2 bundles, node 1 holds 2 + 1: the crowded node sets the share, rounded down
    assert cpu_per_bundle(node_blocks([(4, 2), (3, 2)])) == 0.25
    assert cpu_per_bundle(node_blocks([(6, 6)])) == 0.166


def test_a_node_of_bundles_no_node_has_is_found_before_ray_would_wait_for_ever():
    blocks = node_blocks([(8, 4), (2, 4)])
    gpu = {"CPU": 1, "GPU": 1}
    four_gpu_nodes = [{"CPU": 32.0, "GPU": 4.0}, {"CPU": 32.0, "GPU": 4.0}]
    assert unplaceable(blocks, gpu, four_gpu_nodes) == []
    two_gpu_nodes = [{"CPU": 32.0, "GPU": 2.0}] * 4  # 8 GPUs in all, but no node has 4
    assert unplaceable(blocks, gpu, two_gpu_nodes) == [blocks[0], blocks[1]]
    assert unplaceable(node_blocks([(2, 1)]), {"CPU": 1.0}, [{"CPU": 0.0}, {"CPU": 1.0}]) == []
    assert unplaceable(node_blocks([(1, 1)]), {"CPU": 1.0}, [{"CPU": 0.0}]) == list(node_blocks([(1, 1)]))


def test_plan_lines_show_each_node_of_a_group_on_several():
    blocks = node_blocks([(4, 2), (3, 2), (1, 1)])
    assert node_lines(blocks, 0) == ["    node 0: 2 bundles (a placement group of its own), ranks 0-1",
                                     "    node 1: 2 bundles (a placement group of its own), ranks 2-3"]
    assert node_lines(blocks, 1) == ["    node 0: 2 bundles (a placement group of its own), ranks 0-1",
                                     "    node 1: 1 bundle (a placement group of its own), rank 2"]
    assert node_lines(blocks, 2) == []  # one node: the group line says it all
