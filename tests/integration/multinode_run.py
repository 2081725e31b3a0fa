"""A run on a Ray cluster of two nodes on this machine, in a process of its own so that its Ray is not the calling
test session's: `python multinode_run.py RUN_ID OUT_JSON GPUS_PER_NODE FLAG...` (the `hybrid train` flags).

Ray's own multi-node test cluster (`ray.cluster_utils.Cluster`): a head that lends nothing (the driver's node) and two
worker nodes at addresses of their own on the loopback network (127.0.0.2 and 127.0.0.3), so the rank-0 node's
address differs from the other's. With GPUS_PER_NODE 0 each node has one CPU (one node's bundles fill it: a run of
two nodes must spread); otherwise each node sees GPUS_PER_NODE GPUs of its own (CUDA_VISIBLE_DEVICES, which its raylet
and workers inherit). The workers are started as `rl-train` starts them (`launch.start_workers`), their placement read
from Ray (the placement-group table, each worker's node and rendezvous) and written to OUT_JSON with the run's
directory and timings; then the `rl-train` flow re-attaches to them and trains. Prefect: PREFECT_API_URL when set.
Used by tests/integration/test_multinode_run.py (CPU) and tests/gpu/test_multinode_gpu.py (two GPUs).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_ADDRESSES = ("127.0.0.2", "127.0.0.3")
OBJECT_STORE_BYTES = 80 * 2**20


def start_cluster(temp_dir: str, gpus_per_node: int):
    """The head (no resources: nothing of the run lands there) and the two worker nodes; connects this driver."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "num_gpus": 0, "object_store_memory": OBJECT_STORE_BYTES, "temp_dir": temp_dir,
        "include_dashboard": False})
    for node, address in enumerate(NODE_ADDRESSES):
        if gpus_per_node:  # the raylet (and its workers) see only this node's GPUs
            first = node * gpus_per_node
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(gpus_per_node))
        cluster.add_node(num_cpus=max(1, 2 * gpus_per_node), num_gpus=gpus_per_node,
                         object_store_memory=OBJECT_STORE_BYTES, node_ip_address=address)
    if gpus_per_node:
        os.environ.pop("CUDA_VISIBLE_DEVICES")
    cluster.connect()
    return cluster


def run_groups(run) -> list[dict]:
    """Ray's placement-group table rows of the run's groups (any state)."""
    from ray.util import placement_group_table

    from hybrid_core.workers import placement

    return [info for info in placement_group_table().values() if placement.is_run_pg(run, info["name"])]


def placement_seen(run, role_ranks: dict[str, int], num_engines: int) -> dict:
    """What Ray says of the run's placement: its placement groups' bundles → node ids, the node table, and each
    worker's node and rendezvous."""
    import ray

    from hybrid_core.workers import placement

    groups = {info["name"]: info["bundles_to_node_id"] for info in run_groups(run) if info["state"] == "CREATED"}
    nodes = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
    workers = {f"{role}/{rank}": placement.get_worker(run, role, rank).whereabouts.remote()
               for role, count in (role_ranks | {"rollout": num_engines}).items() for rank in range(count)}
    return {"placement_groups": groups, "nodes": nodes,
            "workers": {name: ray.get(ref, timeout=60) for name, ref in workers.items()}}


def left_behind(run, wait_s: float = 15.0) -> list[str]:
    """The run's actors and placement groups still alive once `rl-train` has ended (none), allowing `wait_s` for
    killed actors to be deregistered (ray.kill does not wait)."""
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        left = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == run.namespace]
        left += [info["name"] for info in run_groups(run) if info["state"] != "REMOVED"]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def train(run_id: str, flags: list[str], gpus_per_node: int) -> dict:
    """Start the workers, read their placement, let `rl-train` re-attach and train; returns what was seen."""
    from flows.rl_train import rl_train
    from hybrid_core.flags import parse_cli
    from hybrid_core.workers.launch import open_run, start_workers
    from hybrid_core.workers.worker_args import num_engines, role_ranks, run_ref

    started = time.perf_counter()
    temp_dir = tempfile.mkdtemp(prefix="hmn-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    cluster = start_cluster(temp_dir, gpus_per_node)
    try:
        cfg = parse_cli(flags)
        run = run_ref(cfg, run_id)
        open_run(cfg, run)
        is_fresh = not start_workers(cfg, run).is_attached
        seen = placement_seen(run, role_ranks(cfg), num_engines(cfg))
        seen |= {"fresh_start": is_fresh, "attached_again": start_workers(cfg, run).is_attached,
                 "workers_started_s": time.perf_counter() - started}
        summary = rl_train(cfg, run_id=run_id)
        return seen | {"run_dir": summary.run_dir, "num_steps": summary.num_steps, "left": left_behind(run),
                       "wall_s": time.perf_counter() - started}
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    run_id, out_json, gpus = sys.argv[1:4]
    Path(out_json).write_text(json.dumps(train(run_id, sys.argv[4:], int(gpus)), indent=1))
