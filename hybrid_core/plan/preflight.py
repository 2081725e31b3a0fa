"""Everything a run must pass before anything starts, as one list of problems: the plan's (unimplemented flags,
placement, hardware, memory) and the inputs' (the prompt datasets, the reward file or servers, the agent file, the
model directories or hub ids, the store root, and the run directory: another configuration under an existing run
id, a damaged manifest, data without one).

`hybrid train` runs it before Ray or Prefect start, and the `rl-train` flow runs it again as its first task, so
every entry point (CLI, deployment, `rl_train()`, a flow-run retry, `ray job submit`) refuses the same problems with
the same message. Local checks take well under a second; a reward server that does not answer its one-sample
probe, about `reward.probe_timeout_s`. It starts nothing.
"""
from __future__ import annotations

import json
from pathlib import Path

from hybrid_core.config import RunConfig
from hybrid_core.data.eval_tables import eval_metric_keys, metric_key_name
from hybrid_core.data.hub import dataset_hub_problems, model_hub_problems
from hybrid_core.data.prompt_check import prompt_dataset_problems
from hybrid_core.data.rollout_store import MANIFEST, ManifestError, RolloutStore, store_root_problems
from hybrid_core.data.run_lease import LEASE
from hybrid_core.plan.refusals import plan_problems
from hybrid_core.plan.run_plan import RunPlan, run_plan
from hybrid_core.rewards.agents import agent_file_problems
from hybrid_core.rewards.remote_http import probe_problems
from hybrid_core.rewards.reward_func import reward_file_problems
from hybrid_core.types import PermanentError

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "model.safetensors.index.json", "pytorch_model.bin.index.json")


