"""Cross-field rules of the run configuration: each helper returns its broken rules as messages that name both
fields, the values and the fix; `rule_problems` gathers them all so one error lists everything.

Owns the rules only; the fields and their bounds are in `config.py`.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hybrid_core.config import RunConfig

GROUP_ESTIMATORS = ("rloo", "reinforce_baseline", "group_norm", "dr_grpo")


def rule_problems(cfg: RunConfig) -> list[str]:
    return [*_sleep_problems(cfg), *_estimator_problems(cfg), *_filtering_problems(cfg),
            *_colocation_problems(cfg), *_value_problems(cfg), *_batching_problems(cfg), *_secret_problems(cfg),
            *_eval_problems(cfg), *_data_problems(cfg), *_correction_problems(cfg), *_executor_problems(cfg),
            *_agent_problems(cfg), *_async_problems(cfg), *_lora_problems(cfg), *_ema_problems(cfg),
            *_checkpointing_problems(cfg)]


def _async_problems(cfg: RunConfig) -> list[str]:
    """Partial rollout exists only in async mode; async mode's engines keep GPUs of their own, so weights reach them
    by broadcast, never as the CUDA IPC buckets a child-process engine needs."""
    t, problems = cfg.train, _oversampling_problems(cfg)
    if t.partial_rollout_enable and not t.async_enable:
        problems.append("train.partial_rollout_enable needs train.async_enable (in-flight generation pauses for a "
                        "weight push only while the engines generate ahead): add --train.async_enable or drop "
                        "--train.partial_rollout_enable")
    if t.partial_rollout_enable and t.agent_func_path:
        problems.append(f"train.partial_rollout_enable pauses single-turn generation between engine steps; an "
                        f"agent's episodes (train.agent_func_path {t.agent_func_path!r}) do not pause: drop "
                        "--train.partial_rollout_enable or --train.agent_func_path")
    if t.partial_rollout_enable and cfg.uses_lora:
        problems.append(f"train.partial_rollout_enable with ds.lora.rank {cfg.ds.lora.rank}: a LoRA sync activates a new "
                        "adapter for new requests, and requests paused mid-batch hold the old one; drop "
                        "--train.partial_rollout_enable or --ds.lora.rank")
    ipc_engine = (cfg.vllm.executor_backend == "mp" and t.device == "cuda") or cfg.vllm.engine_core_process
    if t.async_enable and ipc_engine:
        problems.append("vllm.executor_backend 'mp' and vllm.engine_core_process take CUDA IPC buckets from an actor "
                        "on the same GPU; train.async_enable gives the engines GPUs of their own (weights arrive by "
                        "broadcast): drop --vllm.executor_backend/--vllm.engine_core_process or --train.async_enable")
    return problems


def _oversampling_problems(cfg: RunConfig) -> list[str]:
    """Oversampling (G = rollout.vllm_generate_batch_size > B = rollout.batch_size) carries a batch's passing groups
    that its step does not train to the next step, so it needs async mode (batches generated ahead) and something
    that drops groups: without dynamic filtering every batch passes G groups where B are trained, and past the
    first steps the G − B left over would only expire. G above 2·B is allowed: at a pass rate p, G ≈ B / p."""
    size, batch_size = cfg.rollout.vllm_generate_batch_size, cfg.rollout.batch_size
    if size is None or size == batch_size:
        return []
    if size < batch_size:
        return [f"rollout.vllm_generate_batch_size {size} < rollout.batch_size {batch_size}: a step's prompts are "
                "generated in one call; give more than rollout.batch_size to oversample (with --train.async_enable "
                "and --algo.dynamic_filtering_enable), or drop --rollout.vllm_generate_batch_size"]
    problems = []
    if not cfg.train.async_enable:
        problems.append(f"rollout.vllm_generate_batch_size {size} > rollout.batch_size {batch_size} oversamples, "
                        "which needs train.async_enable: add --train.async_enable or drop "
                        "--rollout.vllm_generate_batch_size")
    if not cfg.algo.dynamic_filtering_enable:
        problems.append(f"rollout.vllm_generate_batch_size {size} > rollout.batch_size {batch_size} oversamples to "
                        "replace the groups dynamic filtering drops, without a refill round: got "
                        f"algo.dynamic_filtering_enable=False, so {size - batch_size} groups a step would be generated "
                        "only to expire; add --algo.dynamic_filtering_enable or drop "
                        "--rollout.vllm_generate_batch_size")
    return problems


def _lora_problems(cfg: RunConfig) -> list[str]:
    """What a LoRA policy does not support here, each with its reason (`--ds.load_in_4bit` stays unimplemented)."""
    if not cfg.uses_lora:
        return []
    rank = cfg.ds.lora.rank
    unsupported = [
        (cfg.ds.zero_stage == 3, f"ds.zero_stage 3 with ds.lora.rank {rank}: ZeRO-3 would partition the frozen base "
         "and gather it at every forward, while the adapters it could partition are small; use --ds.zero_stage 2"),
        (cfg.ds.ring_attn_size > 1, f"ds.ring_attn_size {cfg.ds.ring_attn_size} with ds.lora.rank {rank}: ring "
         "attention is not built for PEFT-wrapped policies; drop --ds.ring_attn_size or --ds.lora.rank"),
        (cfg.uses_critic, f"algo.advantage.estimator 'gae' with ds.lora.rank {rank}: a critic beside a LoRA policy is "
         "not built; choose a critic-free estimator (rloo, reinforce_baseline, group_norm, dr_grpo, reinforce)"),
        (cfg.vllm.sleep_level == 2, f"vllm.sleep_level 2 with ds.lora.rank {rank}: level 2 drops the base weights, "
         "and a LoRA sync sends only the adapter, so nothing would bring the base back; use --vllm.sleep_level 1"),
        (cfg.vllm.tensor_parallel_size > 1 or cfg.vllm.engine_core_process or cfg.vllm.executor_backend == "mp",
         f"ds.lora.rank {rank} needs rollout engines of one worker in the rollout worker's process (got "
         f"vllm.tensor_parallel_size {cfg.vllm.tensor_parallel_size}, vllm.engine_core_process "
         f"{cfg.vllm.engine_core_process}, vllm.executor_backend {cfg.vllm.executor_backend!r}): the adapter is "
         "loaded there; drop those flags"),
    ]
    return [message for is_broken, message in unsupported if is_broken]


def _checkpointing_problems(cfg: RunConfig) -> list[str]:
    layers = cfg.actor.gradient_checkpointing_layers
    if layers is None or cfg.actor.gradient_checkpointing_enable:
        return []
    return [f"actor.gradient_checkpointing_layers {layers} says how many layers checkpointing recomputes, and "
            "actor.gradient_checkpointing_enable is off: add --actor.gradient_checkpointing_enable or drop "
            "--actor.gradient_checkpointing_layers"]


def _ema_problems(cfg: RunConfig) -> list[str]:
    if cfg.train.enable_ema and cfg.ds.zero_stage == 3:
        return ["train.enable_ema with ds.zero_stage 3: each rank holds a partition of the weights, and the EMA (kept "
                "whole by rank 0) would gather every parameter at each optimizer step; use --ds.zero_stage 2"]
    return []


def _agent_problems(cfg: RunConfig) -> list[str]:
    """An agent's step rewards are the episode's reward: OpenRLHF 0.11 builds the agent executor and silently drops
    a remote reward or reward model given beside it, so both would do nothing here too."""
    agent = cfg.train.agent_func_path
    if agent is None:
        return []
    unused = [("reward.remote_url", cfg.reward.remote_url), ("reward.model_name_or_path",
                                                             cfg.reward.model_name_or_path)]
    return [f"{field} {value!r} is never used with train.agent_func_path {agent!r}: the agent's step rewards are "
            f"the episode's reward, and nothing combines the two; drop --{field}, or drop --train.agent_func_path "
            "to score single-turn responses" for field, value in unused if value is not None]


def _executor_problems(cfg: RunConfig) -> list[str]:
    """`vllm.executor_backend` chooses between vLLM's two ways of running one TP worker; several have theirs. A
    worker in a child process takes GPU weights by CUDA IPC (colocated); a broadcast lands in the parent's memory."""
    backend, tp = cfg.vllm.executor_backend, cfg.vllm.tensor_parallel_size
    problems = []
    if backend is not None and tp > 1:
        problems.append(f"vllm.executor_backend {backend!r} is for engines of one TP worker: got "
                        f"vllm.tensor_parallel_size {tp} (its workers run as Ray actors on GPUs, as child processes "
                        "on CPU); drop --vllm.executor_backend")
    if backend == "mp" and cfg.train.device == "cuda" and not cfg.train.colocate_all:
        problems.append("vllm.executor_backend 'mp' on GPUs needs train.colocate_all (the child process opens the "
                        "actor's CUDA IPC weight buckets itself): got train.colocate_all=False; add "
                        "--train.colocate_all or drop --vllm.executor_backend")
    return problems + _engine_core_problems(cfg)


