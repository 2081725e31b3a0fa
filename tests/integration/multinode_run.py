"""A micro run on a Ray cluster of two nodes on this machine (test_multinode_run.py), in a process of its own so its
Ray is not the test session's: `python multinode_run.py STORE_ROOT RUN_ID OUT_JSON FLAG...`.

Ray's own multi-node test cluster (`ray.cluster_utils.Cluster`): a head that lends nothing (the driver's node) and two
worker nodes of one CPU each, at addresses of their own on the loopback network (127.0.0.2 and 127.0.0.3), so one
node's CPU holds one node's bundles and the rank-0 node's address differs from every other node's. The workers are
started as `rl-train` starts them (`launch.start_workers`), their placement read from Ray (placement-group table,
each worker's node and rendezvous) and written to OUT_JSON; then the `rl-train` flow re-attaches to them and trains.
Prefect is the session's server (PREFECT_API_URL).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

NODE_ADDRESSES = ("127.0.0.2", "127.0.0.3")
OBJECT_STORE_BYTES = 80 * 2**20


def start_cluster(temp_dir: str):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": OBJECT_STORE_BYTES, "temp_dir": temp_dir, "include_dashboard": False})
    for address in NODE_ADDRESSES:
        cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES, node_ip_address=address)
    cluster.connect()
    return cluster


def placement_seen(run, role_ranks: dict[str, int], num_engines: int) -> dict:
    """What Ray says of the run's placement: its placement groups' bundles → node ids, the node table, and each
    worker's node and rendezvous."""
    import ray
    from ray.util import placement_group_table

    from hybrid_core.workers import placement

    groups = {info["name"]: info["bundles_to_node_id"] for info in placement_group_table().values()
              if placement.is_run_pg(run, info["name"]) and info["state"] == "CREATED"}
    nodes = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
    workers = {f"{role}/{rank}": placement.get_worker(run, role, rank).whereabouts.remote()
               for role, count in (role_ranks | {"rollout": num_engines}).items() for rank in range(count)}
    return {"placement_groups": groups, "nodes": nodes,
            "workers": {name: ray.get(ref, timeout=60) for name, ref in workers.items()}}


def main(store_root: str, run_id: str, out_json: str, *flags: str) -> None:
    from flows.rl_train import rl_train
    from hybrid_core.workers.launch import open_run, start_workers
    from hybrid_core.workers.worker_args import num_engines, role_ranks, run_ref
    from tests.integration.conftest import micro_config

    started = time.perf_counter()
    cluster = start_cluster(str(Path(store_root) / "ray"))
    try:
        cfg = micro_config(Path(store_root), *flags)
        run = run_ref(cfg, run_id)
        open_run(cfg, run)
        started_workers = start_workers(cfg, run)
        seen = placement_seen(run, role_ranks(cfg), num_engines(cfg))
        seen["attached_again"] = start_workers(cfg, run).is_attached  # what rl-train is about to do
        seen["workers_started_s"] = time.perf_counter() - started
        summary = rl_train(cfg, run_id=run_id)
        seen |= {"fresh_start": not started_workers.is_attached, "run_dir": summary.run_dir,
                 "num_steps": summary.num_steps, "wall_s": time.perf_counter() - started}
        Path(out_json).write_text(json.dumps(seen, indent=1))
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    main(*sys.argv[1:])
