"""Where every role runs, and what `hybrid train` checks of the plan before anything starts.

Owns the refusal of flags whose behaviour does not exist yet (declared beside the fields in `config`), the placement
of roles on GPU bundles (mirroring OpenRLHF's placement groups) and the plan's problems; the memory estimate is
`plan.memory`'s, the text `plan.report`'s. Pure functions of a `RunConfig`: no torch, no Ray; the caller counts GPUs
(`gpu_probe`) and creates the placement groups.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from hybrid_core.config import LIGER_INSTALL_HINT, RunConfig, changed_fields, leaf_values
from hybrid_core.layout import EngineLayout, NodeBlock, cpu_per_bundle, node_blocks
from hybrid_core.plan.memory import estimate_memory, fit_summary, liger_installed
from hybrid_core.plan.optimizer_rules import optimizer_problems
from hybrid_core.plan.ring import ring_problems


def implemented_paths(model: type[BaseModel] = RunConfig, prefix: str = "") -> frozenset[str]:
    """Dotted paths of every field whose behaviour exists, from each block's `IMPLEMENTED`."""
    paths: set[str] = set()
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            paths |= implemented_paths(info.annotation, f"{prefix}{name}.")
        elif name in model.IMPLEMENTED:
            paths.add(f"{prefix}{name}")
    return frozenset(paths)


def implemented_values(model: type[BaseModel] = RunConfig, prefix: str = "") -> dict[str, frozenset]:
    """Dotted path → the values that work yet, for choice fields where only some do (`IMPLEMENTED_VALUES`)."""
    values = {f"{prefix}{name}": allowed for name, allowed in model.IMPLEMENTED_VALUES.items()}
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            values |= implemented_values(info.annotation, f"{prefix}{name}.")
    return values


# Which fields and values have behaviour is declared beside the fields, in config.py.
IMPLEMENTED_FLAGS: frozenset[str] = implemented_paths()
IMPLEMENTED_VALUES: dict[str, frozenset[str]] = implemented_values()

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


def run_node_blocks(cfg: RunConfig) -> tuple[NodeBlock, ...]:
    """The run's placement groups, one per node of each group (`layout.node_blocks`), in `role_bundles`' bundle order."""
    return node_blocks([(g.num_bundles, g.per_node or math.ceil(g.num_bundles / g.num_nodes))
                        for g in make_placement(cfg).groups])


def role_bundles(cfg: RunConfig) -> tuple[int, dict[str, tuple[int, float]]]:
    """The run's bundle count and each role's (bundle index of its rank 0, share): the groups of `make_placement`
    one after another, each role asking its share of its group's bundle. On CPU each node's bundles split one
    logical CPU (vLLM and torch bind their own threads); without vllm.num_engines the engine sits beside the
    actor."""
    layout = make_placement(cfg)
    num_bundles = max(1, layout.num_bundles)
    bundle_cpus = cpu_per_bundle(run_node_blocks(cfg))
    bundles, offset = {}, 0
    for group in layout.groups:
        # rounded down: the roles' shares must add up to no more than their bundle, or one is never placed
        cpu_share = math.floor(bundle_cpus / len(group.roles) * 1000) / 1000
        share = group.gpu_share if cfg.train.device == "cuda" else cpu_share
        bundles |= {role: (offset, share) for role in group.roles}
        offset += group.num_bundles
    bundles.setdefault("rollout", bundles["actor"])
    return num_bundles, bundles


def sync_transport(cfg: RunConfig) -> str:
    """How weights reach the rollout engine: Ray's object store (colocated on CPU), CUDA IPC (colocated on a GPU)
    or a process group's broadcast, `process_group:<backend>` (distributed mode: the engine has its own devices)."""
    group = make_placement(cfg).group_of("rollout")
    if group is None or "actor" in group.roles:
        return "cuda_ipc" if cfg.train.device == "cuda" else "object_store"
    return "process_group:" + ("gloo" if cfg.train.device == "cpu" else cfg.vllm.sync_backend)