def _engine_core_problems(cfg: RunConfig) -> list[str]:
    """An engine core in a process of its own takes weights only as CUDA IPC buckets, which any process on the GPU
    opens (colocated); a broadcast or the CPU build's in-place reload lands in the rollout worker's memory."""
    if not cfg.vllm.engine_core_process:
        return []
    tp = cfg.vllm.tensor_parallel_size
    if cfg.train.device != "cuda" or not cfg.train.colocate_all or tp > 1:
        return [f"vllm.engine_core_process needs GPUs, train.colocate_all and vllm.tensor_parallel_size 1 (its "
                f"weights come as CUDA IPC buckets): got train.device={cfg.train.device!r}, train.colocate_all="
                f"{cfg.train.colocate_all}, vllm.tensor_parallel_size {tp}; drop --vllm.engine_core_process"]
    return []


def _correction_problems(cfg: RunConfig) -> list[str]:
    """Importance-sampling correction weighs the update by the engine's own logprobs of its samples."""
    if cfg.algo.advantage.is_correction_enable and cfg.rollout.logprobs is False:
        return ["algo.advantage.is_correction_enable needs the engine's logprobs: got rollout.logprobs=False; drop "
                "--rollout.no_logprobs or --algo.advantage.is_correction_enable"]
    return []


