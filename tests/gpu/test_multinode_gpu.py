"""Ranks on two nodes of one GPU each: Ray's multi-node test cluster on a machine of two GPUs (each node's raylet sees
one GPU), running the colocated two-rank run of test_data_parallel_gpu.py with actor and reference ranks on 2 nodes
× 1 (tests/integration/multinode_run.py). Checks that rank 0 and rank 1 of every role sit on different nodes (Ray's
placement-group table and the workers' nodes), that NCCL's ranks meet at rank 0's node address (127.0.0.2 or
127.0.0.3: not 127.0.0.1), and that each rank's CUDA IPC push reached the engine on its GPU (after 2 steps each
engine's logprobs match the trained actor's). Needs 2 GPUs (skipped on one).
With 4 GPUs, TP engines on two nodes of two GPUs: each engine and its TP workers in its node's placement group, their
bundles counted within it (`placement.seat`)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from test_colocated_run_gpu import REPO_ROOT, product_env
from test_data_parallel_gpu import check_engines_match_actor, two_gpus, two_rank_config  # noqa: F401 (a fixture)
from test_tp_engines_gpu import check_each_engine_matches_actor, tp_config

pytestmark = pytest.mark.gpu
SCRIPT = REPO_ROOT / "tests" / "integration" / "multinode_run.py"


def run_on_two_nodes(config, tmp_path, run_id: str, gpus_per_node: int) -> dict:
    """The run of `config` with actor and reference ranks on 2 nodes × `gpus_per_node` (multinode_run.py); what
    it saw of the placement (its JSON)."""
    cfg = yaml.safe_load(config.read_text())
    for role in ("actor", "ref"):
        cfg[role] |= {"num_nodes": 2, "num_gpus_per_node": gpus_per_node}
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "placement.json"
    done = subprocess.run([sys.executable, str(SCRIPT), run_id, str(out), str(gpus_per_node), "--config",
                           str(config)], cwd=REPO_ROOT, env=product_env(tmp_path), capture_output=True, text=True,
                          timeout=900)
    print(done.stdout[-6000:], done.stderr[-6000:])
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(out.read_text())
    print({key: seen[key] for key in ("workers_started_s", "wall_s", "placement_groups")})
    return seen


def test_ranks_on_two_nodes_meet_at_rank_0s_node_and_push_to_their_engines(standin, two_gpus, tmp_path):
    seen = run_on_two_nodes(two_rank_config(standin, tmp_path), tmp_path, "mn2", gpus_per_node=1)
    nodes, workers = seen["nodes"], seen["workers"]
    rank_nodes = [workers[f"actor/{rank}"]["node_id"] for rank in (0, 1)]
    assert sorted(nodes[node] for node in rank_nodes) == ["127.0.0.2", "127.0.0.3"]
    for role in ("ref", "rollout"):
        assert [workers[f"{role}/{rank}"]["node_id"] for rank in (0, 1)] == rank_nodes, role
    assert workers["actor/1"]["master_addr"] == workers["actor/0"]["master_addr"] == nodes[rank_nodes[0]]
    assert (seen["fresh_start"], seen["attached_again"], seen["num_steps"], seen["left"]) == (True, True, 2, [])
    check_engines_match_actor(tmp_path / "runs" / "mn2")


def test_tp_engines_on_two_nodes_sit_in_their_nodes_groups_beside_their_feeders(standin, cuda, tmp_path):
    """2 nodes × 2 GPUs, 2 engines × TP 2: engine 1's workers are bundles 2-3 of the run but 0-1 of node 1's
    placement group (what VLLM_RAY_BUNDLE_INDICES must say); actor ranks 2 and 3 feed them by CUDA IPC."""
    if cuda.cuda.device_count() < 4:
        pytest.skip("needs 4 GPUs (two nodes of 2, one engine of TP 2 on each)")
    seen = run_on_two_nodes(tp_config(standin, tmp_path, num_engines=2, tp=2), tmp_path, "tp", gpus_per_node=2)
    nodes, workers = seen["nodes"], seen["workers"]
    actor_nodes = [workers[f"actor/{rank}"]["node_id"] for rank in range(4)]
    assert actor_nodes[0] == actor_nodes[1] != actor_nodes[2] == actor_nodes[3]
    assert sorted(nodes[node] for node in (actor_nodes[0], actor_nodes[2])) == ["127.0.0.2", "127.0.0.3"]
    assert [workers[f"rollout/{engine}"]["node_id"] for engine in (0, 1)] == [actor_nodes[0], actor_nodes[2]]
    groups = seen["placement_groups"]
    assert {name.rsplit("/pg/", 1)[1]: set(bundles.values()) for name, bundles in groups.items()} == {
        "0/0": {actor_nodes[0]}, "0/1": {actor_nodes[2]}}
    assert (seen["fresh_start"], seen["attached_again"], seen["num_steps"], seen["left"]) == (True, True, 2, [])
    check_each_engine_matches_actor(tmp_path / "runs" / "tp", num_engines=2, tp=2)
