"""Starting and stopping a run's workers: RunConfig → each role's arguments → named actors on their slots.

Owns which roles a configuration needs (reference with kl.init_coef > 0, critic with gae), their shares of the
colocated placement group, and waiting until every actor is ready. It knows nothing about Prefect.
"""
from __future__ import annotations

import ray

from hybrid_core.algorithms.experience import ActorLossSettings, AdvantageSettings, PenaltySettings
from hybrid_core.config import RunConfig, changed_fields
from hybrid_core.data.metric_sinks import SinkSettings
from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.engines.checkpoint import newest_checkpoint
from hybrid_core.engines.actor_trainer import ISCorrection
from hybrid_core.engines.rollout_step import GroupFilter, PromptFormat
from hybrid_core.engines.sequence_batch import MicroBatching
from hybrid_core.engines.vllm_rollout import EngineSettings, SamplingSettings
from hybrid_core.plan import make_placement, role_bundles, sync_transport
from hybrid_core.types import RunRef
from hybrid_core.workers import placement
from hybrid_core.workers.actor import ActorWorker, ActorWorkerArgs
from hybrid_core.workers.critic import CriticWorker, CriticWorkerArgs
from hybrid_core.workers.ref import RefWorker
from hybrid_core.workers.rollout import PromptSource, RolloutWorker, RolloutWorkerArgs


def max_new_tokens(cfg: RunConfig) -> int:
    return cfg.rollout.max_new_tokens or cfg.data.max_len // 2


def rollout_args(cfg: RunConfig) -> RolloutWorkerArgs:
    v, r, d = cfg.vllm, cfg.rollout, cfg.data
    engine = EngineSettings(cfg.actor.model_name_or_path, cfg.ds.param_dtype, v.gpu_memory_utilization,
                            v.enforce_eager, v.enable_prefix_caching, v.enable_sleep, v.sleep_level,
                            v.tensor_parallel_size, d.max_len, cfg.train.seed, max_num_seqs=v.max_num_seqs)
    prompts = PromptSource(d.prompt_dataset, d.input_key, d.label_key, d.max_samples, r.batch_size,
                           cfg.train.num_episodes, cfg.train.max_steps)
    group_filter = GroupFilter(*cfg.algo.dynamic_filtering_range) if cfg.algo.dynamic_filtering_enable else None
    return RolloutWorkerArgs(engine, prompts, PromptFormat(d.apply_chat_template, d.input_template, d.max_len),
                             SamplingSettings(r.n_samples_per_prompt, max_new_tokens(cfg), r.temperature, r.top_p,
                                              seed_per_prompt=r.seed_per_prompt),
                             cfg.reward.remote_url, cfg.train.seed, group_filter, cfg.reward.timeout_s,
                             cfg.reward.max_retries, num_engines(cfg))


def train_batching(cfg: RunConfig) -> MicroBatching:
    """Micro-batches of the updates: `train.micro_batch_size` samples, or `train.max_tokens_per_gpu` tokens."""
    t = cfg.train
    return MicroBatching(t.micro_batch_size, t.max_tokens_per_gpu if t.dynamic_batch_enable else None,
                         cfg.ds.packing_samples)


def forward_batching(cfg: RunConfig) -> MicroBatching:
    """Micro-batches of the no-grad logprob/value forwards: `rollout.micro_batch_size` samples, or with dynamic
    batching `rollout.max_tokens_per_gpu` tokens (the train budget when unset)."""
    budget = cfg.rollout.max_tokens_per_gpu or cfg.train.max_tokens_per_gpu
    return MicroBatching(cfg.rollout.micro_batch_size, budget if cfg.train.dynamic_batch_enable else None,
                         cfg.ds.packing_samples)


def num_engines(cfg: RunConfig) -> int:
    return cfg.vllm.num_engines or 1


def role_ranks(cfg: RunConfig) -> dict[str, int]:
    """Data-parallel ranks of the actor, reference and critic: one per bundle of the placement group each sits in
    (a colocated group is as wide as its first role, the actor)."""
    layout = make_placement(cfg)
    return {role: layout.group_of(role).num_bundles for role in ("actor", "ref", "critic") if role in cfg.roles}