def _secret_problems(cfg: RunConfig) -> list[str]:
    """A W&B key in the configuration would be stored with it (config.yaml, the manifest, Prefect's database)."""
    key = cfg.logger.wandb.key
    if key is None or key == "offline":
        return []
    return [f"logger.wandb.key holds an API key ({len(key)} characters, not shown): in a config file or a flow "
            "parameter it would be stored with the run's configuration; give it as --logger.wandb.key on the hybrid "
            "train command line (moved into WANDB_API_KEY), set WANDB_API_KEY in the run's environment, or name a "
            "Prefect Secret block with --logger.wandb.secret_block"]


def _sleep_problems(cfg: RunConfig) -> list[str]:
    problems = []
    if cfg.vllm.enable_sleep and cfg.train.async_enable:
        problems.append("vllm.enable_sleep cannot be combined with train.async_enable: async mode keeps vLLM "
                        "generating; drop --vllm.enable_sleep or --train.async_enable")
    if cfg.vllm.enable_sleep and not cfg.train.colocate_all:
        problems.append("vllm.enable_sleep requires train.colocate_all: got train.colocate_all=False; "
                        "add --train.colocate_all or drop --vllm.enable_sleep")
    return problems


def _estimator_problems(cfg: RunConfig) -> list[str]:
    estimator, n = cfg.algo.advantage.estimator, cfg.rollout.n_samples_per_prompt
    if estimator in GROUP_ESTIMATORS and n <= 1:
        return [f"algo.advantage.estimator {estimator!r} needs rollout.n_samples_per_prompt > 1: got {n}; "
                "pass --rollout.n_samples_per_prompt 2 or more, or use --algo.advantage.estimator reinforce"]
    return []


