"""Ray placement for a run: connecting to Ray, the colocated placement group, and creating/killing named actors.

Owns the only reads of environment variables (RAY_ADDRESS, cache locations, HYBRID_FAULTS) and the runtime env each
role's process gets (vLLM in-process engine, DeepSpeed's CPU accelerator, rendezvous ports). Actors are named
`<run_id>/<role>/<rank>` in the namespace `hybrid-<run_id>`, detached, and killed when the run ends.
It knows nothing about Prefect or what the workers compute.
"""
from __future__ import annotations

import importlib
import logging
import math
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The object store's and W&B's settings travel from the driver to every worker through Ray's runtime env (a
# cluster's workers do not share its environment). Secrets do not: Ray's runtime-env agent logs runtime envs in
# plain text, so they go as a constructor argument each worker puts into its own environment first (`deferred`).
FORWARDED_ENV = ("AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "WANDB_MODE", "WANDB_BASE_URL")
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

    def construct(self, *args, **kwargs) -> None:
        cls.__init__(self, *args, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "construct": construct, "__module__": cls.__module__,
                                       "__doc__": cls.__doc__})


def has_wandb_key() -> bool:
    """W&B goes online when the run's processes have an API key (WANDB_API_KEY, or from a Secret block)."""
    return bool(os.environ.get("WANDB_API_KEY"))
# Trainer-side processes use a fixed number of CPU threads, so float reductions (and the run's bytes) do not depend
# on how many threads the OS happened to offer; vLLM's CPU build binds its own threads.
TRAINER_THREADS = "1"


@dataclass(frozen=True)
class Rendezvous:
    """Where the data-parallel ranks of one DeepSpeed role meet (one node: its ranks share the port)."""

    rank: int = 0
    world_size: int = 1
    port: int = 0  # 0: a free port of its own (a role of one rank)


def role_env(role: str, on_cpu: bool, rendezvous: Rendezvous = Rendezvous()) -> dict[str, str]:
    """Environment of a role's process, set through Ray's runtime env. Each rank sees only its own GPU (Ray sets
    CUDA_VISIBLE_DEVICES), so its local rank is 0."""
    env = {"TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0"}
    env |= {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    if role == "rollout":
        env |= {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_NO_USAGE_STATS": "1",
                "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    else:
        env |= {"TORCH_EXTENSIONS_DIR": extensions_dir(), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(rendezvous.port or free_port()), "RANK": str(rendezvous.rank),
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
    """Where one actor goes: a bundle of the run's placement group and its share of that bundle."""

    bundle_index: int
    share: float


class RunPlacement:
    """The run's placement group (the bundles `plan.role_bundles` counts) and the actors placed in it."""

    def __init__(self, run: RunRef, num_bundles: int, on_cpu: bool):
        self.run, self.on_cpu = run, on_cpu
        # on CPU the bundles split one CPU (Ray's CPU count is logical here: vLLM and torch bind their own threads)
        bundle = {"CPU": math.floor(1000 / num_bundles) / 1000} if on_cpu else {"CPU": 1, "GPU": 1}
        self.pg = placement_group([dict(bundle) for _ in range(num_bundles)], strategy="PACK",
                                  name=f"{run.run_id}/pg", lifetime="detached")
        ray.get(self.pg.ready(), timeout=READY_TIMEOUT_S)

    def spawn(self, cls, role: str, slot: Slot, rank: int = 0, rendezvous: Rendezvous = Rendezvous(),
              tp_bundles: Sequence[int] = ()):
        """Start the named, detached actor `<run_id>/<role>/<rank>` on its slot (replacing a stale one): its process
        imports what it needs at once; `rendezvous` places a DeepSpeed rank among its role's ranks; `tp_bundles`
        are the bundles of a vLLM engine's TP workers. Its engine is built by `handle.construct.remote(*args)`
        (see `deferred`)."""
        name = self.run.actor_name(role, rank)
        kill_actor(name, self.run.namespace)
        env = role_env(role, self.on_cpu, rendezvous)
        resources = {"num_cpus": slot.share, "num_gpus": 0} if self.on_cpu else \
            {"num_cpus": 0, "num_gpus": slot.share}
        if tp_bundles and not self.on_cpu:  # the TP workers take the GPU shares; the engine's process none
            env |= tp_engine_env([self.bundle_in_group(b) for b in tp_bundles], slot.share)
            resources = {"num_cpus": 0, "num_gpus": 0}
        index = self.bundle_in_group(slot.bundle_index)
        strategy = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=index)
        return ray.remote(deferred(cls)).options(name=name, namespace=self.run.namespace, lifetime="detached",
                                                 scheduling_strategy=strategy, runtime_env={"env_vars": env},
                                                 **resources).remote(_secrets=secrets())

    def bundle_in_group(self, bundle_index: int) -> int:
        """The run-wide bundle `bundle_index` as an index of the placement group holding it (the run has one)."""
        return bundle_index

    def remove(self) -> None:
        remove_placement_group(self.pg)


def get_worker(run: RunRef, role: str, rank: int = 0):
    return ray.get_actor(run.actor_name(role, rank), namespace=run.namespace)


def kill_actor(name: str, namespace: str) -> bool:
    try:
        ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
        return True
    except ValueError:
        return False


def kill_run(run: RunRef, roles=("rollout", "ref", "actor", "critic", "reward"), num_ranks: int = 8) -> None:
    """Kill every actor of the run and its placement group."""
    for role in roles:
        for rank in range(num_ranks):
            kill_actor(run.actor_name(role, rank), run.namespace)
    try:
        remove_placement_group(ray.util.get_placement_group(f"{run.run_id}/pg"))
    except ValueError:
        pass
