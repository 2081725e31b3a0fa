"""The run's plan, built once from its configuration: one row per role (ranks, first bundle, GPU share, ring groups),
the node blocks, the engines × TP, how weights reach them, the sleep modes, the switches and the memory estimate.

`run_plan` is the one place the placement is made; `hybrid plan` prints the value, the preflight checks it, and the
workers are started from it (`worker_args`, `launch`) instead of deriving the placement again. It is a frozen value
of counts and names: no torch, no Ray, nothing it measures itself (the caller gives the GPU's memory).
"""
from __future__ import annotations

from dataclasses import dataclass

from hybrid_core.config import RunConfig
from hybrid_core.layout import EngineLayout, NodeBlock, ring_group_ranks
from hybrid_core.plan.memory import MemoryPlan, estimate_memory
from hybrid_core.plan.placement import (Placement, bundle_slots, engines_from, group_blocks, make_placement,
                                        placed_transport)
from hybrid_core.plan.ring import RING_ROLES
from hybrid_core.switches import SWITCHES, switch_values

RANKED_ROLES = ("actor", "ref", "critic", "reward")  # the DeepSpeed and frozen roles, one rank per bundle
MemoryEstimate = tuple[MemoryPlan | None, str | None]  # the estimate, or why there is none


@dataclass(frozen=True, kw_only=True)
class RoleRow:
    """One role of the run: `num_ranks` ranks (engines for the rollout) from bundle `first_bundle` on, each asking
    `share` of its bundle's GPU (or CPU), and its rings of ranks (none without ring attention)."""

    role: str
    num_ranks: int
    first_bundle: int
    share: float
    ring_groups: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, kw_only=True)
class SleepModes:
    """What sleeps between stages: vLLM at `vllm_level` (None: awake), DeepSpeed's states (`deepspeed`)."""

    vllm_level: int | None
    deepspeed: bool


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """Everything the run's start reads of where things run, from `run_plan`."""

    placement: Placement
    blocks: tuple[NodeBlock, ...]
    rows: tuple[RoleRow, ...]
    engines: EngineLayout
    sync_transport: str
    sleep: SleepModes
    switches: dict[str, str]  # each of `switches.SWITCHES` as it applies: its ds.* field, else its variable
    gpu_total_gib: float | None = None  # the GPU the memory was estimated for; None: not estimated
    memory: MemoryPlan | None = None
    memory_error: str | None = None  # why there is no estimate on a GPU run (an unknown model shape)

    @property
    def device(self) -> str:
        return self.placement.device

    @property
    def num_bundles(self) -> int:
        return max(1, self.placement.num_bundles)

    def row(self, role: str) -> RoleRow | None:
        return next((row for row in self.rows if row.role == role), None)

    @property
    def role_ranks(self) -> dict[str, int]:
        """Data-parallel ranks of the actor, reference, critic and reward model that this run starts."""
        return {row.role: row.num_ranks for row in self.rows if row.role in RANKED_ROLES}

    @property
    def bundles(self) -> dict[str, tuple[int, float]]:
        """Each role's (bundle index of its rank 0, share), the rollout's included."""
        return {row.role: (row.first_bundle, row.share) for row in self.rows}


def _ring_groups(cfg: RunConfig, role: str, num_ranks: int) -> tuple[tuple[int, ...], ...]:
    """The role's rings, when it splits samples over one that divides its ranks (the refusals name the others)."""
    size = cfg.ds.ring_attn_size
    if size == 1 or role not in RING_ROLES or num_ranks % size:
        return ()
    return tuple(tuple(ranks) for ranks in ring_group_ranks(num_ranks, size))


def _rows(cfg: RunConfig, placement: Placement, slots: dict[str, tuple[int, float]], num_engines: int) -> tuple:
    """One row per ranked role this run starts (the reward model only when it scores), then the rollout's."""
    rows = []
    for role in RANKED_ROLES:
        group = placement.group_of(role)
        if group is None:
            continue
        first, share = slots[role]
        rows.append(RoleRow(role=role, num_ranks=group.num_bundles, first_bundle=first, share=share,
                            ring_groups=_ring_groups(cfg, role, group.num_bundles)))
    first, share = slots["rollout"]
    rows.append(RoleRow(role="rollout", num_ranks=num_engines, first_bundle=first, share=share))
    return tuple(rows)


def _memory(cfg: RunConfig, placement: Placement, gpu_total_gib: float | None) -> MemoryEstimate:
    """The estimate for one of the actor's GPUs of `gpu_total_gib` (only on GPU runs given a GPU's size), or why
    there is none."""
    if cfg.train.device != "cuda" or gpu_total_gib is None:
        return None, None
    try:
        return estimate_memory(cfg, gpu_total_gib, placement.group_of("actor").roles), None
    except ValueError as err:  # a model whose shape is unknown: the plan says why
        return None, str(err)


def run_plan(cfg: RunConfig, gpu_total_gib: float | None = None) -> RunPlan:
    """The run's plan: the placement made once and everything read from it; the memory estimate when
    `gpu_total_gib` (the GPU's memory, `gpu_probe.gpu_memory_gib`) is given on a GPU run."""
    placement = make_placement(cfg)
    blocks = group_blocks(placement)
    slots = bundle_slots(placement, blocks)
    engines = engines_from(cfg, first_bundle=slots["rollout"][0])
    sleep = SleepModes(vllm_level=cfg.vllm.sleep_level if cfg.vllm.enable_sleep else None,
                       deepspeed=cfg.ds.enable_sleep)
    switches = switch_values({name: getattr(cfg.ds, name) for name in SWITCHES})
    memory, memory_error = _memory(cfg, placement, gpu_total_gib)
    return RunPlan(placement=placement, blocks=blocks, rows=_rows(cfg, placement, slots, engines.num_engines),
                   engines=engines, sync_transport=placed_transport(cfg, placement), sleep=sleep, switches=switches,
                   gpu_total_gib=gpu_total_gib, memory=memory, memory_error=memory_error)


def run_node_blocks(cfg: RunConfig) -> tuple[NodeBlock, ...]:
    """`run_plan(cfg).blocks`, for a caller that holds only a configuration (a run reads its plan)."""
    return run_plan(cfg).blocks


def role_bundles(cfg: RunConfig) -> tuple[int, dict[str, tuple[int, float]]]:
    """The bundle count and each role's (first bundle, share) of `run_plan(cfg)`, for a caller without a plan."""
    plan = run_plan(cfg)
    return plan.num_bundles, plan.bundles


def sync_transport(cfg: RunConfig) -> str:
    """`run_plan(cfg).sync_transport`, for a caller that holds only a configuration."""
    return run_plan(cfg).sync_transport


def engine_layout(cfg: RunConfig) -> EngineLayout:
    """`run_plan(cfg).engines`, for a caller that holds only a configuration."""
    return run_plan(cfg).engines