def _filtering_problems(cfg: RunConfig) -> list[str]:
    problems = []
    if cfg.algo.dynamic_filtering_enable and cfg.reward.remote_url is None and cfg.train.agent_func_path is None:
        problems.append("algo.dynamic_filtering_enable needs reward.remote_url or train.agent_func_path: got "
                        "neither; pass --reward.remote_url or drop --algo.dynamic_filtering_enable")
    if cfg.algo.dynamic_filtering_enable and cfg.rollout.n_samples_per_prompt <= 1:
        problems.append("algo.dynamic_filtering_enable needs rollout.n_samples_per_prompt > 1: got "
                        f"{cfg.rollout.n_samples_per_prompt}; pass --rollout.n_samples_per_prompt 2 or more, "
                        "or drop --algo.dynamic_filtering_enable")
    return problems


def _colocation_problems(cfg: RunConfig) -> list[str]:
    problems = _engine_gpu_problems(cfg) if cfg.train.colocate_all and not cfg.train.async_enable else []
    pairs = []  # a colocated pair shares one placement group: both roles ask for the same nodes × GPUs
    if (cfg.train.colocate_all or cfg.train.colocate_actor_ref) and cfg.uses_ref:
        pairs.append((cfg.ref, "ref", cfg.actor, "actor"))
    if cfg.train.colocate_critic_reward and cfg.uses_critic and cfg.uses_reward_model:
        pairs.append((cfg.reward, "reward", cfg.critic, "critic"))
    for role, name, owner, owner_name in pairs:
        got, want = (role.num_nodes, role.num_gpus_per_node), (owner.num_nodes, owner.num_gpus_per_node)
        if got != want:
            problems.append(f"{name}.num_nodes and {name}.num_gpus_per_node must equal {owner_name}'s when "
                            f"colocated: got {got} and {want}; pass --{name}.num_nodes {want[0]} "
                            f"--{name}.num_gpus_per_node {want[1]}")
    return problems


def _engine_gpu_problems(cfg: RunConfig) -> list[str]:
    """Colocated, each of the actor's GPUs holds one TP worker of one engine (OpenRLHF's rule: E × TP = the actor's
    GPUs), and an engine's workers take the GPUs of one node (weights arrive by CUDA IPC from the rank beside)."""
    engines, tp, world, per_node = (cfg.vllm.num_engines, cfg.vllm.tensor_parallel_size, cfg.actor_world_size,
                                    cfg.actor.num_gpus_per_node)
    if engines is None:  # one engine beside actor rank 0
        return [f"vllm.tensor_parallel_size {tp} needs vllm.num_engines: got none; pass --vllm.num_engines "
                f"{max(1, world // tp)} (engines × TP = the actor's {world} GPUs)"] if tp > 1 else []
    problems = []
    if engines * tp != world:
        fix = (f"use --vllm.num_engines {world // tp} ({world} ÷ TP {tp})" if world % tp == 0 else
               f"use a --vllm.tensor_parallel_size that divides {world} with --vllm.num_engines {world} ÷ TP")
        problems.append("train.colocate_all needs actor.num_nodes × actor.num_gpus_per_node == vllm.num_engines × "
                        f"vllm.tensor_parallel_size: got {world} actor GPUs and {engines} engines × TP {tp} = "
                        f"{engines * tp}; {fix}, or change --actor.num_gpus_per_node to {engines * tp} "
                        "(with --actor.num_nodes 1)")
    if per_node % tp:
        divisors = " or ".join(str(d) for d in range(1, per_node + 1) if per_node % d == 0)
        problems.append(f"vllm.tensor_parallel_size must divide actor.num_gpus_per_node when colocated (an engine's "
                        f"TP workers share the GPUs of one node's actor ranks): got {tp} and {per_node}; use "
                        f"--vllm.tensor_parallel_size {divisors}")
    return problems


def _value_problems(cfg: RunConfig) -> list[str]:
    ranges = {"reward.clip_range": cfg.reward.clip_range,
              "algo.dynamic_filtering_range": cfg.algo.dynamic_filtering_range,
              "algo.advantage.is_correction_threshold": cfg.algo.advantage.is_correction_threshold}
    problems = [f"{name} must have low < high: got {value!r}; pass --{name} LOW HIGH with LOW < HIGH"
                for name, value in ranges.items() if not value[0] < value[1]]
    low_high = cfg.actor.eps_clip_low_high
    if low_high is not None and min(low_high) < 0:
        problems.append(f"actor.eps_clip_low_high must be >= 0: got {low_high!r}; e.g. pass 0.2 0.28")
    template = cfg.data.input_template
    if template is not None and "{}" not in template:
        problems.append(f"data.input_template must contain '{{}}' where the prompt goes: got {template!r}; "
                        "e.g. --data.input_template 'Question: {} Answer:'")
    return problems


