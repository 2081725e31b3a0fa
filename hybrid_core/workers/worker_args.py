"""Each role's settings from the run's configuration: RunConfig → the arguments its Ray actor is created with.

Every field is set by keyword from the configuration it comes from, so no setting has a default that could differ
from the config's; where a role runs and with how many ranks is read from the run's plan (`plan.run_plan`, made once
and passed in; a caller without one gets it made here). Pure functions: it starts nothing and knows nothing about
Prefect.
"""
from __future__ import annotations

from hybrid_core.algorithms.experience import ActorLossSettings, AdvantageSettings, PenaltySettings
from hybrid_core.config import RunConfig, changed_fields
from hybrid_core.data.metric_sinks import SinkSettings
from hybrid_core.engines.agent_rollout import AgentSettings
from hybrid_core.engines.actor_trainer import ISCorrection
from hybrid_core.engines.rollout_step import GroupFilter, PromptFormat
from hybrid_core.engines.frozen_model import FrozenModelSettings
from hybrid_core.engines.reward_model import RewardModelSettings
from hybrid_core.engines.ring_attention import RingSettings
from hybrid_core.engines.sequence_batch import MicroBatching
from hybrid_core.engines.lora_policy import LoraSettings
from hybrid_core.engines.vllm_rollout import EngineSettings, SamplingSettings
from hybrid_core.plan.run_plan import RunPlan, run_plan
from hybrid_core.rewards.sources import RewardSourceSpec
from hybrid_core.types import RunRef
from hybrid_core.workers.actor import ActorWorkerArgs
from hybrid_core.workers.critic import CriticWorkerArgs
from hybrid_core.workers.evaluation import EvalSettings
from hybrid_core.workers.rollout import PromptSource, RolloutWorkerArgs


def run_ref(cfg: RunConfig, run_id: str) -> RunRef:
    """The run's name, store and stage settings, as every task and worker sees them."""
    t = cfg.train
    return RunRef(run_id=run_id, store_root=cfg.store.root, stage_timeout_s=t.stage_timeout_s, roles=cfg.roles,
                  stage_retries=t.stage_retries, retry_delay_s=t.retry_delay_s, save_steps=cfg.ckpt.save_steps,
                  eval_steps=cfg.eval.steps, eval_at_start=cfg.eval.at_start,
                  async_queue_size=t.async_queue_size if t.async_enable else 0, is_oversampling=cfg.is_oversampling)


def max_new_tokens(cfg: RunConfig) -> int:
    return cfg.rollout.max_new_tokens or cfg.data.max_len // 2


def num_engines(cfg: RunConfig) -> int:
    return cfg.vllm.num_engines or 1


def role_ranks(cfg: RunConfig, plan: RunPlan | None = None) -> dict[str, int]:
    """Data-parallel ranks of the actor, reference, critic and reward model: one per bundle of the placement group
    each sits in (a colocated group is as wide as its first role, the actor, or the critic beside the reward)."""
    return (plan or run_plan(cfg)).role_ranks


def reward_model_settings(cfg: RunConfig) -> RewardModelSettings:
    """The reward model's ranks: frozen, the run's dtype, the forwards' micro-batches."""
    return RewardModelSettings(model_path=cfg.reward.model_name_or_path, param_dtype=cfg.ds.param_dtype,
                               value_head_prefix=cfg.ds.value_head_prefix, is_normalized=cfg.reward.normalize_enable,
                               is_offloaded=cfg.reward.offload, batching=forward_batching(cfg))


def ref_settings(cfg: RunConfig) -> FrozenModelSettings:
    """The reference's replicas: the policy's initial weights, frozen, in the run's dtype, on the run's rings."""
    return FrozenModelSettings(model_path=cfg.actor.model_name_or_path, param_dtype=cfg.ds.param_dtype,
                               batching=forward_batching(cfg), use_liger=cfg.ds.use_liger_kernel,
                               is_offloaded=cfg.ref.offload, ring=ring_settings(cfg))