def engine_layout(cfg: RunConfig) -> EngineLayout:
    """The run's engines and their TP workers' bundles (see `layout.EngineLayout`), from the rollout's first bundle."""
    return EngineLayout(num_engines=cfg.vllm.num_engines or 1, tensor_parallel_size=cfg.vllm.tensor_parallel_size,
                        first_bundle=role_bundles(cfg)[1]["rollout"][0])


def not_implemented(cfg: RunConfig) -> list[str]:
    """Every set flag whose behaviour does not exist yet, and every choice whose value is not implemented.

    Lines read like `--ds.packing_samples (set to True)`.
    """
    values = leaf_values(cfg)
    lines = [f"--{path} (set to {values[path]!r})" for path in changed_fields(cfg) if path not in IMPLEMENTED_FLAGS]
    for path, allowed in IMPLEMENTED_VALUES.items():
        if values[path] not in allowed:
            lines.append(f"--{path} (value {values[path]!r}; implemented: {', '.join(sorted(allowed))})")
    return lines


def preflight_problems(cfg: RunConfig, num_gpus_found: int | None, gpu_total_gib: float | None = None) -> list[str]:
    """Why `hybrid train` must not start: unimplemented flags, missing hardware and, on GPUs, a memory estimate
    over the GPU's size (empty when it may).

    Args:
        num_gpus_found: GPUs visible to the caller (it asks nvidia-smi, `gpu_probe`, or Ray; this module does
            neither); None skips the count (the flow counts the Ray cluster's GPUs itself).
        gpu_total_gib: per-GPU memory found (`gpu_probe.gpu_memory_gib`); None skips the memory check.
    """
    problems = [f"flag not implemented yet: {line}" for line in not_implemented(cfg)]
    placement = make_placement(cfg)
    problems += _slice_problems(cfg) + _kernel_problems(cfg) + optimizer_problems(cfg) + _missing_inputs(cfg) \
        + _reward_model_problems(cfg) + ring_problems(cfg, placement) + _memory_problems(cfg, gpu_total_gib)
    num_gpus = placement.num_gpus
    if num_gpus_found is not None and num_gpus > num_gpus_found:
        problems.append(f"needs {num_gpus} GPUs, found {num_gpus_found}; run on a machine with more GPUs "
                        "or lower --actor.num_gpus_per_node and --vllm.num_engines")
    return problems


def _memory_problems(cfg: RunConfig, gpu_total_gib: float | None) -> list[str]:
    """The estimate over the GPU's memory; silent on CPU, without a GPU size, or when a model shape is unknown."""
    if cfg.train.device != "cuda" or gpu_total_gib is None:
        return []
    try:
        plan = estimate_memory(cfg, gpu_total_gib, make_placement(cfg).group_of("actor").roles)
    except ValueError:  # `hybrid plan` says why; the missing model is reported by _missing_inputs
        return []
    if plan.fits:
        return []
    return [f"GPU memory: {fit_summary(plan)}, in phase {plan.peak_phase.name}; `hybrid plan` lists every term"]


def _kernel_problems(cfg: RunConfig) -> list[str]:
    """vLLM's attention backends by name are its CUDA ones (its CPU build has one of its own); Liger's kernels are
    Triton: CUDA only, and an optional package."""
    problems = []
    if cfg.vllm.attention_backend and cfg.train.device != "cuda":
        problems.append(f"vllm.attention_backend {cfg.vllm.attention_backend} is one of vLLM's CUDA backends: got "
                        f"train.device {cfg.train.device}, whose vLLM build has its own; drop "
                        "--vllm.attention_backend")
    if cfg.ds.use_liger_kernel and cfg.train.device != "cuda":
        problems.append(f"ds.use_liger_kernel needs CUDA (Liger's kernels are Triton): got train.device "
                        f"{cfg.train.device}; drop --ds.use_liger_kernel")
    elif cfg.ds.use_liger_kernel and not liger_installed():
        problems.append(f"ds.use_liger_kernel needs the liger-kernel package: {LIGER_INSTALL_HINT}")
    return problems