def _batching_problems(cfg: RunConfig) -> list[str]:
    """A token budget does nothing without dynamic batching: say so rather than silently batch by sample count."""
    train_default = type(cfg.train).model_fields["max_tokens_per_gpu"].default
    budgets = {"rollout.max_tokens_per_gpu": cfg.rollout.max_tokens_per_gpu is not None,
               "train.max_tokens_per_gpu": cfg.train.max_tokens_per_gpu != train_default}
    if cfg.train.dynamic_batch_enable:
        return []
    return [f"{name} needs train.dynamic_batch_enable: got train.dynamic_batch_enable=False, so micro-batches "
            f"would hold micro_batch_size samples and ignore the budget; add --train.dynamic_batch_enable or drop "
            f"--{name}" for name, is_set in budgets.items() if is_set]


def _eval_problems(cfg: RunConfig) -> list[str]:
    """Evaluation needs a dataset to run on and a reward it can call on any sample (OpenRLHF: a remote reward or an
    agent); the best checkpoint needs evaluations to rank by."""
    e, key = cfg.eval, cfg.ckpt.best_metric_key
    is_evaluating = e.steps > 0 or e.at_start
    problems = []
    if is_evaluating and e.dataset is None:
        problems.append(f"eval.steps {e.steps} / eval.at_start {e.at_start} need eval.dataset: got none; pass "
                        "--eval.dataset FILE (prompts with the same input and label keys) or drop the eval flags")
    if e.dataset is not None and not is_evaluating:
        problems.append(f"eval.dataset {e.dataset!r} is never evaluated: eval.steps is {e.steps} and eval.at_start "
                        "is off; pass --eval.steps N (every N steps) and/or --eval.at_start")
    if e.dataset is not None and cfg.reward.remote_url is None and cfg.train.agent_func_path is None:
        problems.append(f"eval.dataset {e.dataset!r} needs reward.remote_url (a reward function file or server): "
                        "got none; pass --reward.remote_url FILE.py|http://…")
    if key not in ("", "none") and e.steps <= 0:
        problems.append(f"ckpt.best_metric_key {key!r} needs evaluations during training: got eval.steps "
                        f"{e.steps}; pass --eval.steps N with --eval.dataset, or --ckpt.best_metric_key none")
    if key not in ("", "none") and not key.startswith(("eval/", "eval_")):
        problems.append(f"ckpt.best_metric_key must name an eval metric (eval/<source>_pass1, "
                        f"eval/<source>_pass<k>, …): got {key!r}")
    return problems


def _data_problems(cfg: RunConfig) -> list[str]:
    d = cfg.data
    return prompt_probs_problems(d.prompt_dataset, d.prompt_probs) if d.prompt_dataset else []


def prompt_probs_problems(dataset: str, probs: str | None) -> list[str]:
    """`data.prompt_probs` gives one non-negative probability per `data.prompt_dataset` entry, summing to ~1."""
    if probs is None or not probs.strip():
        return []
    names = [name.strip() for name in dataset.split(",")]
    listed = f"data.prompt_dataset names {len(names)} ({dataset!r})"
    try:
        values = [float(p) for p in probs.split(",")]
    except ValueError:
        return [f"data.prompt_probs must be comma-separated numbers: got {probs!r}; e.g. --data.prompt_probs 0.7,0.3"]
    if len(values) != len(names):
        return [f"data.prompt_probs has {len(values)} values ({probs!r}) but {listed}: give one probability per "
                "dataset, in the same order"]
    if any(not math.isfinite(v) or v < 0 for v in values) or not math.isclose(sum(values), 1.0, abs_tol=1e-3):
        return [f"data.prompt_probs must be non-negative and sum to 1: got {probs!r} (sum {sum(values):g}) for "
                f"{listed}"]
    return []
