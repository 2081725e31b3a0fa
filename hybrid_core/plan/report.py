"""What `hybrid plan` prints: the run's size, its placement groups node by node, the engines × TP and who feeds them,
the reward model, ring groups, optimizers, sleep modes, switches, the flags not implemented yet and the memory
estimate.

Text only: every figure is read from the run's one plan (`run_plan`) and the gaps from `refusals`; nothing here
decides or refuses.
"""
from __future__ import annotations

import math
from typing import Sequence

from hybrid_core.config import RunConfig
from hybrid_core.layout import EngineLayout, NodeBlock, rank_span
from hybrid_core.plan.memory import render_memory
from hybrid_core.plan.optimizer_rules import optimizer_lines
from hybrid_core.plan.placement import GpuGroup, Placement
from hybrid_core.plan.refusals import gaps
from hybrid_core.plan.run_plan import RunPlan, run_plan
from hybrid_core.switches import SWITCHES

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


def _rollout_line(cfg: RunConfig, plan: RunPlan) -> list[str]:
    placement = plan.placement
    if placement.num_engines == 0:
        return ["rollout: no vLLM engines (--vllm.num_engines is not set)"]
    group = placement.group_of("rollout")
    where = "shares the actor's GPUs" if group and "actor" in group.roles else "has its own GPUs"
    runner = {"mp": ", model runner in a child process (vllm.executor_backend mp)",
              "uni": ", model runner in the rollout worker's process (vllm.executor_backend uni)"}
    core = ", engine core in a process of its own" if cfg.vllm.engine_core_process else ""
    return [f"rollout: {placement.num_engines} vLLM engines × TP {placement.tensor_parallel_size}, {where}, "
            f"gpu_memory_utilization {cfg.vllm.gpu_memory_utilization:g}{runner.get(cfg.engine_executor, '')}{core}",
            *_kv_cache_lines(cfg), *engine_lines(plan.engines, by_cuda_ipc=plan.sync_transport == "cuda_ipc")]


def _kv_cache_lines(cfg: RunConfig) -> list[str]:
    """The KV cache's element type when it is not the model's, and what that asks of the update."""
    if cfg.vllm.kv_cache_dtype == "auto":
        return []
    corrected = "the IS correction weighs the difference" if cfg.algo.advantage.is_correction_enable else \
        "nothing corrects for that (--algo.advantage.is_correction_enable would)"
    return [f"KV cache: {cfg.vllm.kv_cache_dtype} (e4m3, one byte a value, scale 1): the "
            f"rollout samples from a slightly different policy than the trainer's; {corrected}"]


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


def _ring_lines(cfg: RunConfig, plan: RunPlan) -> list[str]:
    """Ring attention: the rings of each ringed role (nothing without a ring)."""
    size = cfg.ds.ring_attn_size
    if size == 1:
        return []
    lines = [f"ring attention: each packed sample split over {size} ranks, "
             f"{cfg.ds.ring_attn_head_stride} K/V head(s) all-gathered at a time"]
    for row in plan.rows:
        if row.ring_groups:
            groups = " ".join(str(list(group)) for group in row.ring_groups)
            lines.append(f"  {row.role}: ring groups {groups} ({len(row.ring_groups)} data-parallel group(s))")
    return lines


def _switch_lines(plan: RunPlan) -> list[str]:
    """The switches that differ from their defaults, set by flag or by their variable (nothing otherwise)."""
    changed = [f"ds.{name} {value}" for name, value in plan.switches.items() if value != SWITCHES[name].choices[0]]
    return [f"switches: {', '.join(changed)}"] if changed else []


def _sleep_line(plan: RunPlan) -> str:
    vllm_sleep = "off" if plan.sleep.vllm_level is None else f"on (level {plan.sleep.vllm_level})"
    return f"sleep: vLLM {vllm_sleep}, DeepSpeed {'on' if plan.sleep.deepspeed else 'off'}"


def _async_lines(cfg: RunConfig) -> list[str]:
    if not cfg.train.async_enable:
        return []
    q, r = cfg.train.async_queue_size, cfg.rollout
    if not cfg.is_oversampling:
        return [f"async: {q} batch(es) generated ahead; batch k by policy version max(0, k - {q + 1}), staleness "
                f"at most {q}; the engines generate while the DeepSpeed models train"]
    overlap = ("the engines generate while the DeepSpeed models train" if q > 1 else
               "with train.async_queue_size 1 no generation overlaps training (batch k starts after step k - 1's sync)")
    return [f"async: oversampling {r.vllm_generate_batch_size} prompts a batch for {r.batch_size} groups a step; batch "
            f"k by policy version max(0, k - {q}), one step less ahead, so its groups are at most {q - 1} stale at "
            f"step k and its surplus at most {q} at step k + 1; {overlap}"]


def render_plan(cfg: RunConfig, gpu_total_gib: float | None = None, is_gpu_assumed: bool = False) -> str:
    """The human report of `hybrid plan`: `run_plan(cfg, gpu_total_gib)` as `render_run_plan` prints it."""
    return render_run_plan(cfg, run_plan(cfg, gpu_total_gib), is_gpu_assumed)


def render_run_plan(cfg: RunConfig, plan: RunPlan, is_gpu_assumed: bool = False) -> str:
    """Size, placement groups, engines, reward model, rings, optimizers, sleep modes, the gaps and, when the plan
    was made for a GPU's memory (`is_gpu_assumed` when no GPU was found to measure), the memory estimate."""
    placement = plan.placement
    nodes = math.ceil(placement.num_bundles / cfg.actor.num_gpus_per_node)
    lines = [f"device: {placement.device}; needs {placement.num_gpus} GPUs "
             f"({placement.num_bundles} bundles) on {nodes} node(s) of {cfg.actor.num_gpus_per_node}",
             "placement:"]
    for i, group in enumerate(placement.groups):
        lines += [_group_line(i + 1, group, placement), *node_lines(plan.blocks, i)]
    lines += _rollout_line(cfg, plan) + _reward_lines(cfg, placement) + _ring_lines(cfg, plan)
    lines += optimizer_lines(cfg) + [_sleep_line(plan)] + _async_lines(cfg) + _switch_lines(plan)
    missing = [gap.line for gap in gaps(cfg, plan)]
    lines.append("not implemented yet:" + ("" if missing else " none"))
    lines += [f"  {line}" for line in missing]
    return "\n".join(lines + _memory_lines(plan, is_gpu_assumed))


def _memory_lines(plan: RunPlan, is_gpu_assumed: bool) -> list[str]:
    """The memory section of the plan: none without a GPU size, skipped on CPU, and a reason instead of terms when a
    shape is unknown."""
    if plan.gpu_total_gib is None:
        return []
    if plan.device == "cpu":
        return ["memory: the memory plan applies to GPU runs (--train.device cuda); skipped on cpu"]
    if plan.memory is None:
        return [f"memory: no estimate: {plan.memory_error}"]
    source = "assumed: no GPU found, an H200" if is_gpu_assumed else "found by nvidia-smi"
    return ([f"memory per GPU of the actor's group, estimated for a {plan.gpu_total_gib:.2f} GiB GPU ({source}):"]
            + [f"  {line}" for line in render_memory(plan.memory)])
