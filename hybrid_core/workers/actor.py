"""ActorWorker: the Ray actor owning the DeepSpeed policy: experience (advantage stage), training and weight sync.

Methods only delegate to `engines` and move data between the run's store and the other workers (reference, critic
and rollout workers are looked up by name). It holds the KL controller. It knows nothing about Prefect.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import ray

from hybrid_core.algorithms.experience import ActorLossSettings, AdvantageSettings, PenaltySettings
from hybrid_core.algorithms.kl import AdaptiveKLController, FixedKLController
from hybrid_core.config import ActorConfig, DsConfig, KlConfig, TrainConfig
from hybrid_core.data.metric_sinks import MetricSinks, SinkSettings
from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.data.stage_tables import metrics_table, step_metrics
from hybrid_core.engines.actor_trainer import ISCorrection, TrainSamples, fit_actor
from hybrid_core.engines.checkpoint import (export_hf, load_checkpoint, remove_checkpoints, rng_state,
                                           save_checkpoint, set_rng_state)
from hybrid_core.engines.deepspeed_train import (DeepSpeedTrainEngine, clear_stale_build_locks, load_policy,
                                                 start_sleep_buffer)
from hybrid_core.engines.experience_maker import ExperienceSources, experience_stats, make_advantage_table
from hybrid_core.engines.frozen_model import load_tokenizer, memory_peak_gib, reset_memory_peak
from hybrid_core.engines.minibatch_updates import BatchPlan
from hybrid_core.engines.sequence_batch import MicroBatching
from hybrid_core.types import RunRef, StageResult
from hybrid_core.workers import rank_group
from hybrid_core.workers.stage_clock import stamped
from hybrid_core.workers.weight_sender import WeightSender


@dataclass(frozen=True)
class ActorWorkerArgs:
    model_path: str
    actor: ActorConfig
    ds: DsConfig
    train: TrainConfig
    kl: KlConfig
    advantage: AdvantageSettings
    penalties: PenaltySettings
    loss: ActorLossSettings
    correction: ISCorrection | None
    experience_batching: MicroBatching  # the advantage stage's no-grad forwards
    train_batching: MicroBatching       # the policy update's micro-batches
    total_optimizer_steps: int
    sync_bucket_bytes: int
    roles: tuple[str, ...]
    freezing_steps: int
    extensions_dir: str
    sinks: SinkSettings
    ckpt_root: str
    save_hf: bool
    max_num: int
    sync_transport: str = "object_store"  # | "cuda_ipc" | "process_group:<nccl|gloo>" (see plan.sync_transport)
    num_engines: int = 1
    role_ranks: tuple[tuple[str, int], ...] = ()  # (role, data-parallel ranks) of actor, ref and critic; absent: 1


# wall-clock and device-memory figures: excluded from hashes and replay checks
VOLATILE_METRICS = ("timing_s/", "rollout/tokens_per_s", "memory_gib/")


def make_kl_controller(kl: KlConfig):
    return AdaptiveKLController(kl.init_coef, kl.target, kl.horizon) if kl.target else FixedKLController(kl.init_coef)


class ActorWorker:
    """Rank `rank` of the policy's data-parallel ranks; the tasks call rank 0, which leads the others
    (`rank_group`)."""

    def __init__(self, run: RunRef, args: ActorWorkerArgs, rank: int = 0):
        clear_stale_build_locks(args.extensions_dir)
        self.run, self.args, self.store, self.rank = run, args, RolloutStore(run.run_dir), rank
        self.tokenizer = load_tokenizer(args.model_path)
        sleep_buffer = start_sleep_buffer(args.model_path, args.ds)  # pinned while the model loads
        self.engine = DeepSpeedTrainEngine(load_policy(args.model_path, args.actor, args.ds), args.actor, args.ds,
                                           args.train, args.total_optimizer_steps, self.tokenizer.pad_token_id,
                                           sleep_buffer)
        self.engine.sleep()
        self.kl_controller = make_kl_controller(args.kl)
        self.sinks = MetricSinks(args.sinks) if rank == 0 else None
        self.policy_version, self.trained_step, self.step_stats = 0, 0, {}
        self.sender = WeightSender(args.sync_transport, args.sync_bucket_bytes, run.stage_timeout_s)

    def ready(self) -> dict:
        return {"policy_version": self.policy_version, "trained_step": self.trained_step}

    @stamped
    def make_experience(self, step: int) -> StageResult:
        if self.store.committed_entry(step, "advantage"):  # produced by exactly this policy: replay it
            table = self.store.read(step, "advantage")
            self.step_stats[step] = experience_stats(table, self.args.advantage.kl_estimator) | {"kl_coef": self.kl_controller.coef,
                                                               "num_samples": table.num_rows}
            self.store.log_event(step, "advantage", "replay")
            return StageResult("advantage", step, 0.0, table.num_rows, replayed=True)
        self.store.log_event(step, "advantage", "start")
        start = time.perf_counter()
        reset_memory_peak()
        settings = dataclasses.replace(self.args.advantage, kl_coef=self.kl_controller.coef)
        table, stats = make_advantage_table(_ShardedPolicy(self), self.store.read(step, "rollout"),
                                            self.store.read(step, "reward"), self._sources(), settings,
                                            self.args.penalties, self.args.experience_batching)
        path = self.store.commit(step, "advantage", table, step - 1)
        stats |= memory_peak_gib("actor_experience")
        self.step_stats[step] = stats | {"kl_coef": self.kl_controller.coef, "num_samples": table.num_rows}
        return StageResult("advantage", step, time.perf_counter() - start, table.num_rows, path, metrics=stats)

    def _sources(self) -> ExperienceSources:
        return ExperienceSources(self._remote_forward("ref", "logprobs") if "ref" in self.args.roles else None,
                                 self._remote_forward("critic", "values") if "critic" in self.args.roles else None)

    def _remote_forward(self, role: str, method: str):
        """`role`'s forward of the rows, its ranks each taking a share."""
        def forward(prompt_ids, response_ids):
            workers = rank_group.all_ranks(self.run, role, self._num_ranks(role))
            remote = [lambda p, r, w=w: getattr(w, method).remote(p, r) for w in workers]
            return rank_group.sharded_rows(prompt_ids, response_ids, remote, self.run.stage_timeout_s)
        return forward

    def _num_ranks(self, role: str) -> int:
        return dict(self.args.role_ranks).get(role, 1)

    def _peers(self) -> list:
        """Ranks 1..n-1 of the policy (rank 0 only calls them)."""
        return rank_group.peers(self.run, "actor", self._num_ranks("actor"))

    @stamped
    def train(self, step: int) -> StageResult:
        if self.trained_step >= step:  # a re-attached actor that already trained this step
            return StageResult("train", step, 0.0, replayed=True, metrics=self.step_stats.get(step, {}))
        self.store.log_event(step, "train", "start")
        start = time.perf_counter()
        coef = self.kl_controller.coef
        peer_calls = [peer.train_share.remote(step, coef) for peer in self._peers()]
        stats = rank_group.with_peers(peer_calls, lambda: self._fit(step, coef), self.run.stage_timeout_s)
        experience = self.step_stats.get(step, {})
        self.kl_controller.update(experience.get("experience_kl_seq", 0.0), experience.get("num_samples", 0))
        self.step_stats[step], self.trained_step = experience | stats, step
        return StageResult("train", step, time.perf_counter() - start, metrics=stats)

    def _fit(self, step: int, kl_coef: float) -> dict:
        """This rank's part of the step's policy update (the whole of it with one rank)."""
        if step <= self.args.freezing_steps:  # the critic warms up first when critic.freezing_steps is set
            return {"actor_frozen": 1.0}
        wake_start = time.perf_counter()
        reset_memory_peak()
        self.engine.wake_up()
        wake_s = time.perf_counter() - wake_start
        loss = dataclasses.replace(self.args.loss, kl_coef=kl_coef)
        stats = fit_actor(self.engine, self._train_samples(step), loss, self._batch_plan(step), self.args.correction)
        sleep_start = time.perf_counter()
        self.engine.sleep()
        stats |= {"timing_s/ds_wake": wake_s, "timing_s/ds_sleep": time.perf_counter() - sleep_start}
        return stats | memory_peak_gib("actor_train")

    def train_share(self, step: int, kl_coef: float) -> dict:
        """Ranks 1..n-1, called by rank 0's `train`: the same update on this rank's share of every step."""
        stats = self._fit(step, kl_coef)
        self.trained_step = step
        return stats

    def _train_samples(self, step: int) -> TrainSamples:
        ro, adv = self.store.read(step, "rollout"), self.store.read(step, "advantage")
        column = lambda table, name: table.column(name).to_pylist()  # noqa: E731
        return TrainSamples(column(ro, "prompt_ids"), column(ro, "response_ids"), column(adv, "old_logprobs"),
                            column(adv, "ref_logprobs") if "ref" in self.args.roles else None,
                            column(adv, "advantages"), column(ro, "rollout_logprobs"))

    def _batch_plan(self, step: int) -> BatchPlan:
        t = self.args.train
        return BatchPlan(t.batch_size, self.args.train_batching, t.max_epochs, seed=t.seed * 100003 + step)

    @stamped
    def sync(self, step: int) -> StageResult:
        """Push the trained weights to the rollout engine bucket by bucket; the engines then hold version `step`."""
        if self.policy_version >= step:
            return StageResult("sync", step, 0.0, replayed=True)
        self.store.log_event(step, "sync", "start")
        start = time.perf_counter()
        timeout = self.run.stage_timeout_s
        rollouts = [ray.get_actor(self.run.actor_name("rollout", rank), namespace=self.run.namespace)
                    for rank in range(self.args.num_engines)]
        ray.get([r.begin_weight_update.remote() for r in rollouts], timeout=timeout)
        if self.args.sync_transport == "cuda_ipc" and len(rollouts) > 1:  # rank r's GPU holds engine r
            peer_calls = [peer.push_weights.remote(rank) for rank, peer in enumerate(self._peers(), start=1)]
            sent = rank_group.with_peers(peer_calls, lambda: self.push_weights(0), timeout)
        else:
            sent = self.sender.send(self.engine.module, self.engine.is_zero3, rollouts)
        self.policy_version = min(ray.get([r.end_weight_update.remote(step) for r in rollouts], timeout=timeout))
        self.store.update_manifest(step, "sync", {"policy_version": step})
        self.store.log_event(step, "sync", "commit")
        return StageResult("sync", step, time.perf_counter() - start, metrics={"bytes": float(sent)})

    def push_weights(self, engine_rank: int) -> int:
        """This rank's weights to the engine on its GPU (CUDA IPC); returns the bytes sent."""
        engine = ray.get_actor(self.run.actor_name("rollout", engine_rank), namespace=self.run.namespace)
        return self.sender.send(self.engine.module, self.engine.is_zero3, [engine])

    def write_metrics(self, step: int, timings: dict[str, float], extra: dict[str, float]) -> dict[str, float]:
        """Commit the step's metrics row (needs every stage's timing, so it runs after sync)."""
        tables = [self.store.read(step, s) for s in ("rollout", "reward", "advantage")]
        metrics = step_metrics(*tables, self.step_stats.pop(step, {}), timings, extra)
        if self.store.committed_entry(step, "metrics"):  # a replayed step must reproduce what it committed
            committed = self.store.read(step, "metrics").to_pylist()[0]
            check_reproduced(step, committed, metrics)
            self.store.log_event(step, "metrics", "replay")
            return committed
        self.store.commit(step, "metrics", metrics_table(step, metrics), step - 1,
                          drop_from_hash=[k for k in metrics if k.startswith(VOLATILE_METRICS)])
        self.sinks.log(step, metrics)
        return metrics

    def save_checkpoint(self, step: int) -> str:
        """DeepSpeed checkpoint of the policy with the client state resume needs; HF weights with ckpt.save_hf."""
        state = {"step": step, "policy_version": self.policy_version, "kl_coef": self.kl_controller.coef,
                 "rng": rng_state()}
        peer_calls = [peer.save_share.remote(step) for peer in self._peers()]  # DeepSpeed saves collectively
        uri = rank_group.with_peers(peer_calls, lambda: save_checkpoint(self.engine, self.args.ckpt_root, "actor",
                                                                        step, state), self.run.stage_timeout_s)
        if self.args.save_hf:
            export_hf(self.engine, f"{self.args.ckpt_root.rstrip('/')}/global_step{step}_hf", self.tokenizer)
        self.store.update_manifest(step, "checkpoint", f"global_step{step}")
        self.store.log_event(step, "checkpoint", "commit")
        kept = sorted(int(k) for k, v in self.store.manifest()["steps"].items() if "checkpoint" in v)
        if len(kept) > self.args.max_num:  # rotation: keep the newest ckpt.max_num
            remove_checkpoints(self.args.ckpt_root, kept[:-self.args.max_num])
            for old in kept[:-self.args.max_num]:
                self.store.update_manifest(old, "checkpoint", None)
        return uri

    def save_share(self, step: int) -> str:
        """Ranks 1..n-1, called by rank 0's `save_checkpoint`: this rank's part of the DeepSpeed checkpoint."""
        return save_checkpoint(self.engine, self.args.ckpt_root, "actor", step, {"step": step})

    def restore_share(self, step: int) -> int:
        """Ranks 1..n-1, called by rank 0's `restore`."""
        load_checkpoint(self.engine, self.args.ckpt_root, "actor", step)
        self.trained_step = step
        return step

    def restore(self, step: int) -> dict:
        """Load checkpoint `step`: weights, optimizer, scheduler, KL coefficient and RNG states."""
        peer_calls = [peer.restore_share.remote(step) for peer in self._peers()]
        state = rank_group.with_peers(peer_calls, lambda: load_checkpoint(self.engine, self.args.ckpt_root, "actor",
                                                                          step), self.run.stage_timeout_s)
        self.store.log_event(step, "checkpoint", "restore")
        self.kl_controller.coef = state["kl_coef"]
        set_rng_state(state["rng"])
        self.trained_step = step  # weights of version `step`; the rollout engine gets them by `sync(step)`
        return self.ready()

    def close(self) -> None:
        """Flush the metric sinks before the run's actors are killed."""
        if self.sinks is not None:
            self.sinks.close()

    def logprobs_of(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        return self.engine.logprobs(prompt_ids, response_ids, self.args.experience_batching)

    def save_model(self, out_uri: str) -> str:
        return export_hf(self.engine, out_uri, self.tokenizer)


class _ShardedPolicy:
    """The policy's no-grad logprobs of the advantage stage, every data-parallel rank computing a share."""

    def __init__(self, worker: ActorWorker):
        self.worker = worker

    def logprobs(self, prompt_ids, response_ids, batching: MicroBatching) -> list[list[float]]:
        w = self.worker
        remote = [lambda p, r, peer=peer: peer.logprobs_of.remote(p, r) for peer in w._peers()]
        return rank_group.sharded_rows(prompt_ids, response_ids, remote, w.run.stage_timeout_s,
                                       local=lambda p, r: w.engine.logprobs(p, r, batching))


def check_reproduced(step: int, committed: dict, metrics: dict, atol: float = 1e-6) -> None:
    """Fail when a replayed step's figures differ from those it committed (wall-clock figures excepted)."""
    differing = {k: (committed.get(k), v) for k, v in metrics.items()
                 if not k.startswith(VOLATILE_METRICS) and isinstance(v, float)
                 and abs((committed.get(k) or 0.0) - v) > atol * max(1.0, abs(v))}
    if differing:
        raise RuntimeError(f"replayed step {step} did not reproduce its committed metrics: {differing}; the "
                           "restored policy is not the one that produced the committed datasets")
