"""What `hybrid plan` prints: the run's size, its placement groups node by node, the engines × TP and who feeds them,
the reward model, ring groups, optimizers, sleep modes, the flags not implemented yet and the memory estimate.

Text only: every figure comes from the placement, the layout and the memory plan; nothing here decides or refuses.
"""
from __future__ import annotations

import math
from typing import Sequence

from hybrid_core.config import RunConfig
from hybrid_core.layout import EngineLayout, NodeBlock, rank_span
from hybrid_core.plan.memory import estimate_memory, render_memory
from hybrid_core.plan.optimizer_rules import optimizer_lines
from hybrid_core.plan.placement import (GpuGroup, Placement, engine_layout, make_placement, run_node_blocks,
                                        sync_transport)
from hybrid_core.plan.refusals import gaps
from hybrid_core.plan.ring import ring_lines

# What `hybrid plan` assumes without nvidia-smi: an H200's memory as CUDA reports it (torch.cuda.mem_get_info).
ASSUMED_GPU_GIB = 139.8

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


def engine_lines(layout: EngineLayout, by_cuda_ipc: bool) -> list[str]:
    """What `hybrid plan` shows of engines with several TP workers: each engine's bundles (and, fed by CUDA IPC, the
    actor ranks that feed its workers); nothing for TP 1."""
    if layout.tensor_parallel_size == 1:
        return []
    lines = []
    for engine in range(layout.num_engines):
        bundles = layout.bundles(engine)
        line = f"    engine {engine}: TP workers on bundles {bundles.start}-{bundles.stop - 1}"
        if by_cuda_ipc:
            ranks = layout.feeders(engine)
            line += f", weights by CUDA IPC from actor ranks {ranks.start}-{ranks.stop - 1} (one per GPU)"
        lines.append(line)
    return lines


def _group_line(index: int, group: GpuGroup, placement: Placement) -> str:
    unit = "CPU bundles" if placement.device == "cpu" else "bundles of 1 GPU"
    shares = ", ".join(f"{role} {group.gpu_share:g}" for role in group.roles)
    return (f"  group {index}: {group.num_bundles} {unit} on {group.num_nodes} node(s); "
            f"roles and GPU share per bundle: {shares}")


def _rollout_line(cfg: RunConfig, placement: Placement) -> list[str]:
    if placement.num_engines == 0:
        return ["rollout: no vLLM engines (--vllm.num_engines is not set)"]
    group = placement.group_of("rollout")
    where = "shares the actor's GPUs" if group and "actor" in group.roles else "has its own GPUs"
    runner = {"mp": ", model runner in a child process (vllm.executor_backend mp)",
              "uni": ", model runner in the rollout worker's process (vllm.executor_backend uni)"}
    core = ", engine core in a process of its own" if cfg.vllm.engine_core_process else ""
    return [f"rollout: {placement.num_engines} vLLM engines × TP {placement.tensor_parallel_size}, {where}, "
            f"gpu_memory_utilization {cfg.vllm.gpu_memory_utilization:g}{runner.get(cfg.engine_executor, '')}{core}",
            *engine_lines(engine_layout(cfg), by_cuda_ipc=sync_transport(cfg) == "cuda_ipc")]


def _reward_lines(cfg: RunConfig, placement: Placement) -> list[str]:
    """Where the reward model's ranks sit (each scores a share of a step's samples); nothing without one."""
    group = placement.group_of("reward")
    if group is None:
        return []
    index = placement.groups.index(group) + 1
    beside = [role for role in group.roles if role != "reward"]
    where = f"beside {', '.join(beside)}" if beside else "alone"
    normalized = "normalized by its config's mean/std" if cfg.reward.normalize_enable else "raw"
    offloaded = "; weights in host memory outside the reward stage" if cfg.reward.offload else ""
    path = cfg.reward.model_name_or_path or "not set (give --reward.model_name_or_path or --reward.remote_url)"
    return [f"reward model: {path}, {group.num_bundles} ranks in group {index} ({where}), "
            f"rewards {normalized}{offloaded}"]


def render_plan(cfg: RunConfig, gpu_total_gib: float | None = None, is_gpu_assumed: bool = False) -> str:
    """The human report of `hybrid plan`: size, placement groups, sleep modes, not-implemented flags and, given
    `gpu_total_gib` (per-GPU memory; `is_gpu_assumed` when no GPU was found to measure), the memory estimate."""
    placement = make_placement(cfg)
    nodes = math.ceil(placement.num_bundles / cfg.actor.num_gpus_per_node)
    lines = [f"device: {placement.device}; needs {placement.num_gpus} GPUs "
             f"({placement.num_bundles} bundles) on {nodes} node(s) of {cfg.actor.num_gpus_per_node}",
             "placement:"]
    for i, group in enumerate(placement.groups):
        lines += [_group_line(i + 1, group, placement), *node_lines(run_node_blocks(cfg), i)]
    lines += _rollout_line(cfg, placement)
    lines += _reward_lines(cfg, placement) + ring_lines(cfg, placement) + optimizer_lines(cfg)
    vllm_sleep = f"on (level {cfg.vllm.sleep_level})" if cfg.vllm.enable_sleep else "off"
    lines.append(f"sleep: vLLM {vllm_sleep}, DeepSpeed {'on' if cfg.ds.enable_sleep else 'off'}")
    missing = [gap.line for gap in gaps(cfg, placement)]
    lines.append("not implemented yet:" + ("" if missing else " none"))
    lines += [f"  {line}" for line in missing]
    if gpu_total_gib is not None:
        lines += _memory_lines(cfg, gpu_total_gib, is_gpu_assumed)
    return "\n".join(lines)


def _memory_lines(cfg: RunConfig, gpu_total_gib: float, is_gpu_assumed: bool) -> list[str]:
    """The memory section of the plan: skipped on CPU, and a reason instead of terms when a shape is unknown."""
    if cfg.train.device == "cpu":
        return ["memory: the memory plan applies to GPU runs (--train.device cuda); skipped on cpu"]
    try:
        plan = estimate_memory(cfg, gpu_total_gib, make_placement(cfg).group_of("actor").roles)
    except ValueError as err:
        return [f"memory: no estimate: {err}"]
    source = "assumed: no GPU found, an H200" if is_gpu_assumed else "found by nvidia-smi"
    return ([f"memory per GPU of the actor's group, estimated for a {gpu_total_gib:.2f} GiB GPU ({source}):"]
            + [f"  {line}" for line in render_memory(plan)])