class PreflightError(PermanentError, ValueError):
    """The run cannot start; `problems` holds one message per problem."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__(refusal(self.problems))


def refusal(problems: list[str]) -> str:
    """The one message every entry point shows."""
    return "hybrid train cannot start:\n" + "\n".join(f"  - {problem}" for problem in problems)


def model_problems(path: str | None, field: str = "actor.model_name_or_path") -> list[str]:
    """A local model directory must hold a config.json and weights (its existence is the plan's to check); a hub
    id must be in the local cache when HF_HUB_OFFLINE is set."""
    model = Path(path) if path else None
    if model is None or not model.is_dir():
        return model_hub_problems(field, path)
    missing = [what for what, present in (("config.json", (model / "config.json").is_file()),
                                          ("weights (*.safetensors or *.bin)",
                                           any(next(model.glob(p), None) for p in WEIGHT_FILES))) if not present]
    if not missing:
        return []
    return [f"{field} {path!r} holds no {' and no '.join(missing)}; give a Hugging Face model directory "
            "(save_pretrained output) or a hub model id"]


def safetensors_names(file: Path) -> set[str]:
    """The tensor names of a .safetensors file, from its header (8 bytes of length, then JSON) alone."""
    with file.open("rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return set(header) - {"__metadata__"}


def value_head_problems(path: str | None, value_head_prefix: str) -> list[str]:
    """A reward model directory holds its value head: `<prefix>.weight`, the prefix from its config.json's
    `value_head_prefix` (as OpenRLHF's loader reads it) or `ds.value_head_prefix`. Safetensors checkpoints only
    (a pytorch_model.bin is checked when the worker loads it)."""
    model = Path(path) if path else None
    files = sorted(model.glob("*.safetensors")) if model and (model / "config.json").is_file() else []
    if not files:
        return []
    prefix = json.loads((model / "config.json").read_text()).get("value_head_prefix", value_head_prefix)
    key = f"{prefix}.weight"
    if any(key in safetensors_names(file) for file in files):
        return []
    source = "its config.json's value_head_prefix" if prefix != value_head_prefix else "ds.value_head_prefix"
    return [f"reward.model_name_or_path {path!r} holds no value head {key!r} ({source} {prefix!r}): give a reward "
            "model (a sequence-classification checkpoint with one label, or OpenRLHF's train_rm output), or name "
            "its head with --ds.value_head_prefix"]


def lora_target_problems(cfg: RunConfig) -> list[str]:
    """Every `ds.lora.target_modules` name is a module of the local model that holds weights (a linear layer's
    `...<name>.weight`); `all-linear` is PEFT's every linear layer but the output head. Safetensors checkpoints
    only (a hub model is checked when the actor wraps it)."""
    path, targets = cfg.actor.model_name_or_path, cfg.ds.lora.target_modules
    model = Path(path) if path else None
    files = sorted(model.glob("*.safetensors")) if cfg.uses_lora and model and model.is_dir() else []
    if not files or targets == ["all-linear"]:
        return []
    modules = {name.rsplit(".", 1)[0].rsplit(".", 1)[-1] for file in files for name in safetensors_names(file)}
    missing = [target for target in targets if target not in modules]
    if not missing:
        return []
    return [f"ds.lora.target_modules names {missing} that actor.model_name_or_path {path!r} lacks; its modules "
            f"with weights are {sorted(modules)}: pick from them, or use --ds.lora.target_modules all-linear"]


def input_problems(cfg: RunConfig) -> list[str]:
    """The inputs can feed the run: dataset rows, the reward file or servers, the agent file, the model directory."""
    d, url = cfg.data, cfg.reward.remote_url
    problems = model_problems(cfg.actor.model_name_or_path)
    problems += model_problems(cfg.critic.model_name_or_path, "critic.model_name_or_path")
    problems += model_problems(cfg.reward.model_name_or_path, "reward.model_name_or_path")
    problems += value_head_problems(cfg.reward.model_name_or_path, cfg.ds.value_head_prefix)
    problems += lora_target_problems(cfg)
    sources = [name.strip() for name in (d.prompt_dataset or "").split(",")]
    for source in sources:  # local sources are read here; hub datasets when the rollout worker loads them
        if source and Path(source).exists():  # a mix's step size is checked on the mix, by the worker
            batch_size = cfg.rollout.batch_size if len(sources) == 1 else 0
            problems += prompt_dataset_problems(source, d.input_key, d.label_key, batch_size, d.max_samples,
                                                d.prompt_split)
        elif source:
            problems += dataset_hub_problems("data.prompt_dataset", source)
    for source in [name.strip() for name in (cfg.eval.dataset or "").split(",")]:  # every row is evaluated
        if source and Path(source).exists():
            problems += prompt_dataset_problems(source, d.input_key, d.label_key, 0, d.max_samples, cfg.eval.split,
                                                field="eval.dataset")
        elif source:
            problems += dataset_hub_problems("eval.dataset", source)
    if url and url.endswith(".py"):
        problems += reward_file_problems(url)
    elif url and url.startswith(("http://", "https://")) and cfg.reward.probe_timeout_s > 0:
        problems += probe_problems(url, cfg.reward.timeout_s, cfg.reward.probe_timeout_s)
    if cfg.train.agent_func_path is not None:
        problems += agent_file_problems(cfg.train.agent_func_path)
    return problems


def best_metric_problems(cfg: RunConfig) -> list[str]:
    """`ckpt.best_metric_key` names a figure the run's evaluations will have (found before the first checkpoint,
    not at it); '' and 'none' need none, and a key without evaluations is the plan's to refuse."""
    key = cfg.ckpt.best_metric_key
    if key in ("", "none") or not cfg.eval.dataset or cfg.eval.steps <= 0:
        return []
    sources = [name.strip() for name in cfg.eval.dataset.split(",") if name.strip()]
    produced = eval_metric_keys(sources, cfg.eval.n_samples_per_prompt)
    if metric_key_name(key) in produced:
        return []
    return [f"ckpt.best_metric_key {key!r} is not a figure the evaluation of eval.dataset {cfg.eval.dataset!r} "
            f"gives: it gives {produced}; pass one of them, or leave it unset for the first *_pass1"]


def run_dir_problems(cfg: RunConfig, run_dir: str, must_exist: bool = False) -> list[str]:
    """The run directory can hold this run: an existing run was started with this configuration (the fields a
    resume may change aside), its manifest reads, and a directory with data but no manifest is never reused."""
    from hybrid_core.flags import config_differences

    store = RolloutStore(run_dir)
    try:
        manifest = store.manifest()
    except ManifestError as err:
        return [str(err)]
    run_id = run_dir.rstrip("/").rsplit("/", 1)[-1]
    if "config" in manifest:
        if differing := config_differences(manifest["config"], cfg):
            return [f"run {run_id} was started with another configuration; refusing to resume: " + "; ".join(differing)
                    + ". Start a new --run_id or restore the saved values"]
        return []
    if store.exists(MANIFEST):
        return [str(store.damaged("it holds no configuration"))]
    names = sorted(p.rsplit("/", 1)[-1] for p in store.fs.ls(store.root, detail=False)) \
        if store.fs.exists(store.root) else []
    if leftovers := [name for name in names if name != LEASE]:
        return [f"{run_dir} holds {', '.join(leftovers)} but no manifest.json, so it is not a run that can be "
                "resumed, and it is never overwritten: restore its manifest.json, move the directory away, or choose "
                "another --run_id"]
    if must_exist:
        return [f"resume: no run to resume at {run_dir} (no manifest.json); start it without --resume"]
    return []


def check_run(cfg: RunConfig, run_dir: str, num_gpus: int | None, gpu_total_gib: float | None,
              must_exist: bool = False, can_reach_store: bool = True) -> tuple[RunPlan, list[str]]:
    """The run's plan, made here once for this GPU's memory, and every reason the run cannot start (empty when it
    can). `can_reach_store` False skips the store's checks (its credentials come from a Prefect Secret block that
    only the flow loads)."""
    plan = run_plan(cfg, gpu_total_gib)
    problems = plan_problems(cfg, plan, num_gpus) + input_problems(cfg) + best_metric_problems(cfg)
    if not can_reach_store:
        return plan, problems
    store = store_root_problems(cfg.store.root)
    return plan, problems + (store or run_dir_problems(cfg, run_dir, must_exist))


def run_problems(cfg: RunConfig, run_dir: str, num_gpus: int | None, gpu_total_gib: float | None,
                 must_exist: bool = False, can_reach_store: bool = True) -> list[str]:
    """`check_run`'s problems alone."""
    return check_run(cfg, run_dir, num_gpus, gpu_total_gib, must_exist, can_reach_store)[1]