def total_optimizer_steps(cfg: RunConfig, num_steps: int) -> int:
    samples_per_step = cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt
    return num_steps * cfg.train.max_epochs * max(1, -(-samples_per_step // cfg.train.batch_size))


def ckpt_root(cfg: RunConfig, run: RunRef) -> str:
    """`ckpt.path` when set, else `<run dir>/ckpt`."""
    return cfg.ckpt.path if "ckpt.path" in changed_fields(cfg) else f"{run.run_dir}/ckpt"


def model_output_uri(cfg: RunConfig, run: RunRef) -> str:
    """`ckpt.output_dir` when set, else `<run dir>/model`."""
    return cfg.ckpt.output_dir if "ckpt.output_dir" in changed_fields(cfg) else f"{run.run_dir}/model"


def sink_settings(cfg: RunConfig, run: RunRef) -> SinkSettings:
    """TensorBoard with --logger.tensorboard_dir; W&B with --logger.wandb.key (the key `offline` keeps it local)."""
    w = cfg.logger.wandb
    local_dir = run.run_dir if "://" not in run.run_dir else None
    return SinkSettings(run.run_id, cfg.logger.tensorboard_dir, w.project if w.key else None,
                        None if w.key in (None, "offline") else w.key, w.org, w.group, w.run_name, local_dir)


def actor_args(cfg: RunConfig, num_steps: int, run: RunRef) -> ActorWorkerArgs:
    a, kl, adv, rw = cfg.actor, cfg.algo.kl, cfg.algo.advantage, cfg.reward
    low, high = a.eps_clip_low_high or (a.eps_clip, a.eps_clip)
    advantage = AdvantageSettings(adv.estimator, cfg.rollout.n_samples_per_prompt, adv.gamma, adv.lambd,
                                  adv.no_std_norm, kl.init_coef, kl.estimator, kl.use_loss, tuple(rw.clip_range))
    penalties = PenaltySettings(max_new_tokens(cfg), rw.overlong_buffer_len, rw.overlong_penalty_factor,
                                rw.stop_properly_penalty_coef)
    loss = ActorLossSettings(low, high, a.dual_clip, a.policy_loss_type, kl.init_coef, kl.estimator, kl.use_loss,
                             a.entropy_coef)
    correction = ISCorrection(adv.is_correction_type, *adv.is_correction_threshold) \
        if adv.is_correction_enable else None
    return ActorWorkerArgs(a.model_name_or_path, a, cfg.ds, cfg.train, kl, advantage, penalties, loss, correction,
                           forward_batching(cfg), train_batching(cfg), total_optimizer_steps(cfg, num_steps),
                           cfg.vllm.sync_bucket_mb * 2**20, cfg.roles, cfg.critic.freezing_steps,
                           placement.extensions_dir(), sink_settings(cfg, run), ckpt_root(cfg, run),
                           cfg.ckpt.save_hf, cfg.ckpt.max_num, sync_transport(cfg), num_engines(cfg),
                           tuple(role_ranks(cfg).items()))


def critic_args(cfg: RunConfig, num_steps: int, run: RunRef) -> CriticWorkerArgs:
    path = cfg.critic.model_name_or_path or cfg.reward.model_name_or_path or cfg.actor.model_name_or_path
    return CriticWorkerArgs(path, cfg.critic, cfg.ds, cfg.train, forward_batching(cfg), train_batching(cfg),
                            total_optimizer_steps(cfg, num_steps), placement.extensions_dir(), ckpt_root(cfg, run),
                            role_ranks(cfg).get("critic", 1))


def _spawn_all(cfg: RunConfig, run: RunRef) -> dict:
    """Create the run's actors (rollout first: it knows how many steps the data gives) and wait until ready."""
    num_bundles, bundles = role_bundles(cfg)
    slots = {role: placement.Slot(index, share) for role, (index, share) in bundles.items() if role != "rollout"}
    pg = placement.RunPlacement(run, num_bundles, cfg.train.device == "cpu")
    index, share = bundles["rollout"]  # engine r on the r-th bundle of the rollout group
    engines = [pg.spawn(RolloutWorker, "rollout", placement.Slot(index + rank, share), run, rollout_args(cfg), rank,
                        rank=rank) for rank in range(num_engines(cfg))]
    info = ray.get([e.info.remote() for e in engines], timeout=placement.READY_TIMEOUT_S)[0]
    num_steps, ranks = info["num_steps"], role_ranks(cfg)
    waits = _spawn_ranks(pg, ActorWorker, "actor", slots["actor"], ranks["actor"], run,
                         actor_args(cfg, num_steps, run))
    if cfg.uses_ref:  # frozen replicas: no DeepSpeed group among them
        waits += [pg.spawn(RefWorker, "ref", _rank_slot(slots["ref"], rank), cfg.actor.model_name_or_path,
                           cfg.ds.param_dtype, forward_batching(cfg), cfg.ds.use_liger_kernel,
                           rank=rank).ready.remote()
                  for rank in range(ranks["ref"])]
    if cfg.uses_critic:
        waits += _spawn_ranks(pg, CriticWorker, "critic", slots["critic"], ranks["critic"], run,
                              critic_args(cfg, num_steps, run))
    ray.get(waits, timeout=placement.READY_TIMEOUT_S)
    return info


def _rank_slot(first: placement.Slot, rank: int) -> placement.Slot:
    """Rank r of a role sits on the r-th bundle of its group (with colocation, beside the other roles' rank r)."""
    return placement.Slot(first.bundle_index + rank, first.share)


def _spawn_ranks(pg: placement.RunPlacement, cls, role: str, first: placement.Slot, num_ranks: int, run: RunRef,
                 args) -> list:
    """The role's DeepSpeed ranks, meeting at one rendezvous port; returns their `ready` calls (each rank's
    DeepSpeed start-up waits until all have joined)."""
    port = placement.free_port()
    return [pg.spawn(cls, role, _rank_slot(first, rank), run, args, rank,
                     rank=rank, rendezvous=placement.Rendezvous(rank, num_ranks, port)).ready.remote()
            for rank in range(num_ranks)]


def _live_state(run: RunRef, engines: int, ranks: dict[str, int]) -> dict | None:
    """Policy versions held by the run's live actors (the oldest of the engines'), or None when any rank of any
    role is gone (a lone rank 0 would wait forever for its peers in DeepSpeed's collectives)."""
    try:
        actor = ray.get(placement.get_worker(run, "actor").ready.remote(), timeout=60)
        infos = ray.get([placement.get_worker(run, "rollout", rank).info.remote() for rank in range(engines)],
                        timeout=60)
        rollout = infos[0] | {"policy_version": min(info["policy_version"] for info in infos)}
        ranks_left = [(role, rank) for role, count in ranks.items() for rank in range(count)]
        ranks_left.remove(("actor", 0))  # asked above
        ray.get([placement.get_worker(run, role, rank).ready.remote() for role, rank in ranks_left], timeout=60)
    except (ValueError, ray.exceptions.RayError):
        return None
    return actor | {"rollout_version": rollout["policy_version"], "num_steps": rollout["num_steps"]}


def start_workers(cfg: RunConfig, run: RunRef) -> dict:
    """Re-attach to the run's live actors when they hold exactly the last synced policy; otherwise create them
    and restore the newest checkpoint c. Returns {"num_steps", "resume_from", "attached"}: steps resume_from+1…
    remain (those with committed datasets are replayed from the store)."""
    placement.connect()
    steps = RolloutStore(run.run_dir).manifest()["steps"]
    synced = max([int(k) for k, v in steps.items() if "sync" in v], default=0)
    live = _live_state(run, num_engines(cfg), role_ranks(cfg))
    common = {"model_uri": model_output_uri(cfg, run)}
    if live and live["policy_version"] == live["trained_step"] == live["rollout_version"] == synced:
        return common | {"num_steps": live["num_steps"], "resume_from": synced, "attached": True}
    placement.kill_run(run)
    info = _spawn_all(cfg, run)
    ckpt = max([int(k) for k, v in steps.items() if v.get("checkpoint")], default=0)
    if not steps and cfg.ckpt.load_enable:  # a new run that starts from the newest checkpoint under ckpt.path
        ckpt = newest_checkpoint(ckpt_root(cfg, run))
    if ckpt:
        for role in [r for r in ("critic", "actor") if r in run.roles]:
            ray.get(placement.get_worker(run, role).restore.remote(ckpt), timeout=placement.READY_TIMEOUT_S)
        ray.get(placement.get_worker(run, "actor").sync.remote(ckpt), timeout=placement.READY_TIMEOUT_S)
    return common | {"num_steps": info["num_steps"], "resume_from": ckpt, "attached": False}


def stop_workers(run: RunRef) -> None:
    """Let the actor flush its metric sinks, then kill every actor of the run."""
    if not ray.is_initialized():
        return
    try:
        ray.get(placement.get_worker(run, "actor").close.remote(), timeout=60)
    except (ValueError, ray.exceptions.RayError):
        pass  # no live actor: nothing to flush
    placement.kill_run(run)


def open_run(cfg: RunConfig, run: RunRef) -> bool:
    """Save the run's configuration on first use (manifest + config.yaml); on later use refuse a changed one.

    Returns True when the run already existed (its committed work will be reused).
    """
    from hybrid_core.flags import config_differences, config_to_yaml

    store = RolloutStore(run.run_dir)
    manifest = store.manifest()
    if "config" in manifest:
        if differing := config_differences(manifest["config"], cfg):
            raise ValueError(f"run {run.run_id} was started with another configuration; refusing to resume: "
                             + "; ".join(differing) + ". Start a new --run_id or restore the saved values")
        return True
    store.write_json("manifest.json", manifest | {"config": cfg.model_dump(mode="json"), "run_id": run.run_id})
    store.fs.pipe_file(f"{store.root}/config.yaml", config_to_yaml(cfg).encode())
    return False
