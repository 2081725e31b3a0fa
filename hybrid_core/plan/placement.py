"""Where every role runs: the roles grouped into placement groups of GPU bundles (mirroring OpenRLHF's launcher),
each role's first bundle and GPU share, the engines' bundles and how weights reach them.

Pure functions of a `RunConfig` and of the placement made from it once (`make_placement`): no torch, no Ray.
`run_plan` gathers them into the run's one plan; what it refuses is `plan.refusals`', its text `plan.report`'s; the
workers create the placement groups.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hybrid_core.config import RunConfig
from hybrid_core.layout import EngineLayout, NodeBlock, cpu_per_bundle, node_blocks


# OpenRLHF gives each colocated role 0.2 GPU per bundle; more than five roles would overcommit the GPU.
MAX_SHARED_GPU_FRACTION = 0.2


@dataclass(frozen=True)
class GpuGroup:
    """One role group: `num_bundles` bundles of one GPU (or CPU) on `num_nodes` nodes, each shared by `roles`."""

    roles: tuple[str, ...]
    num_bundles: int
    num_nodes: int
    per_node: int = 0  # bundles on each node but the last (rank r on node r // per_node); 0: num_bundles / num_nodes

    @property
    def gpu_share(self) -> float:
        """The GPU fraction each role asks on every bundle (1.0 when alone)."""
        if len(self.roles) == 1:
            return 1.0
        return min(MAX_SHARED_GPU_FRACTION, 1.0 / len(self.roles))


@dataclass(frozen=True)
class Placement:
    """Where every role runs. `num_gpus` is 0 on device cpu, where bundles ask for CPUs only."""

    groups: tuple[GpuGroup, ...]
    num_engines: int
    tensor_parallel_size: int
    device: str

    @property
    def num_bundles(self) -> int:
        return sum(group.num_bundles for group in self.groups)

    @property
    def num_gpus(self) -> int:
        return 0 if self.device == "cpu" else self.num_bundles

    def group_of(self, role: str) -> GpuGroup | None:
        return next((group for group in self.groups if role in group.roles), None)


def _role_sizes(cfg: RunConfig) -> dict[str, tuple[int, int]]:
    """(num_nodes, num_gpus_per_node) of every role this run creates, in the order OpenRLHF places them."""
    sizes = {"actor": (cfg.actor.num_nodes, cfg.actor.num_gpus_per_node)}
    if cfg.uses_ref:
        sizes["ref"] = (cfg.ref.num_nodes, cfg.ref.num_gpus_per_node)
    if cfg.uses_critic:
        sizes["critic"] = (cfg.critic.num_nodes, cfg.critic.num_gpus_per_node)
    if cfg.uses_reward_model:
        sizes["reward"] = (cfg.reward.num_nodes, cfg.reward.num_gpus_per_node)
    return sizes


def _shared_roles(cfg: RunConfig, roles: list[str]) -> list[list[str]]:
    """Partition the DeepSpeed roles into the sets that share one placement group."""
    if cfg.train.colocate_all:
        return [roles]
    together = []
    if cfg.train.colocate_actor_ref:
        together.append({"actor", "ref"})
    if cfg.train.colocate_critic_reward:
        together.append({"critic", "reward"})
    partition = [[role for role in roles if role in pair] for pair in together]
    partition = [part for part in partition if part]
    return partition + [[role] for role in roles if not any(role in part for part in partition)]


def make_placement(cfg: RunConfig) -> Placement:
    """Group the roles into placement groups as OpenRLHF's launcher does (see inventory §1.2)."""
    sizes = _role_sizes(cfg)
    partition = _shared_roles(cfg, list(sizes))
    has_rollout = cfg.num_rollout_gpus > 0
    # vLLM joins the colocated group only in sync mode: async keeps it generating on its own GPUs.
    rollout_joins = has_rollout and cfg.train.colocate_all and not cfg.train.async_enable
    groups = []
    for part in partition:
        num_nodes, gpus_per_node = sizes[part[0]]  # colocated roles have equal sizes (a config rule)
        roles = (*part, "rollout") if rollout_joins and "actor" in part else tuple(part)
        groups.append(GpuGroup(roles, num_nodes * gpus_per_node, num_nodes))
    if has_rollout and not rollout_joins:
        per_node = cfg.actor.num_gpus_per_node  # vLLM has no per-node flag: nodes as wide as the actor's
        num_nodes = math.ceil(cfg.num_rollout_gpus / per_node)
        groups.append(GpuGroup(("rollout",), cfg.num_rollout_gpus, num_nodes, per_node))
    return Placement(tuple(groups), cfg.vllm.num_engines or 0, cfg.vllm.tensor_parallel_size, cfg.train.device)


def group_blocks(placement: Placement) -> tuple[NodeBlock, ...]:
    """The run's placement groups, one per node of each group (`layout.node_blocks`), in the bundles' order."""
    return node_blocks([(g.num_bundles, g.per_node or math.ceil(g.num_bundles / g.num_nodes))
                        for g in placement.groups])


def bundle_slots(placement: Placement, blocks: tuple[NodeBlock, ...]) -> dict[str, tuple[int, float]]:
    """Each role's (bundle index of its rank 0, share): the groups one after another, each role asking its share of
    its group's bundle. On CPU each node's bundles split one logical CPU (vLLM and torch bind their own threads);
    without vllm.num_engines the engine sits beside the actor."""
    bundle_cpus = cpu_per_bundle(blocks)
    bundles, offset = {}, 0
    for group in placement.groups:
        # rounded down: the roles' shares must add up to no more than their bundle, or one is never placed
        cpu_share = math.floor(bundle_cpus / len(group.roles) * 1000) / 1000
        share = group.gpu_share if placement.device == "cuda" else cpu_share
        bundles |= {role: (offset, share) for role in group.roles}
        offset += group.num_bundles
    bundles.setdefault("rollout", bundles["actor"])
    return bundles


def placed_transport(cfg: RunConfig, placement: Placement) -> str:
    """How weights reach the rollout engine: Ray's object store (colocated on CPU), CUDA IPC (colocated on a GPU)
    or a process group's broadcast, `process_group:<backend>` (distributed mode: the engine has its own devices)."""
    group = placement.group_of("rollout")
    if group is None or "actor" in group.roles:
        return "cuda_ipc" if cfg.train.device == "cuda" else "object_store"
    return "process_group:" + ("gloo" if cfg.train.device == "cpu" else cfg.vllm.sync_backend)


def engines_from(cfg: RunConfig, first_bundle: int) -> EngineLayout:
    """The run's engines and their TP workers' bundles (see `layout.EngineLayout`), from the rollout's first bundle
    (one engine beside the actor without vllm.num_engines)."""
    return EngineLayout(num_engines=cfg.vllm.num_engines or 1, tensor_parallel_size=cfg.vllm.tensor_parallel_size,
                        first_bundle=first_bundle)