def _slice_problems(cfg: RunConfig) -> list[str]:
    """Shapes of runs whose code path does not exist yet: TP engines on GPUs of their own (the weights' broadcast
    reaches an engine's process, not its TP workers); a reward URL that is neither a file nor HTTP."""
    problems, tp = [], cfg.vllm.tensor_parallel_size
    if tp > 1 and sync_transport(cfg).startswith("process_group:"):
        problems.append(f"not implemented yet: vLLM tensor parallelism (vllm.tensor_parallel_size {tp}) on engines' "
                        "own GPUs (the weights' broadcast reaches an engine's process, not its TP workers); add "
                        "--train.colocate_all (engines × TP = the actor's GPUs), or use --vllm.tensor_parallel_size 1")
    url = cfg.reward.remote_url
    if url and not url.endswith(".py") and not url.startswith(("http://", "https://")):
        problems.append(f"reward.remote_url must be a .py file or http(s):// URLs: got {url!r}")
    return problems


def _missing_inputs(cfg: RunConfig) -> list[str]:
    """Inputs that must exist before anything starts: local paths that are there, or hub names (this checks files
    only, never the network; the preflight checks a hub model against the cache when HF_HUB_OFFLINE is set)."""
    from hybrid_core.data.hub import is_hub_name

    checks = [("actor.model_name_or_path", cfg.actor.model_name_or_path,
               "a local HF model directory or a hub model id", True),
              ("data.prompt_dataset", cfg.data.prompt_dataset,
               "a local JSONL/JSON/CSV/Parquet/Arrow file, a dataset folder or a hub dataset name", True)]
    if cfg.eval.dataset is not None:
        checks.append(("eval.dataset", cfg.eval.dataset, "local files, dataset folders or hub dataset names", True))
    if cfg.reward.remote_url is not None:  # neither it nor a reward model: `_reward_model_problems`
        checks.append(("reward.remote_url", cfg.reward.remote_url, "a .py file defining reward_func", False))
    problems = []
    for field, value, what, takes_hub_names in checks:
        if value is None:
            problems.append(f"{field} is required: got None; give {what}")
            continue
        entries = [v.strip() for v in value.split(",")] if field.endswith("dataset") else [value]
        for entry in entries:
            if entry.startswith(("http://", "https://")) or Path(entry).exists():
                continue
            if not (takes_hub_names and is_hub_name(entry)):
                problems.append(f"{field} does not exist: got {entry!r}; give {what}")
    return problems


def _reward_model_problems(cfg: RunConfig) -> list[str]:
    """The reward model is a local directory (its value head is the preflight's to check), and it scores alone:
    OpenRLHF 0.11 creates no RewardModelActor when reward.remote_url is set (`train_ppo_ray.py`), so a model given
    beside a URL would silently do nothing."""
    path, url = cfg.reward.model_name_or_path, cfg.reward.remote_url
    if path is None and url is None and cfg.train.agent_func_path is None:
        return ["reward.remote_url or reward.model_name_or_path is required: got neither; give a .py file defining "
                "reward_func, reward server URLs, or a reward model directory"]
    if path is None:
        return []
    if url is not None:
        return [f"reward.model_name_or_path {path!r} is never used with reward.remote_url {url!r}: as in OpenRLHF "
                "0.11 the remote reward (or reward function) replaces the reward model, and nothing combines the "
                "two; drop --reward.model_name_or_path, or drop --reward.remote_url to score with the model"]
    if not Path(path).is_dir():
        return [f"reward.model_name_or_path does not exist: got {path!r}; give a local HF directory holding the "
                "reward model (a backbone and a value head; `make model` builds data/tiny-qwen3-rm)"]
    return []
