"""Ray placement for a run: connecting to Ray, the run's placement groups (one per node of each role group, see
`layout`), and creating/killing named actors.

Owns the only reads of environment variables (RAY_ADDRESS, cache locations, HYBRID_FAULTS) and the runtime env each
role's process gets (vLLM's settings, DeepSpeed's CPU accelerator, ranks), and where a role's ranks meet: the
address of the node its rank 0 runs on, with a port free there. Actors are named `<run_id>/<role>/<rank>` in the
namespace `hybrid-<run_id>`, detached, and killed when the run ends.
It knows nothing about Prefect or what the workers compute.
"""
from __future__ import annotations

import importlib
import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.layout import NodeBlock, cpu_per_bundle, shared_block, unplaceable
from hybrid_core.switches import SWITCHES
from hybrid_core.types import RunRef
from hybrid_core.workers.faults import Fault, parse_faults

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 900


def extensions_dir() -> str:
    """DeepSpeed's JIT cache: a folder the project owns (stale build locks can be found and cleared), one per Python
    environment, because ops built against one torch must not be rebuilt in turn by another venv's builds."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path(sys.prefix) / ".cache" / "torch_extensions")


def injected_faults() -> tuple[Fault, ...]:
    """Faults the fault tests inject (`HYBRID_FAULTS`, see `workers.faults`); none outside tests."""
    return parse_faults(os.environ.get("HYBRID_FAULTS", ""), os.environ.get("HYBRID_FAULTS_RELEASE", ""))


def connect(num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """Attach to RAY_ADDRESS when set (a cluster, or `ray start --head`), else start a local Ray."""
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    quiet = {"log_to_driver": True, "configure_logging": True, "logging_level": logging.WARNING}
    if address:
        ray.init(address=address, **quiet)
    else:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), num_gpus=num_gpus, include_dashboard=False,
                 object_store_memory=256 * 2**20, **quiet)


def cluster_gpus() -> int | None:
    """The GPUs of the Ray cluster at RAY_ADDRESS (connecting to it), or None without one (a local Ray gets the
    GPUs of this machine)."""
    if not os.environ.get("RAY_ADDRESS"):
        return None
    connect()
    return int(ray.cluster_resources().get("GPU", 0))


def free_port() -> int:
    """A port free on every interface of this node (a rendezvous is reached from other nodes, not over loopback)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# The object store's and W&B's settings travel from the driver to every worker through Ray's runtime env (a
# cluster's workers do not share its environment). Secrets do not: Ray's runtime-env agent logs runtime envs in
# plain text, so they go as a constructor argument each worker puts into its own environment first (`deferred`).
# The switches' variables stand in for `ds.*` fields left unset (`switches`): the driver's reach every worker.
FORWARDED_ENV = ("AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "WANDB_MODE", "WANDB_BASE_URL",
                 *(switch.env for switch in SWITCHES.values()))
SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "WANDB_API_KEY")


def secrets() -> dict[str, str]:
    """The secret variables of the driver's environment that its workers need."""
    return {name: os.environ[name] for name in SECRET_ENV if name in os.environ}


def deferred(cls):
    """`cls` as a two-phase Ray actor: constructing it only puts `_secrets` into the process's environment (S3
    clients and W&B read them from there) and imports the modules `cls.PRELOAD` names; `construct(*args)` then runs
    `cls`'s own constructor. The run's processes pay their imports side by side while their engines are still built
    one after another (the rollout engine first: its memory profile must not see the trainer's allocations)."""
    def __init__(self, *, _secrets: dict[str, str]):
        os.environ.update(_secrets)
        for module in getattr(cls, "PRELOAD", ()):
            importlib.import_module(module)

    def construct(self, *args, _meet_at: tuple[str, int] | None = None, **kwargs) -> None:
        if _meet_at is not None:  # where the role's ranks meet: set before DeepSpeed's init reads it
            os.environ.update(MASTER_ADDR=_meet_at[0], MASTER_PORT=str(_meet_at[1]))
        cls.__init__(self, *args, **kwargs)

    methods = {"__init__": __init__, "construct": construct, "rendezvous_point": rendezvous_point,
               "whereabouts": whereabouts, "sees": sees}
    return type(cls.__name__, (cls,), methods | {"__module__": cls.__module__, "__doc__": cls.__doc__})


def rendezvous_point(self) -> tuple[str, int]:
    """This node's address (as Ray knows it) and a port free here: where a role's ranks meet, asked of its rank 0."""
    return ray.util.get_node_ip_address(), free_port()


def whereabouts(self) -> dict:
    """The node this worker runs on and the rendezvous it was given (MASTER_ADDR/PORT: none for engines)."""
    return {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "master_addr": os.environ.get("MASTER_ADDR"), "master_port": os.environ.get("MASTER_PORT")}


