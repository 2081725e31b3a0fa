"""What `hybrid train` refuses of a run's plan before anything starts, and what `hybrid plan` lists as not implemented.

Owns the one list of gaps — flags and values whose behaviour does not exist yet (declared beside the fields in
`config`) and setups without a code path (TP engines on their own GPUs, ring attention over padded rows) — that
`hybrid plan` prints and `hybrid train` refuses in the same words, and the plan's other refusals (kernels, inputs,
the reward model, rings, optimizers, GPUs and memory). Pure functions: no torch, no Ray; the caller counts GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from hybrid_core.config import LIGER_INSTALL_HINT, RunConfig, changed_fields, leaf_values
from hybrid_core.plan.memory import fit_summary, liger_installed
from hybrid_core.plan.model_shapes import model_shape
from hybrid_core.plan.optimizer_rules import optimizer_problems
from hybrid_core.plan.ring import ring_problems, unpacked_ring
from hybrid_core.plan.run_plan import RunPlan, run_plan


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


@dataclass(frozen=True)
class Gap:
    """One thing a configuration asks for that does not exist yet: `hybrid plan` lists `line` under "not implemented
    yet", `hybrid train` refuses with `problem`, which says the same."""

    line: str
    problem: str


def gaps(cfg: RunConfig, plan: RunPlan) -> list[Gap]:
    """The flags, values and setups of this run that have no code path yet, each once for both commands."""
    found = [Gap(line=line, problem=f"flag not implemented yet: {line}") for line in not_implemented(cfg)]
    tp = cfg.vllm.tensor_parallel_size
    if tp > 1 and plan.sync_transport.startswith("process_group:"):
        line = (f"vLLM tensor parallelism (vllm.tensor_parallel_size {tp}) on engines' own GPUs (the weights' "
                "broadcast reaches an engine's process, not its TP workers); add --train.colocate_all (engines × TP "
                "= the actor's GPUs), or use --vllm.tensor_parallel_size 1")
        found.append(Gap(line=line, problem=f"not implemented yet: {line}"))
    found += [Gap(line=line, problem=line) for line in unpacked_ring(cfg)]
    return found


def preflight_problems(cfg: RunConfig, num_gpus_found: int | None, gpu_total_gib: float | None = None) -> list[str]:
    """`plan_problems` of `run_plan(cfg, gpu_total_gib)`, for a caller that holds only a configuration."""
    return plan_problems(cfg, run_plan(cfg, gpu_total_gib), num_gpus_found)


def plan_problems(cfg: RunConfig, plan: RunPlan, num_gpus_found: int | None) -> list[str]:
    """Why `hybrid train` must not start this plan: its gaps, missing hardware and, when the plan was made for a
    GPU's memory, an estimate over it (empty when it may).

    Args:
        num_gpus_found: GPUs visible to the caller (it asks nvidia-smi, `gpu_probe`, or Ray; this module does
            neither); None skips the count (the flow counts the Ray cluster's GPUs itself).
    """
    problems = [gap.problem for gap in gaps(cfg, plan)]
    problems += _reward_url_problems(cfg) + _kernel_problems(cfg) + optimizer_problems(cfg) + _missing_inputs(cfg) \
        + _reward_model_problems(cfg) + ring_problems(cfg, plan.role_ranks) + _memory_problems(plan) \
        + _checkpointed_layer_problems(cfg)
    num_gpus = plan.placement.num_gpus
    if num_gpus_found is not None and num_gpus > num_gpus_found:
        problems.append(f"needs {num_gpus} GPUs, found {num_gpus_found}; run on a machine with more GPUs "
                        "or lower --actor.num_gpus_per_node and --vllm.num_engines")
    return problems


def _memory_problems(plan: RunPlan) -> list[str]:
    """The estimate over the GPU's memory; silent on CPU, without a GPU size, or when a model shape is unknown
    (`hybrid plan` says why; a missing model is `_missing_inputs`')."""
    memory = plan.memory
    if memory is None or memory.fits:
        return []
    return [f"GPU memory: {fit_summary(memory)}, in phase {memory.peak_phase.name}; `hybrid plan` lists every term"]


def _checkpointed_layer_problems(cfg: RunConfig) -> list[str]:
    """A partial checkpointing count within the policy's decoder layers, where its shape is known (an unknown one
    is the memory plan's to report)."""
    wanted = cfg.actor.gradient_checkpointing_layers
    if wanted is None or not cfg.actor.gradient_checkpointing_enable:
        return []
    try:
        layers = model_shape(cfg.actor.model_name_or_path).num_hidden_layers
    except ValueError:
        return []
    if wanted <= layers:
        return []
    return [f"actor.gradient_checkpointing_layers {wanted} is more than the {layers} decoder layers of "
            f"actor.model_name_or_path {cfg.actor.model_name_or_path!r}: give at most {layers}, or drop the flag to "
            "checkpoint every layer"]


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
    if cfg.vllm.kv_cache_dtype != "auto" and cfg.train.device == "cpu" and not cpu_has_fp8_attention():
        problems.append(f"vllm.kv_cache_dtype {cfg.vllm.kv_cache_dtype} on CPU needs x86 with AVX-512 or AMX (vLLM's "
                        "CPU attention): this machine has neither; drop --vllm.kv_cache_dtype")
    return problems


def cpu_has_fp8_attention(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this machine's CPU runs vLLM's fp8 KV cache (AVX-512 or AMX); True where /proc/cpuinfo is missing
    (vLLM then says it at the engine's start)."""
    if not cpuinfo.is_file():
        return True
    flags = set(cpuinfo.read_text().split())
    return bool({"avx512f", "amx_tile"} & flags)


def _reward_url_problems(cfg: RunConfig) -> list[str]:
    """A reward URL is a file or HTTP."""
    url = cfg.reward.remote_url
    if url and not url.endswith(".py") and not url.startswith(("http://", "https://")):
        return [f"reward.remote_url must be a .py file or http(s):// URLs: got {url!r}"]
    return []


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
