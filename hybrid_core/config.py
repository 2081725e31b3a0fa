"""The run configuration: one frozen pydantic tree that mirrors OpenRLHF 0.11's dotted flags.

`RunConfig.actor.adam.lr` is `--actor.adam.lr`; defaults are OpenRLHF's, and fields marked PROJECT are ours.
Bounds live on the fields and every cross-field rule lives in `RunConfig`'s one validator, which reports all
broken rules at once. This module knows nothing about parsing flags (see `flags.py`) or about torch and Ray.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator
from pydantic.fields import FieldInfo

from hybrid_core.config_blocks import (ActorConfig, AdamConfig, ConfigBlock, ConfigError,  # noqa: F401 (re-exported)
                                       CriticConfig, LoraConfig, MuonConfig, OptimizerFields)
from hybrid_core.config_outputs import (LoggerConfig, StoreConfig, WandbConfig,  # noqa: F401 (re-exported)
                                        WANDB_KEY_SCHEMA)
from hybrid_core.switches import LogprobKernel, PackedAttention, WakeCopy


class RefConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"num_nodes", "num_gpus_per_node", "offload"})
    num_nodes: int = Field(1, gt=0, description="nodes for the reference model")
    num_gpus_per_node: int = Field(8, gt=0, description="GPUs per node for the reference model")
    offload: bool = Field(False, description="reference weights in host memory outside the advantage stage")


class RewardConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"remote_url", "clip_range", "overlong_buffer_len", "overlong_penalty_factor", "stop_properly_penalty_coef",
         "timeout_s", "max_retries", "retry_budget_s", "probe_timeout_s", "remote_batch_size", "model_name_or_path",
         "num_nodes", "num_gpus_per_node", "offload", "normalize_enable"})
    model_name_or_path: str | None = Field(None, description="reward model (a local dir: backbone + value head)")
    remote_url: str | None = Field(None, description="HTTP URL(s), comma-separated, or a .py reward_func file")
    num_nodes: int = Field(1, gt=0, description="nodes for the reward model")
    num_gpus_per_node: int = Field(8, gt=0, description="GPUs per node for the reward model")
    offload: bool = Field(False, description="reward model weights in host memory outside the reward stage")
    normalize_enable: bool = Field(False, description="normalize rewards with the RM's mean/std")
    clip_range: tuple[float, float] = Field((-10.0, 10.0), description="reward clip range (low high)")
    overlong_buffer_len: int | None = Field(None, gt=0, description="DAPO overlong buffer length")
    overlong_penalty_factor: float = Field(1.0, ge=0, description="DAPO overlong penalty factor")
    stop_properly_penalty_coef: float | None = Field(None, description="ProRL truncation penalty")
    timeout_s: float = Field(180.0, gt=0, description="PROJECT: timeout of one remote reward call")
    max_retries: int = Field(5, ge=0, description="PROJECT: retries of one remote reward call")
    retry_budget_s: float = Field(30.0, ge=0, description="PROJECT: seconds a failing remote reward call is retried")
    probe_timeout_s: float = Field(10.0, ge=0, description="PROJECT: start-up probe of each reward URL (0: none)")
    remote_batch_size: int = Field(32, gt=0, description="PROJECT: samples per POST to a remote reward server")


class VllmConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"num_engines", "tensor_parallel_size", "sync_backend", "enable_prefix_caching", "enforce_eager",
        "enable_sleep", "gpu_memory_utilization", "sync_bucket_mb", "sleep_level", "max_num_seqs",
        "attention_backend", "executor_backend", "block_size", "engine_core_process", "kv_cache_dtype"})
    num_engines: int | None = Field(None, gt=0, description="number of vLLM engines")
    tensor_parallel_size: int = Field(1, gt=0, description="TP degree per engine")
    sync_backend: Literal["nccl", "gloo"] = Field("nccl", description="weight-sync backend")
    sync_with_ray: bool = Field(False, description="build the sync group with ray.util.collective")
    enable_prefix_caching: bool = Field(False, description="vLLM prefix caching")
    enforce_eager: bool = Field(False, description="disable CUDA graphs")
    enable_sleep: bool = Field(False, description="sleep vLLM between rollouts")
    gpu_memory_utilization: float = Field(0.95, gt=0, le=1, description="vLLM share of GPU memory")
    sync_bucket_mb: int = Field(1024, gt=0, description="PROJECT: weight-sync bucket size in MiB (H200, 1.7B: "
                                "1024 MiB buckets sync in 0.031 s, 256 MiB in 0.053 s)")
    sleep_level: Literal[1, 2] = Field(1, description="PROJECT: vLLM sleep level (2 also drops weights)")
    max_num_seqs: int | None = Field(None, gt=0, description="PROJECT: sequences decoded at once (None: vLLM's "
                                     "default, 1024 on H100/H200-class GPUs)")
    attention_backend: Literal["FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "FLASHINFER"] | None = Field(
        None, description="PROJECT: vLLM's attention backend (None: vLLM's choice, FlashAttention 3 on an H200)")
    block_size: Literal[16, 32, 64, 128] | None = Field(
        None, description="PROJECT: the KV cache's page size in tokens (None: vLLM's default for the attention "
        "backend, 16 for FlashAttention)")
    executor_backend: Literal["uni", "mp"] | None = Field(
        None, description="PROJECT: where a TP-1 engine's model runner runs: `uni` in the rollout worker's thread "
        "beside vLLM's scheduler, `mp` in a child process, so scheduling a decode step overlaps preparing the next "
        "one's inputs; by default `mp` on GPUs with train.colocate_all, `uni` elsewhere (TP > 1: Ray actors on "
        "GPUs, child processes on CPU)")
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        "auto", description="PROJECT: the KV cache's element type: auto (the model's dtype) or fp8 (e4m3, scale 1), "
        "which halves the KV cache bytes every decode step reads; the rollout's logprobs then drift a little from "
        "the trainer's (--algo.advantage.is_correction_enable weighs that)")
    engine_core_process: bool = Field(False, description="PROJECT: vLLM's engine core (its scheduler) runs in a "
                                      "process of its own, apart from the rollout worker's output processing and "
                                      "threads (GPU, train.colocate_all, TP 1)")


LIGER_INSTALL_HINT = "pip install 'hybrid-engine[liger]'"  # the optional extra of --ds.use_liger_kernel
LOGIT_CHUNK_TOKENS = 4096  # --ds.logit_chunk_tokens: × Qwen3's 151,936-entry vocabulary, 5.8 GiB at a chunk's peak


class DsConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"zero_stage", "param_dtype", "adam_offload", "enable_sleep",
        "packing_samples", "use_liger_kernel", "value_head_prefix", "ring_attn_size", "ring_attn_head_stride",
        "logit_chunk_tokens", "logprob_kernel", "packed_attention", "wake_copy"})
    zero_stage: int = Field(2, ge=0, le=3, description="DeepSpeed ZeRO stage")
    param_dtype: Literal["bf16", "fp16", "fp32"] = Field("bf16", description="param dtype (fp32: PROJECT, CPU)")
    adam_offload: bool = Field(False, description="ZeRO-Offload: optimizer states and step on the host")
    zpg: int = Field(1, gt=0, description="ZeRO++ hpZ partition size")
    overlap_comm: bool = Field(False, description="overlap communication with compute")
    grad_accum_dtype: str | None = Field(None, description="gradient accumulation dtype")
    deepcompile: bool = Field(False, description="DeepCompile")
    enable_sleep: bool = Field(False, description="offload DeepSpeed states between train phases")
    tensor_parallel_size: int = Field(1, gt=0, description="DeepSpeed AutoTP degree")
    ring_attn_size: int = Field(1, gt=0, description="ranks a packed sample is split over (ring attention)")
    ring_attn_head_stride: int = Field(1, gt=0, description="K/V heads a ring all-gather exchanges at a time")
    packing_samples: bool = Field(False, description="pack a micro-batch's samples into one unpadded row")
    logit_chunk_tokens: int = Field(LOGIT_CHUNK_TOKENS, gt=0, description="PROJECT: tokens per vocabulary-head chunk")
    logprob_kernel: LogprobKernel | None = Field(None, description="PROJECT: the head on CUDA: triton|torch")
    packed_attention: PackedAttention | None = Field(None, description="PROJECT: packing on CUDA: varlen|flex")
    wake_copy: WakeCopy | None = Field(None, description="PROJECT: DeepSpeed's wake copy: auto|sm|engine")
    attn_implementation: str = Field("flash_attention_2", description="HF attention implementation")
    experts_implementation: Literal["eager", "batched_mm", "grouped_mm", "deepgemm"] | None = Field(
        None, description="MoE experts implementation")
    use_liger_kernel: bool | None = Field(None, description="Liger's fused RMSNorm, rotary and SwiGLU kernels: "
                                           "required (true), off (false), or by default on CUDA where the "
                                           "package is installed and covers the model type")
    load_in_4bit: bool = Field(False, description="QLoRA 4-bit loading")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA settings")
    value_head_prefix: str = Field("score", description="value head module name")
    use_universal_ckpt: bool = Field(False, description="DeepSpeed universal checkpoints")


class AdvantageConfig(ConfigBlock):
    IMPLEMENTED_VALUES: ClassVar[dict[str, frozenset]] = {
        "estimator": frozenset({"gae", "reinforce", "reinforce_baseline", "rloo", "group_norm", "dr_grpo"})}
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"estimator", "gamma", "lambd", "no_std_norm", "is_correction_enable", "is_correction_threshold",
        "is_correction_type"})
    estimator: Literal["gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo"] = Field(
        "gae", description="advantage estimator (gae needs a critic)")
    gamma: float = Field(1.0, ge=0, le=1, description="discount")
    lambd: float = Field(1.0, ge=0, le=1, description="GAE lambda")
    no_std_norm: bool = Field(False, description="skip dividing advantages by their std")
    is_correction_enable: bool = Field(False, description="importance-sampling correction vs vLLM logprobs")
    is_correction_threshold: tuple[float, float] = Field((0.5, 5.0), description="IS ratio bounds (low high)")
    is_correction_type: Literal["tis", "icepop", "seq-mask-tis"] = Field("tis", description="IS correction kind")


class KlConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"init_coef", "target", "horizon", "estimator", "use_loss"})
    init_coef: float = Field(0.01, ge=0, description="KL coefficient (0: no reference model)")
    target: float | None = Field(None, gt=0, description="adaptive KL target (None: fixed)")
    horizon: int = Field(10000, gt=0, description="adaptive KL horizon")
    estimator: Literal["k1", "k2", "k3"] = Field("k1", description="KL estimator")
    use_loss: bool = Field(False, description="KL as a loss term instead of a reward penalty")


class AlgoConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"dynamic_filtering_enable", "dynamic_filtering_range"})
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig, description="advantage settings")
    kl: KlConfig = Field(default_factory=KlConfig, description="KL settings")
    dynamic_filtering_enable: bool = Field(False, description="drop groups whose mean reward is out of range")
    dynamic_filtering_range: tuple[float, float] = Field((0.0, 1.0), description="kept mean reward (low high)")


class RolloutConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"batch_size", "n_samples_per_prompt", "micro_batch_size", "max_new_tokens", "max_tokens_per_gpu",
        "temperature", "top_p", "seed_per_prompt", "logprobs", "vllm_generate_batch_size"})
    batch_size: int = Field(1024, gt=0, description="prompts per step")
    n_samples_per_prompt: int = Field(1, gt=0, description="samples per prompt")
    micro_batch_size: int = Field(1, gt=0, description="experience forward micro-batch")
    vllm_generate_batch_size: int | None = Field(None, gt=0, description="prompts a batch serves fresh; above "
                                                 "batch_size (async, dynamic filtering) the passing groups not "
                                                 "trained are carried to the next step (oversampling)")
    max_new_tokens: int | None = Field(None, gt=0, description="max response tokens (None: max_len - prompt)")
    max_tokens_per_gpu: int | None = Field(None, gt=0, description="dynamic-batch token budget of the logprob/value "
                                           "forwards (None: train.max_tokens_per_gpu)")
    temperature: float = Field(1.0, ge=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling")
    seed_per_prompt: bool = Field(True, description="PROJECT: sampling seeded per (run seed, step, prompt), so a "
                                  "retried or resumed rollout regenerates the same samples on any engine; false: "
                                  "the engine's own seeded generator, as OpenRLHF does (both 24.8-24.9k tok/s)")
    logprobs: bool | None = Field(None, description="PROJECT: the engine returns each sampled token's logprob (the "
                                  "rollout and eval datasets' rollout_logprobs): true always, false never (null), "
                                  "by default only when importance-sampling correction reads them, as OpenRLHF "
                                  "asks; on the H200 the 1.7B rollout shape generated 9-20% faster without them")


class TrainConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"batch_size", "micro_batch_size", "max_epochs", "num_episodes", "seed", "dynamic_batch_enable",
        "max_tokens_per_gpu", "colocate_all", "colocate_actor_ref", "colocate_critic_reward", "max_steps", "device",
        "stage_timeout_s", "stage_retries", "retry_delay_s", "agent_func_path", "agent_step_timeout_s",
        "agent_skip_failed", "async_enable", "async_queue_size", "partial_rollout_enable", "enable_ema",
        "ema_beta"})
    batch_size: int = Field(128, gt=0, description="samples per optimizer step")
    micro_batch_size: int = Field(1, gt=0, description="samples per GPU per forward/backward")
    max_epochs: int = Field(1, gt=0, description="passes over each step's buffer")
    num_episodes: int = Field(1, gt=0, description="passes over the prompts")
    seed: int = Field(42, description="random seed")
    full_determinism_enable: bool = Field(False, description="deterministic kernels")
    dynamic_batch_enable: bool = Field(False, description="micro-batches cut by token budget, not micro_batch_size")
    max_tokens_per_gpu: int = Field(16192, gt=0, description="dynamic-batch token budget of a train micro-batch "
                                    "(prompt+response; a longer sample trains alone)")
    colocate_all: bool = Field(False, description="all roles and vLLM share the actor's GPUs")
    colocate_actor_ref: bool = Field(False, description="actor and ref share GPUs")
    colocate_critic_reward: bool = Field(False, description="critic and reward model share GPUs")
    async_enable: bool = Field(False, description="generate and train concurrently")
    async_queue_size: int = Field(1, gt=0, description="async: batches generated ahead of the step training (each "
                                  "by one policy version, at most this many versions behind)")
    partial_rollout_enable: bool = Field(False, description="async: a batch generating pauses for each weight push "
                                         "and goes on with the new weights (token_policy_version per token)")
    enable_ema: bool = Field(False, description="an fp32 EMA of the policy's trained parameters, in host memory, "
                             "updated at each optimizer step and exported beside the policy (`ema/`)")
    ema_beta: float = Field(0.992, gt=0, lt=1, description="EMA decay: ema = beta·ema + (1-beta)·weights")
    agent_func_path: str | None = Field(None, description="multi-turn agent .py file (class AgentExecutor)")
    agent_step_timeout_s: float = Field(60.0, gt=0, description="PROJECT: seconds an agent's reset or step may take")
    agent_skip_failed: bool = Field(False, description="PROJECT: drop a sample whose environment failed (agent/failed)")
    max_steps: int | None = Field(None, gt=0, description="PROJECT: cap on steps")
    device: Literal["cuda", "cpu"] = Field("cuda", description="PROJECT: cpu asks Ray for CPU bundles only")
    stage_timeout_s: float = Field(3600.0, gt=0, description="PROJECT: timeout of one stage")
    stage_retries: int = Field(2, ge=0, description="PROJECT: Prefect retries of rollout, reward and sync")
    retry_delay_s: float = Field(5.0, ge=0, description="PROJECT: seconds between those retries")


class DataConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"prompt_dataset", "prompt_probs", "prompt_split", "input_key", "label_key", "input_template",
        "apply_chat_template", "max_len", "max_samples"})
    prompt_dataset: str | None = Field(None, description="prompt datasets, comma-separated: files, folders, hub names")
    prompt_probs: str | None = Field(None, description="sampling probabilities, comma-separated (unset: concatenate)")
    prompt_split: str = Field("train", description="dataset split")
    input_key: str = Field("input", description="prompt column")
    label_key: str | None = Field(None, description="label column")
    input_template: str | None = Field(None, description="prompt template containing {}")
    apply_chat_template: bool = Field(False, description="apply the tokenizer's chat template")
    max_len: int = Field(2048, gt=0, description="max prompt+response tokens")
    max_samples: int = Field(100000000, gt=0, description="max prompts used")
    disable_fast_tokenizer: bool = Field(False, description="use the slow tokenizer")
    dataloader_num_workers: int = Field(0, ge=0, description="dataloader workers")
    image_key: str = Field("images", description="image column (VLM)")
    max_images_per_prompt: int = Field(0, ge=0, description="images per prompt (0: text only)")


class EvalConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"dataset", "split", "steps", "temperature", "n_samples_per_prompt", "at_start"})
    dataset: str | None = Field(None, description="eval datasets, comma-separated (needs reward.remote_url)")
    split: str = Field("train", description="eval split")
    steps: int = Field(-1, ge=-1, description="evaluate every N steps (-1: never)")
    temperature: float = Field(0.6, ge=0, description="eval temperature")
    n_samples_per_prompt: int = Field(4, gt=0, description="eval samples per prompt (the k of pass@k)")
    at_start: bool = Field(False, description="PROJECT: also evaluate the initial policy, as step 0")


class CkptConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"path", "output_dir", "save_steps", "save_hf", "max_num", "load_enable", "best_metric_key"})
    path: str = Field("./ckpt/checkpoints_ppo_ray", description="DeepSpeed checkpoint directory")
    output_dir: str = Field("./ckpt", description="final HF model directory")
    save_steps: int = Field(-1, ge=-1, description="checkpoint every N steps (-1: never)")
    save_hf: bool = Field(False, description="also save HF weights at each checkpoint")
    disable_ds: bool = Field(False, description="skip DeepSpeed checkpoints")
    max_num: int = Field(3, gt=0, description="checkpoints kept")
    max_mem: float = Field(1e8, gt=0, description="checkpoint disk budget in GB")
    load_enable: bool = Field(False, description="resume from ckpt.path")
    best_metric_key: str = Field("", description="eval metric of the best checkpoint ('': first eval/*_pass1; 'none')")


class RunConfig(ConfigBlock):
    """The whole run: one sub-config per flag namespace, checked together by `_check_rules`."""

    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset()
    actor: ActorConfig = Field(default_factory=ActorConfig, description="policy model (--actor.*)")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="value model, gae only (--critic.*)")
    ref: RefConfig = Field(default_factory=RefConfig, description="reference model (--ref.*)")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="reward source (--reward.*)")
    vllm: VllmConfig = Field(default_factory=VllmConfig, description="rollout engines (--vllm.*)")
    ds: DsConfig = Field(default_factory=DsConfig, description="DeepSpeed (--ds.*)")
    algo: AlgoConfig = Field(default_factory=AlgoConfig, description="advantages and KL (--algo.*)")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="generation (--rollout.*)")
    train: TrainConfig = Field(default_factory=TrainConfig, description="training loop (--train.*)")
    data: DataConfig = Field(default_factory=DataConfig, description="prompts (--data.*)")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="evaluation (--eval.*)")
    ckpt: CkptConfig = Field(default_factory=CkptConfig, description="checkpoints (--ckpt.*)")
    logger: LoggerConfig = Field(default_factory=LoggerConfig, description="metrics (--logger.*)")
    store: StoreConfig = Field(default_factory=StoreConfig, description="rollout store (--store.*)")
    use_ms: bool = Field(False, description="download models from ModelScope")

    @model_validator(mode="after")
    def _check_rules(self) -> RunConfig:
        from hybrid_core.config_rules import rule_problems  # the rules read this model: imported late

        problems = rule_problems(self)
        if problems:
            raise ConfigError(problems)
        return self

    @property
    def actor_world_size(self) -> int:
        return self.actor.num_nodes * self.actor.num_gpus_per_node

    @property
    def num_rollout_gpus(self) -> int:  # 0 without vLLM engines
        return (self.vllm.num_engines or 0) * self.vllm.tensor_parallel_size

    @property
    def uses_critic(self) -> bool:
        return self.algo.advantage.estimator == "gae"

    @property
    def has_reference(self) -> bool:  # KL to the initial policy: reference logprobs exist
        return self.algo.kl.init_coef > 0

    @property
    def is_oversampling(self) -> bool:  # async batches of rollout.vllm_generate_batch_size prompts, the surplus carried
        size = self.rollout.vllm_generate_batch_size
        return self.train.async_enable and size is not None and size > self.rollout.batch_size

    @property
    def uses_lora(self) -> bool:
        return self.ds.lora.rank > 0

    @property
    def uses_ref(self) -> bool:  # a reference worker starts; with LoRA the actor's base (adapters off) serves instead
        return self.has_reference and not self.uses_lora

    @property
    def roles(self) -> tuple[str, ...]:  # the Ray worker roles a run of this configuration starts
        return ("actor", "rollout") + ("ref",) * self.uses_ref + ("critic",) * self.uses_critic

    @property
    def asks_engine_logprobs(self) -> bool:  # rollout.logprobs, or by default whether the correction reads them
        if self.rollout.logprobs is None:
            return self.algo.advantage.is_correction_enable
        return self.rollout.logprobs

    @property
    def engine_executor(self) -> str | None:
        """Where a one-worker engine's model runner runs (None: TP > 1, the engine's own rule). By default in a child
        process on GPUs with colocate_all: 30.1k against 28.4k tokens/s in-process at the 1.7B rollout shape, H200
        s36. Elsewhere a broadcast lands in the rollout worker's memory (mp needs colocate_all, config_rules) and
        the 2-core CPU machine measured the child process slower."""
        if self.vllm.tensor_parallel_size > 1:
            return None
        if self.vllm.executor_backend is not None:
            return self.vllm.executor_backend
        is_colocated_gpu = self.train.device == "cuda" and self.train.colocate_all
        return "mp" if is_colocated_gpu and not self.uses_lora else "uni"  # an adapter loads in the engine's process

    @property
    def uses_reward_model(self) -> bool:  # a remote reward or an agent replaces the reward model
        return self.reward.remote_url is None and self.train.agent_func_path is None


def leaf_paths(model: type[BaseModel] = RunConfig, prefix: str = "") -> dict[str, FieldInfo]:
    """Every leaf field of `model` by dotted path ("actor.adam.lr"), in declaration order."""
    paths: dict[str, FieldInfo] = {}
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            paths.update(leaf_paths(info.annotation, f"{prefix}{name}."))
        else:
            paths[f"{prefix}{name}"] = info
    return paths


def leaf_values(cfg: BaseModel) -> dict[str, Any]:
    """Every leaf value of `cfg` by dotted path."""
    return {path: attrgetter(path)(cfg) for path in leaf_paths(type(cfg))}


def changed_fields(cfg: RunConfig) -> list[str]:
    """Dotted paths whose value differs from `RunConfig()`'s, in declaration order."""
    defaults = leaf_values(RunConfig())
    return [path for path, value in leaf_values(cfg).items() if value != defaults[path]]
