"""Starting and stopping a run's workers: RunConfig → each role's arguments → named actors on their slots.

Owns which roles a configuration needs (reference only with kl.init_coef > 0), their GPU/CPU shares in the
colocated placement group, and waiting until every actor is ready. It knows nothing about Prefect.
"""
from __future__ import annotations

import ray

from hybrid_core.algorithms.experience import ActorLossSettings, AdvantageSettings
from hybrid_core.config import RunConfig
from hybrid_core.engines.rollout_step import PromptFormat
from hybrid_core.engines.vllm_rollout import EngineSettings, SamplingSettings
from hybrid_core.types import RunRef
from hybrid_core.workers import placement
from hybrid_core.workers.actor import ActorWorker, ActorWorkerArgs
from hybrid_core.workers.ref import RefWorker
from hybrid_core.workers.rollout import PromptSource, RolloutWorker, RolloutWorkerArgs


def rollout_args(cfg: RunConfig) -> RolloutWorkerArgs:
    v, r, d = cfg.vllm, cfg.rollout, cfg.data
    max_new = r.max_new_tokens or d.max_len // 2
    engine = EngineSettings(cfg.actor.model_name_or_path, cfg.ds.param_dtype, v.gpu_memory_utilization,
                            v.enforce_eager, v.enable_prefix_caching, v.enable_sleep, v.sleep_level,
                            v.tensor_parallel_size, d.max_len, cfg.train.seed)
    prompts = PromptSource(d.prompt_dataset, d.input_key, d.label_key, d.max_samples, r.batch_size,
                           cfg.train.num_episodes, cfg.train.max_steps)
    return RolloutWorkerArgs(engine, prompts, PromptFormat(d.apply_chat_template, d.input_template, d.max_len),
                             SamplingSettings(r.n_samples_per_prompt, max_new, r.temperature, r.top_p),
                             cfg.reward.remote_url, cfg.train.seed)


def actor_args(cfg: RunConfig, num_steps: int) -> ActorWorkerArgs:
    a, kl, adv = cfg.actor, cfg.algo.kl, cfg.algo.advantage
    low, high = a.eps_clip_low_high or (a.eps_clip, a.eps_clip)
    samples_per_step = cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt
    advantage = AdvantageSettings(adv.estimator, cfg.rollout.n_samples_per_prompt, adv.gamma, adv.no_std_norm,
                                  kl.init_coef, kl.estimator, kl.use_loss, tuple(cfg.reward.clip_range))
    loss = ActorLossSettings(low, high, a.dual_clip, a.policy_loss_type, kl.init_coef, kl.estimator, kl.use_loss)
    return ActorWorkerArgs(a.model_name_or_path, a, cfg.ds, cfg.train, advantage, loss,
                           cfg.rollout.micro_batch_size,
                           num_steps * cfg.train.max_epochs * max(1, samples_per_step // cfg.train.batch_size),
                           cfg.vllm.sync_bucket_mb * 2**20, cfg.uses_ref, placement.extensions_dir())


def _share(cfg: RunConfig) -> float:
    num_roles = 2 + int(cfg.uses_ref)  # actor, rollout (+ ref) share bundle 0
    return round(min(0.2, 1.0 / num_roles), 3) if cfg.train.device == "cuda" else round(1.0 / num_roles, 3)


def start_workers(cfg: RunConfig, run: RunRef) -> dict:
    """Create the run's actors (rollout first: it knows how many steps the data gives) and wait until ready."""
    on_cpu = cfg.train.device == "cpu"
    placement.connect()
    pg = placement.RunPlacement(run, cfg.actor_world_size, on_cpu)
    slot = placement.Slot(0, _share(cfg))
    rollout = pg.spawn(RolloutWorker, "rollout", slot, run, rollout_args(cfg))
    info = ray.get(rollout.info.remote(), timeout=placement.READY_TIMEOUT_S)
    waits = [pg.spawn(ActorWorker, "actor", slot, run, actor_args(cfg, info["num_steps"])).ready.remote()]
    if cfg.uses_ref:
        ref = pg.spawn(RefWorker, "ref", slot, cfg.actor.model_name_or_path, cfg.ds.param_dtype,
                       cfg.rollout.micro_batch_size)
        waits.append(ref.ready.remote())
    ray.get(waits, timeout=placement.READY_TIMEOUT_S)
    return info


def stop_workers(run: RunRef) -> None:
    if ray.is_initialized():
        placement.kill_run(run)