def sees(self, run_dir: str) -> bool:
    """Whether this worker's node sees the run's manifest (the driver wrote it; the workers read and write beside
    it): on several nodes the store must be shared."""
    return RolloutStore(run_dir).exists("manifest.json")


def has_wandb_key() -> bool:
    """W&B goes online when the run's processes have an API key (WANDB_API_KEY, or from a Secret block)."""
    return bool(os.environ.get("WANDB_API_KEY"))
# Trainer-side processes use a fixed number of CPU threads, so float reductions (and the run's bytes) do not depend
# on how many threads the OS happened to offer; vLLM's CPU build binds its own threads.
TRAINER_THREADS = "1"


@dataclass(frozen=True)
class Rendezvous:
    """A rank among the data-parallel ranks of one DeepSpeed role. Where they meet is known only once rank 0's
    process runs (its node's address): `construct(..., _meet_at=...)` sets it."""

    rank: int = 0
    world_size: int = 1


def role_env(role: str, on_cpu: bool, rendezvous: Rendezvous = Rendezvous()) -> dict[str, str]:
    """Environment of a role's process, set through Ray's runtime env. Each rank sees only its own GPU (Ray sets
    CUDA_VISIBLE_DEVICES), so its local rank is 0."""
    env = {"TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0"}
    env |= {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    if role == "rollout":
        env |= {"VLLM_NO_USAGE_STATS": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    else:
        env |= {"TORCH_EXTENSIONS_DIR": extensions_dir(), "RANK": str(rendezvous.rank),
                "LOCAL_RANK": "0", "WORLD_SIZE": str(rendezvous.world_size),
                "OMP_NUM_THREADS": TRAINER_THREADS, "MKL_NUM_THREADS": TRAINER_THREADS}
    if on_cpu:
        env |= {"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    if on_cpu and role == "rollout":  # TP workers (child processes) leave their threads unbound, as one worker does:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # vLLM's automatic binding wants a NUMA node per worker
    return env


def tp_engine_env(bundle_indices: Sequence[int], worker_share: float) -> dict[str, str]:
    """What vLLM's Ray executor reads to place a GPU engine's TP workers (as OpenRLHF's engines do): one worker actor
    on each bundle, in order, each asking `worker_share` of that bundle's GPU beside the actor rank that feeds it.
    The engine's own process asks for no GPU, so Ray leaves its CUDA_VISIBLE_DEVICES alone (Ray ≥ 2.47 does not
    narrow it to nothing): it schedules, its workers compute."""
    return {"VLLM_RAY_BUNDLE_INDICES": ",".join(str(index) for index in bundle_indices),
            "VLLM_RAY_PER_WORKER_GPUS": f"{worker_share:g}"}


@dataclass(frozen=True)
class Slot:
    """Where one actor goes: a bundle of the run (counted across its placement groups) and its share of it."""

    bundle_index: int
    share: float


def seat(blocks: Sequence[NodeBlock], bundle_index: int,
         tp_bundles: Sequence[int] = ()) -> tuple[NodeBlock, int, tuple[int, ...]]:
    """Where the actor on run-wide bundle `bundle_index` goes: the block (one node's placement group) holding it and
    its index there; for a vLLM engine, also its TP workers' run-wide `tp_bundles` as indices of that same group.
    vLLM's Ray executor places the workers in the group its engine's process runs in and reads
    VLLM_RAY_BUNDLE_INDICES within it, so the engine and its workers must share one node's group."""
    try:
        block, (index, *worker_indices) = shared_block(blocks, [bundle_index, *tp_bundles])
    except ValueError as err:
        raise ValueError(f"{err}; a vLLM engine and its TP workers sit on one node: vllm.tensor_parallel_size must "
                         "divide actor.num_gpus_per_node") from err
    return block, index, tuple(worker_indices)


def pg_name(run: RunRef, block: NodeBlock) -> str:
    return f"{run.run_id}/pg/{block.group}/{block.node}"


def is_run_pg(run: RunRef, name: str) -> bool:
    return name.startswith(f"{run.run_id}/pg/")


class RunPlacement:
    """The run's placement groups, one per node of each role group (`RunPlan.blocks`), each of STRICT_PACK
    bundles (they must share one node), and the actors placed in them. A slot's bundle index counts across the
    run; the block holding it says which group and which bundle of it."""

    def __init__(self, run: RunRef, blocks: Sequence[NodeBlock], on_cpu: bool):
        self.run, self.on_cpu, self.blocks = run, on_cpu, tuple(blocks)
        # on CPU each node's bundles split one CPU (Ray's CPU count is logical here: vLLM and torch bind their own
        # threads), so a run of two nodes asks two CPUs, one on each
        bundle = {"CPU": cpu_per_bundle(blocks)} if on_cpu else {"CPU": 1, "GPU": 1}
        refuse_unplaceable(self.blocks, bundle)
        self.groups = [placement_group([dict(bundle) for _ in block.bundles], strategy="STRICT_PACK",
                                       name=pg_name(run, block), lifetime="detached") for block in self.blocks]
        wait_placed(self.groups, self.blocks, bundle)

    def spawn(self, cls, role: str, slot: Slot, rank: int = 0, rendezvous: Rendezvous = Rendezvous(),
              tp_bundles: Sequence[int] = (), concurrency_groups: dict[str, int] | None = None):
        """Start the named, detached actor `<run_id>/<role>/<rank>` on its slot (replacing a stale one): its process
        imports what it needs at once; `rendezvous` places a DeepSpeed rank among its role's ranks; `tp_bundles`
        are the bundles of a vLLM engine's TP workers; `concurrency_groups` makes it a threaded actor serving those
        groups beside its default one (one call at a time there, as without). Its engine is built by `handle.construct.remote(*args)`
        (see `deferred`)."""
        name = self.run.actor_name(role, rank)
        kill_actor(name, self.run.namespace)
        env = role_env(role, self.on_cpu, rendezvous)
        resources = {"num_cpus": slot.share, "num_gpus": 0} if self.on_cpu else \
            {"num_cpus": 0, "num_gpus": slot.share}
        block, index, worker_indices = seat(self.blocks, slot.bundle_index, tp_bundles)
        if worker_indices and not self.on_cpu:  # the TP workers take the GPU shares; the engine's process none
            env |= tp_engine_env(worker_indices, slot.share)
            resources = {"num_cpus": 0, "num_gpus": 0}
        strategy = PlacementGroupSchedulingStrategy(self.groups[self.blocks.index(block)],
                                                    placement_group_bundle_index=index)
        actor_class = ray.remote(concurrency_groups=concurrency_groups)(deferred(cls)) if concurrency_groups \
            else ray.remote(deferred(cls))  # Ray takes concurrency groups at the class, not in `.options()`
        return actor_class.options(name=name, namespace=self.run.namespace, lifetime="detached",
                                   scheduling_strategy=strategy, runtime_env={"env_vars": env},
                                   **resources).remote(_secrets=secrets())

    def remove(self) -> None:
        for group in self.groups:
            remove_placement_group(group)


def refuse_unplaceable(blocks: Sequence[NodeBlock], bundle: dict) -> None:
    """Refuse at once a node's worth of bundles that no node of the cluster has (Ray would wait for ever)."""
    totals = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    if late := unplaceable(blocks, bundle, totals):
        widest = {name: max((node.get(name, 0.0) for node in totals), default=0.0) for name in bundle}
        raise ValueError("no node of the Ray cluster can hold " + "; ".join(
            f"group {b.group + 1} node {b.node}: {b.num_bundles} bundles of {bundle}" for b in late)
            + f" (the largest node has {widest}); lower num_gpus_per_node, or add nodes that large")


def wait_placed(groups: Sequence[PlacementGroup], blocks: Sequence[NodeBlock], bundle: dict) -> None:
    """Wait until every placement group is placed; one that cannot be (no node holds its bundles) is named."""
    ready = [group.ready() for group in groups]
    pending = ray.wait(ready, num_returns=len(ready), timeout=READY_TIMEOUT_S)[1]
    if pending:
        late = [blocks[ready.index(ref)] for ref in pending]
        raise RuntimeError(f"placement groups not placed within {READY_TIMEOUT_S}s: " + "; ".join(
            f"group {b.group + 1} node {b.node}: {b.num_bundles} × {bundle} on one node" for b in late)
            + "; each needs one node with that much free: give the cluster such nodes, or lower num_gpus_per_node")


def get_worker(run: RunRef, role: str, rank: int = 0):
    return ray.get_actor(run.actor_name(role, rank), namespace=run.namespace)


def kill_actor(name: str, namespace: str) -> bool:
    try:
        ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
        return True
    except ValueError:
        return False


KILL_ORDER = ("rollout", "ref", "actor", "critic", "reward")


def _kill_rank(name: str) -> int:
    """Where an actor named `<run_id>/<role>/<rank>` comes in `KILL_ORDER`."""
    role = name.rsplit("/", 2)[-2] if name.count("/") >= 2 else ""
    return KILL_ORDER.index(role) if role in KILL_ORDER else len(KILL_ORDER)


def kill_run(run: RunRef) -> None:
    """Kill every actor of the run (every named actor of its namespace, however many ranks and nodes), rollout
    engines first, then remove its placement groups (a driver that did not create them finds them by name)."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == run.namespace]
    for name in sorted(names, key=_kill_rank):
        kill_actor(name, run.namespace)
    for pg_id, info in placement_group_table().items():
        if is_run_pg(run, info.get("name", "")) and info.get("state") != "REMOVED":
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
