"""Ranks on several nodes: the two-rank gae micro run (2 steps) with every role on 2 nodes × 1, on Ray's own
multi-node test cluster (two nodes of one CPU at addresses of their own, in a process of its own: multinode_run.py),
through real Ray, Prefect, vLLM's CPU build and DeepSpeed (gloo). Where the ranks sat is read from Ray's
placement-group table and each worker's node; what they computed must equal the same run on one node (the
session's shared two-rank run of test_data_parallel_run.py), dataset for dataset."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hybrid_core.workers.step_ledger import VOLATILE_METRICS
from tests.conftest import REPO_ROOT
from tests.integration.conftest import GAE_FLAGS, MICRO_FLAGS, TWO_RANK_GAE_FLAGS, read_metrics, read_stage

pytestmark = pytest.mark.integration
SCRIPT = REPO_ROOT / "tests" / "integration" / "multinode_run.py"
RUN_ID = "gae-two-nodes"
TWO_NODES = (*GAE_FLAGS, "--vllm.num_engines", "2",
             *(flag for role in ("actor", "ref", "critic")
               for flag in (f"--{role}.num_nodes", "2", f"--{role}.num_gpus_per_node", "1")))
ROLES = ("actor", "ref", "critic", "rollout")  # colocated: every role's rank r on the bundle of node r


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory, tiny_model, prefect_server) -> dict:
    """Train it in its own process (its Ray cluster must not meet the session's Ray); returns what that process saw
    of the placement, and the run's directory."""
    root = tmp_path_factory.mktemp("multinode")
    out = root / "placement.json"
    env = os.environ | {"PREFECT_API_URL": prefect_server, "RAY_AUTH_MODE": "disabled",
                        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    flags = [*MICRO_FLAGS, "--store.root", str(root), *TWO_NODES]
    done = subprocess.run([sys.executable, str(SCRIPT), RUN_ID, str(out), "0", *flags], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(out.read_text())


def test_ranks_sit_in_order_on_two_nodes_and_meet_at_the_node_of_rank_0(two_node_run):
    seen, nodes = two_node_run, two_node_run["nodes"]
    # one placement group a node for the colocated group, each of one bundle, on two different nodes
    node_of = seen["placement_groups"]
    assert sorted(node_of) == [f"{RUN_ID}/pg/0/0", f"{RUN_ID}/pg/0/1"]
    assert all(list(bundles) == ["0"] for bundles in node_of.values())
    rank_nodes = [node_of[f"{RUN_ID}/pg/0/{rank}"]["0"] for rank in (0, 1)]
    assert sorted(nodes[node] for node in rank_nodes) == ["127.0.0.2", "127.0.0.3"]
    workers = seen["workers"]
    for role in ROLES:
        assert [workers[f"{role}/{rank}"]["node_id"] for rank in (0, 1)] == rank_nodes, role
    for role in ("actor", "critic"):  # the DeepSpeed roles: rank 1 meets rank 0 at rank 0's node, port and all
        rank_0, rank_1 = workers[f"{role}/0"], workers[f"{role}/1"]
        assert rank_0["master_addr"] == rank_0["node_ip"] == nodes[rank_nodes[0]], role
        assert (rank_1["master_addr"], rank_1["master_port"]) == (rank_0["master_addr"], rank_0["master_port"]), role
        assert rank_1["node_ip"] == nodes[rank_nodes[1]] != rank_1["master_addr"], role
    # the flow re-attached to these workers, trained its 2 steps with them, then killed them and removed the groups
    assert (seen["fresh_start"], seen["attached_again"], seen["num_steps"], seen["left"]) == (True, True, 2, [])


def test_the_two_node_run_equals_the_one_node_run(two_node_run, shared_run):
    """The same ranks doing the same work: nothing may differ but where they ran (and the timings)."""
    _, one_node = shared_run("gae-two", *TWO_RANK_GAE_FLAGS)
    two_nodes = two_node_run["run_dir"]
    keys = [("prompt_index", "ascending"), ("sample_index", "ascending")]
    for step in (1, 2):
        for stage in ("rollout", "reward", "advantage"):
            one, two = (read_stage(run, step, stage).sort_by(keys) for run in (one_node, two_nodes))
            assert two.num_rows == one.num_rows == 4 and two.equals(one), (step, stage)
        one, two = (read_metrics(run, step) for run in (one_node, two_nodes))
        figures = sorted(name for name in one if not name.startswith(VOLATILE_METRICS))
        assert "critic/value_loss" in figures and "actor/grad_norm" in figures
        assert {name: two[name] for name in figures} == {name: one[name] for name in figures}, step