def total_optimizer_steps(cfg: RunConfig, num_steps: int) -> int:
    samples_per_step = cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt
    return num_steps * cfg.train.max_epochs * max(1, -(-samples_per_step // cfg.train.batch_size))


def is_on_policy(cfg: RunConfig) -> bool:
    """One optimizer step over each step's samples and one epoch: the update starts from the weights that generated
    them (its own forward then serves as the old logprobs)."""
    samples_per_step = cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt
    return cfg.train.max_epochs == 1 and samples_per_step <= cfg.train.batch_size


def ckpt_root(cfg: RunConfig, run: RunRef) -> str:
    """`ckpt.path` when set, else `<run dir>/ckpt`."""
    return cfg.ckpt.path if "ckpt.path" in changed_fields(cfg) else f"{run.run_dir}/ckpt"


def model_output_uri(cfg: RunConfig, run: RunRef) -> str:
    """`ckpt.output_dir` when set, else `<run dir>/model`."""
    return cfg.ckpt.output_dir if "ckpt.output_dir" in changed_fields(cfg) else f"{run.run_dir}/model"


def train_batching(cfg: RunConfig) -> MicroBatching:
    """Micro-batches of the updates: `train.micro_batch_size` samples, or `train.max_tokens_per_gpu` tokens a GPU
    (a micro-batch is split over a ring's `ds.ring_attn_size` GPUs, so it holds that many times the budget, as in
    OpenRLHF)."""
    t = cfg.train
    return MicroBatching(num_samples=t.micro_batch_size,
                         max_tokens=t.max_tokens_per_gpu * cfg.ds.ring_attn_size if t.dynamic_batch_enable else None,
                         is_packed=cfg.ds.packing_samples, logit_chunk_tokens=cfg.ds.logit_chunk_tokens,
                         logprob_kernel=cfg.ds.logprob_kernel, packed_attention=cfg.ds.packed_attention)


def forward_batching(cfg: RunConfig) -> MicroBatching:
    """Micro-batches of the no-grad logprob/value forwards: `rollout.micro_batch_size` samples, or with dynamic
    batching `rollout.max_tokens_per_gpu` tokens a GPU (the train budget when unset; × the ring size, as above)."""
    budget = (cfg.rollout.max_tokens_per_gpu or cfg.train.max_tokens_per_gpu) * cfg.ds.ring_attn_size
    return MicroBatching(num_samples=cfg.rollout.micro_batch_size,
                         max_tokens=budget if cfg.train.dynamic_batch_enable else None,
                         is_packed=cfg.ds.packing_samples, logit_chunk_tokens=cfg.ds.logit_chunk_tokens,
                         logprob_kernel=cfg.ds.logprob_kernel, packed_attention=cfg.ds.packed_attention)


def ring_settings(cfg: RunConfig) -> RingSettings:
    """Ring attention of the reference's ranks (the DeepSpeed roles read it from `ds`)."""
    return RingSettings(size=cfg.ds.ring_attn_size, head_stride=cfg.ds.ring_attn_head_stride)


def engine_settings(cfg: RunConfig) -> EngineSettings:
    v = cfg.vllm
    return EngineSettings(model_path=cfg.actor.model_name_or_path, param_dtype=cfg.ds.param_dtype,
                          gpu_memory_utilization=v.gpu_memory_utilization, enforce_eager=v.enforce_eager,
                          enable_prefix_caching=v.enable_prefix_caching, enable_sleep=v.enable_sleep,
                          sleep_level=v.sleep_level, tensor_parallel_size=v.tensor_parallel_size,
                          max_model_len=cfg.data.max_len, seed=cfg.train.seed, max_num_seqs=v.max_num_seqs,
                          block_size=v.block_size, kv_cache_dtype=v.kv_cache_dtype,
                          attention_backend=v.attention_backend,
                          executor_backend=cfg.engine_executor, engine_core_process=v.engine_core_process,
                          lora=LoraSettings.of(cfg.ds.lora, cfg.train.seed))



def rollout_args(cfg: RunConfig, faults: tuple = (), plan: RunPlan | None = None) -> RolloutWorkerArgs:
    r, d, rw = cfg.rollout, cfg.data, cfg.reward
    plan = plan or run_plan(cfg)
    prompts = PromptSource(dataset=d.prompt_dataset, probs=d.prompt_probs, split=d.prompt_split,
                           input_key=d.input_key, label_key=d.label_key, max_samples=d.max_samples,
                           batch_size=r.batch_size, num_episodes=cfg.train.num_episodes,
                           max_steps=cfg.train.max_steps, seed=cfg.train.seed, is_oversampling=cfg.is_oversampling)
    low, high = cfg.algo.dynamic_filtering_range
    return RolloutWorkerArgs(
        engine=engine_settings(cfg), prompts=prompts,
        prompt_format=PromptFormat(apply_chat_template=d.apply_chat_template, input_template=d.input_template,
                                   max_len=d.max_len),
        sampling=SamplingSettings(n=r.n_samples_per_prompt, max_new_tokens=max_new_tokens(cfg),
                                  temperature=r.temperature, top_p=r.top_p, seed_per_prompt=r.seed_per_prompt,
                                  logprobs=cfg.asks_engine_logprobs),
        reward=RewardSourceSpec(remote_url=rw.remote_url, timeout_s=rw.timeout_s, max_retries=rw.max_retries,
                                retry_budget_s=rw.retry_budget_s, remote_batch_size=rw.remote_batch_size),
        seed=cfg.train.seed,
        group_filter=GroupFilter(low=low, high=high) if cfg.algo.dynamic_filtering_enable else None,
        num_engines=plan.engines.num_engines, reward_model_ranks=plan.role_ranks.get("reward", 0),
        is_reward_normalized=rw.normalize_enable, eval=eval_settings(cfg), agent=agent_settings(cfg), faults=faults,
        partial_rollout=cfg.train.async_enable and cfg.train.partial_rollout_enable,
        generate_batch_size=r.vllm_generate_batch_size if cfg.is_oversampling else None)


def agent_settings(cfg: RunConfig) -> AgentSettings | None:
    """`train.agent_*` for the rollout worker (None: single-turn generation)."""
    t = cfg.train
    if t.agent_func_path is None:
        return None
    return AgentSettings(path=t.agent_func_path, step_timeout_s=t.agent_step_timeout_s,
                         skip_failed=t.agent_skip_failed, max_len=cfg.data.max_len)


def eval_settings(cfg: RunConfig) -> EvalSettings | None:
    """`eval.*` for the rollout worker: k samples a prompt at eval.temperature, the rollout's top_p and length."""
    e, d = cfg.eval, cfg.data
    if e.dataset is None:
        return None
    sampling = SamplingSettings(n=e.n_samples_per_prompt, max_new_tokens=max_new_tokens(cfg),
                                temperature=e.temperature, top_p=cfg.rollout.top_p, seed_per_prompt=True,
                                logprobs=cfg.asks_engine_logprobs)
    return EvalSettings(dataset=e.dataset, split=e.split, input_key=d.input_key, label_key=d.label_key,
                        sampling=sampling)


def sink_settings(cfg: RunConfig, run: RunRef, has_wandb_key: bool) -> SinkSettings:
    """TensorBoard with --logger.tensorboard_dir; W&B online when the run's processes have WANDB_API_KEY
    (`has_wandb_key`), local files with --logger.wandb.key offline."""
    w = cfg.logger.wandb
    is_offline = w.key == "offline"
    return SinkSettings(run_id=run.run_id, tensorboard_dir=cfg.logger.tensorboard_dir,
                        wandb_project=w.project if is_offline or has_wandb_key else None,
                        wandb_mode="offline" if is_offline else None, wandb_org=w.org, wandb_group=w.group,
                        wandb_run_name=w.run_name, wandb_dir=run.run_dir if "://" not in run.run_dir else None)


def advantage_settings(cfg: RunConfig) -> AdvantageSettings:
    adv, kl = cfg.algo.advantage, cfg.algo.kl
    return AdvantageSettings(estimator=adv.estimator, n_samples_per_prompt=cfg.rollout.n_samples_per_prompt,
                             gamma=adv.gamma, lambd=adv.lambd, no_std_norm=adv.no_std_norm, kl_coef=kl.init_coef,
                             kl_estimator=kl.estimator, kl_use_loss=kl.use_loss,
                             reward_clip=tuple(cfg.reward.clip_range))


def loss_settings(cfg: RunConfig) -> ActorLossSettings:
    a, kl = cfg.actor, cfg.algo.kl
    low, high = a.eps_clip_low_high or (a.eps_clip, a.eps_clip)
    return ActorLossSettings(clip_low=low, clip_high=high, dual_clip=a.dual_clip, loss_type=a.policy_loss_type,
                             kl_coef=kl.init_coef, kl_estimator=kl.estimator, kl_use_loss=kl.use_loss,
                             entropy_coef=a.entropy_coef)


def is_correction(cfg: RunConfig) -> ISCorrection | None:
    adv = cfg.algo.advantage
    if not adv.is_correction_enable:
        return None
    low, high = adv.is_correction_threshold
    return ISCorrection(kind=adv.is_correction_type, low=low, high=high)


def engine_wake_share(cfg: RunConfig) -> float:
    """What the rollout engine beside an actor rank may map on its GPU when it wakes its KV cache after a sync:
    vLLM's whole share (`vllm.gpu_memory_utilization`, more than the cache alone); nothing when the engines do not
    sleep (their cache stays mapped; only a sleeping engine shares the actor's GPUs, a config rule). DeepSpeed's
    sleep, still copying at the sync's end, is left to finish beside the rollout when that much is free
    (`ActorWorker.sync`)."""
    return cfg.vllm.gpu_memory_utilization if cfg.vllm.enable_sleep else 0.0


def actor_args(cfg: RunConfig, num_steps: int, run: RunRef, extensions_dir: str, faults: tuple = (),
               has_wandb_key: bool = False, plan: RunPlan | None = None) -> ActorWorkerArgs:
    rw = cfg.reward
    plan = plan or run_plan(cfg)
    penalties = PenaltySettings(max_new_tokens=max_new_tokens(cfg), overlong_buffer_len=rw.overlong_buffer_len,
                                overlong_penalty_factor=rw.overlong_penalty_factor,
                                stop_properly_penalty_coef=rw.stop_properly_penalty_coef)
    return ActorWorkerArgs(
        model_path=cfg.actor.model_name_or_path, actor=cfg.actor, ds=cfg.ds, train=cfg.train, kl=cfg.algo.kl,
        advantage=advantage_settings(cfg), penalties=penalties, loss=loss_settings(cfg), correction=is_correction(cfg),
        experience_batching=forward_batching(cfg), train_batching=train_batching(cfg),
        total_optimizer_steps=total_optimizer_steps(cfg, num_steps), sync_bucket_bytes=cfg.vllm.sync_bucket_mb * 2**20,
        roles=cfg.roles, freezing_steps=cfg.critic.freezing_steps, is_update_on_policy=is_on_policy(cfg),
        extensions_dir=extensions_dir,
        sinks=sink_settings(cfg, run, has_wandb_key), ckpt_root=ckpt_root(cfg, run), save_hf=cfg.ckpt.save_hf,
        max_num=cfg.ckpt.max_num, best_metric_key=cfg.ckpt.best_metric_key, sync_transport=plan.sync_transport,
        engines=plan.engines, role_ranks=tuple(plan.role_ranks.items()),
        starts_forwards_early=not cfg.uses_reward_model, engine_wake_share=engine_wake_share(cfg), faults=faults)


def critic_args(cfg: RunConfig, num_steps: int, run: RunRef, extensions_dir: str,
                plan: RunPlan | None = None) -> CriticWorkerArgs:
    path = cfg.critic.model_name_or_path or cfg.reward.model_name_or_path or cfg.actor.model_name_or_path
    return CriticWorkerArgs(model_path=path, critic=cfg.critic, ds=cfg.ds, train=cfg.train,
                            forward_batching=forward_batching(cfg), train_batching=train_batching(cfg),
                            total_optimizer_steps=total_optimizer_steps(cfg, num_steps),
                            extensions_dir=extensions_dir, ckpt_root=ckpt_root(cfg, run),
                            num_ranks=role_ranks(cfg, plan).get("critic", 1))
