"""ActorWorker: the Ray actor owning the DeepSpeed policy: experience (advantage), training, weight sync, the
step's metrics row and checkpoints.

Methods only delegate to `engines` and move data between the run's store and the other workers (reference, critic
and rollout workers are looked up by name); rank 0 leads the policy's other ranks and the critic. What a stage
measures is committed with it through the step ledger, so the metrics row is built from the store alone. It holds
the KL controller. It knows nothing about Prefect.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from hybrid_core.algorithms.experience import (ActorLossSettings, AdvantageSettings, PenaltySettings,
                                               reads_old_logprobs)
from hybrid_core.algorithms.kl import AdaptiveKLController, FixedKLController
from hybrid_core.config import ActorConfig, DsConfig, KlConfig, TrainConfig
from hybrid_core.data.metric_sinks import MetricSinks, SinkSettings
from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.data.eval_tables import eval_only_row
from hybrid_core.data.stage_tables import METRIC_COLUMNS, experience_figures, metrics_table, row_from_records
from hybrid_core.engines.actor_trainer import ISCorrection, TrainSamples, fit_actor
from hybrid_core.engines.checkpoint import export_hf, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from hybrid_core.engines.deepspeed_train import (DeepSpeedTrainEngine, clear_stale_build_locks, load_policy,
                                                 start_sleep_buffer)
from hybrid_core.engines.experience_maker import OLD_FROM_UPDATE, make_advantage_table
from hybrid_core.engines.frozen_model import load_tokenizer, memory_peak_gib, reset_memory_peak
from hybrid_core.engines.minibatch_updates import BatchPlan
from hybrid_core.engines.sequence_batch import MicroBatching
from hybrid_core.engines.weight_sync import join_bucket_gathers
from hybrid_core.layout import EngineLayout
from hybrid_core.step_contract import ADVANTAGE, METRICS, ROLLOUT, SYNC, TRAIN, derive_seed, generating_version
from hybrid_core.types import MetricsRow, RunRef, StageResult
from hybrid_core.workers import rank_group
from hybrid_core.workers.checkpoints import CheckpointKeeper
from hybrid_core.workers.faults import FaultPoints
from hybrid_core.workers.remote_forwards import RemoteForwards
from hybrid_core.workers.stage_clock import freeze_startup_heap, stamped
from hybrid_core.workers.step_ledger import VOLATILE_METRICS, StepLedger, check_reproduced, result_from_entry
from hybrid_core.workers.weight_sender import WeightSender


@dataclass(frozen=True, kw_only=True)
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
    is_update_on_policy: bool  # one optimizer step over the step's samples, one epoch (`worker_args.is_on_policy`)
    extensions_dir: str
    sinks: SinkSettings
    ckpt_root: str
    save_hf: bool
    max_num: int
    best_metric_key: str  # ckpt.best_metric_key: "" the first eval/*_pass1, "none" plain rotation
    sync_transport: str  # "object_store" | "cuda_ipc" | "process_group:<nccl|gloo>" (see plan.placement.sync_transport)
    engines: EngineLayout  # the rollout engines and which actor rank feeds each of their TP workers
    role_ranks: tuple[tuple[str, int], ...]  # (role, data-parallel ranks) of actor, ref and critic
    starts_forwards_early: bool  # the reward stage keeps off the GPU: its forwards run beside it (`start_forwards`)
    engine_wake_share: float  # of a rank's GPU, what the engine beside it may map when it wakes (`sync`)
    faults: tuple = ()


# A step trained again after a restore must reproduce its committed figures: exactly on CPU; on GPUs bf16 kernels
# with atomic reductions are not bit-reproducible, while a wrong restored policy moves the figures far more than this.
REPLAY_TOLERANCE = {"cpu": 1e-6, "cuda": 5e-2}


def make_kl_controller(kl: KlConfig):
    return AdaptiveKLController(kl.init_coef, kl.target, kl.horizon) if kl.target else FixedKLController(kl.init_coef)


class ActorWorker:
    """Rank `rank` of the policy's data-parallel ranks; the tasks call rank 0, which leads the others
    (`rank_group`)."""

    PRELOAD = ("deepspeed", "transformers")  # imported while the other workers start (placement.deferred)

    def __init__(self, run: RunRef, args: ActorWorkerArgs, rank: int = 0):
        clear_stale_build_locks(args.extensions_dir)
        self.run, self.args, self.store, self.rank = run, args, RolloutStore(run.run_dir), rank
        self.ledger = StepLedger(self.store, FaultPoints(args.faults, self.store.log_event))
        self.tokenizer = load_tokenizer(args.model_path)
        sleep_buffer = start_sleep_buffer(args.model_path, args.ds, self._num_ranks("actor"))  # while it loads
        self.engine = DeepSpeedTrainEngine(load_policy(args.model_path, args.actor, args.ds), args.actor, args.ds,
                                           args.train, args.total_optimizer_steps, self.tokenizer.pad_token_id,
                                           sleep_buffer)
        self.engine.sleep()
        self.kl_controller = make_kl_controller(args.kl)
        self.sinks = MetricSinks(args.sinks) if rank == 0 else None
        self.policy_version, self.trained_step = 0, 0
        self.forwards = RemoteForwards(run, args.roles, dict(args.role_ranks), args.ds.ring_attn_size)
        self.sender = WeightSender(args.sync_transport, args.sync_bucket_bytes, run.stage_timeout_s)
        self.checkpoints = CheckpointKeeper(self)
        freeze_startup_heap()

    def ready(self) -> dict:
        return {"policy_version": self.policy_version, "trained_step": self.trained_step}

    def _check_weights(self, step: int, stage: str) -> None:
        if self.trained_step != generating_version(step):
            raise RuntimeError(f"actor rank {self.rank} holds the weights of step {self.trained_step}; {stage} of step "
                               f"{step} needs version {generating_version(step)}: restore a checkpoint first")

    @stamped
    def make_experience(self, step: int) -> StageResult:
        if entry := self.ledger.replay(step, ADVANTAGE.name):  # produced by exactly this policy: replay it
            return StageResult(stage=ADVANTAGE.name, step=step, seconds=0.0, rows=entry["rows"], replayed=True)
        self._check_weights(step, ADVANTAGE.name)
        self.ledger.begin(step, ADVANTAGE.name)
        if step > self.args.freezing_steps:  # the optimizer states come back while the reference's forward runs
            self.engine.wake_up_soon()
        reset_memory_peak()
        settings = dataclasses.replace(self.args.advantage, kl_coef=self.kl_controller.coef)
        policy = None if self._old_from_update(step) else _ShardedPolicy(self)
        table, stats = make_advantage_table(policy, self.store.read(step, ROLLOUT.name),
                                            self.store.read(step, "reward"), self.forwards.sources(step), settings,
                                            self.args.penalties, self.args.experience_batching)
        stats |= memory_peak_gib("actor_experience") | {"kl_coef": self.kl_controller.coef,
                                                         "num_samples": float(table.num_rows)}
        entry = self.ledger.commit(step, ADVANTAGE.name, table, self.clock, stats)
        return StageResult(stage=ADVANTAGE.name, step=step, seconds=entry["seconds"], rows=table.num_rows,
                           path=self.store.stage_uri(step, ADVANTAGE.name), metrics=entry["metrics"])

    def _old_from_update(self, step: int) -> bool:
        """Whether step `step`'s old logprobs come from its update's own forward (no separate forward): the update is
        exactly on-policy, the advantages do not read them, and the actor trains this step."""
        a = self.args
        return a.is_update_on_policy and step > a.freezing_steps and \
            not reads_old_logprobs("ref" in a.roles, a.advantage.kl_use_loss)

    def start_forwards(self, step: int) -> bool:
        """Called as the reward stage begins: start the reference's and critic's forwards of step `step`'s committed
        rollout, so their GPUs work while the reward is computed on the host; `make_experience` collects them.
        Nothing starts when a reward model shares the GPUs or the advantage stage will be replayed. Returns
        whether any started."""
        if not self.args.starts_forwards_early or self.ledger.entry(step, ADVANTAGE.name) is not None:
            return False
        rollout = self.store.read(step, ROLLOUT.name)
        started = self.forwards.start_early(step, rollout.column("prompt_ids").to_pylist(),
                                            rollout.column("response_ids").to_pylist())
        if started:
            self.store.log_event(step, ADVANTAGE.name, "forwards-started")
        return started

    def _num_ranks(self, role: str) -> int:
        return dict(self.args.role_ranks).get(role, 1)

    def _peers(self) -> list:
        """Ranks 1..n-1 of the policy (rank 0 only calls them)."""
        return rank_group.peers(self.run, "actor", self._num_ranks("actor"))

    @stamped
    def train(self, step: int) -> StageResult:
        committed = self.ledger.entry(step, TRAIN.name)
        if self.trained_step >= step:  # a re-attached actor that already trained this step
            return result_from_entry(TRAIN.name, step, committed, replayed=True)
        self._check_weights(step, TRAIN.name)
        self.ledger.begin(step, TRAIN.name)
        experience = experience_figures(self.ledger.entry(step, ADVANTAGE.name))
        stats = experience | self._critic_train(step) | self._train_ranks(step, self.kl_controller.coef)
        self.kl_controller.update(stats.get("experience_kl_seq", 0.0), int(experience.get("num_samples", 0)))
        self.trained_step = step
        if committed is not None:  # trained again after a restore: it must reproduce what it committed
            check_reproduced(step, TRAIN.name, committed["metrics"], stats, REPLAY_TOLERANCE[self.args.train.device])
            self.ledger.seconds(step, TRAIN.name)
            self.store.log_event(step, TRAIN.name, "reproduced")
            return result_from_entry(TRAIN.name, step, committed, replayed=True)
        return result_from_entry(TRAIN.name, step, self.ledger.record(step, TRAIN.name, self.clock, stats))

    def _critic_train(self, step: int) -> dict:
        """The critic's update of the step (gae), before the policy's, led from here like the forwards."""
        if "critic" not in self.args.roles:
            return {}
        critic = rank_group.all_ranks(self.run, "critic", 1)[0]
        return rank_group.gather("critic", [(0, critic.train.remote(step))], self.run.stage_timeout_s)[0]

    def _train_ranks(self, step: int, kl_coef: float) -> dict:
        peer_calls = rank_group.started_on_peers(self._peers(), "train_share", step, kl_coef)
        return rank_group.with_peers("actor", peer_calls, lambda: self._fit(step, kl_coef), self.run.stage_timeout_s)

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
        self.engine.sleep_soon()  # the copy to the host runs on while the sync starts; the sync waits for its end
        stats |= {"timing_s/ds_wake": wake_s, "timing_s/ds_sleep": time.perf_counter() - sleep_start}
        return stats | memory_peak_gib("actor_train")

    def train_share(self, step: int, kl_coef: float) -> dict:
        """Ranks 1..n-1, called by rank 0's `train`: the same update on this rank's share of every step."""
        stats = self._fit(step, kl_coef)
        self.trained_step = step
        return stats

    def _train_samples(self, step: int) -> TrainSamples:
        ro, adv = self.store.read(step, ROLLOUT.name), self.store.read(step, ADVANTAGE.name)
        column = lambda table, name: table.column(name).to_pylist()  # noqa: E731
        old_from_update = OLD_FROM_UPDATE in experience_figures(self.ledger.entry(step, ADVANTAGE.name))
        engine_logprobs = ro.column("rollout_logprobs")  # null: the engine was asked for none
        return TrainSamples(column(ro, "prompt_ids"), column(ro, "response_ids"),
                            None if old_from_update else column(adv, "old_logprobs"),
                            column(adv, "ref_logprobs") if "ref" in self.args.roles else None,
                            column(adv, "advantages"),
                            None if engine_logprobs.null_count else engine_logprobs.to_pylist())

    def _batch_plan(self, step: int) -> BatchPlan:
        t = self.args.train
        return BatchPlan(batch_size=t.batch_size, batching=self.args.train_batching, max_epochs=t.max_epochs,
                         seed=derive_seed(t.seed, step, "actor-batches"))

    @stamped
    def sync(self, step: int) -> StageResult:
        """Push the trained weights to the rollout engines bucket by bucket; the engines then hold version `step`."""
        if self.policy_version >= step:
            self.finish_sleeps()
            return result_from_entry(SYNC.name, step, self.ledger.entry(step, SYNC.name), replayed=True)
        committed = self.ledger.entry(step, SYNC.name)
        self.ledger.begin(step, SYNC.name)
        try:
            sent = self.push_to_engines(step)
        finally:  # the engines wake their KV cache next: DeepSpeed's sleep frees its memory first, unless there is room
            waited = self.finish_sleeps(self.args.engine_wake_share)
        if committed is not None:  # synced again after a restore: the record stands
            self.ledger.seconds(step, SYNC.name)
            self.store.log_event(step, SYNC.name, "reproduced")
            return result_from_entry(SYNC.name, step, committed, replayed=True)
        stats = {"bytes": float(sent), "timing_s/ds_sleep_wait": waited}
        entry = self.ledger.record(step, SYNC.name, self.clock, stats, policy_version=step)
        return result_from_entry(SYNC.name, step, entry)

    def finish_sleeps(self, unless_free_share: float | None = None) -> float:
        """Every rank's DeepSpeed sleep that `_fit` started is done and its GPU memory free, except on a rank whose
        GPU has `unless_free_share` of its memory free already (the copy then runs on beside the rollout; the next
        call that touches the optimizer finishes it); returns the seconds this rank waited."""
        peer_calls = rank_group.started_on_peers(self._peers(), "finish_sleep", unless_free_share)
        own = lambda: self.finish_sleep(unless_free_share)  # noqa: E731
        return rank_group.with_peers("actor", peer_calls, own, self.run.stage_timeout_s)

    def finish_sleep(self, unless_free_share: float | None = None) -> float:
        """This rank's part of `finish_sleeps` (ranks 1..n-1 are called by rank 0)."""
        return self.engine.finish_sleep(unless_free_share)

    def push_to_engines(self, version: int) -> int:
        """Every rollout engine loads this policy's weights, then holds `version`; returns the bytes of one copy
        (also how restored weights reach the engines when workers start)."""
        timeout = self.run.stage_timeout_s
        rollouts = rank_group.all_ranks(self.run, "rollout", self.args.engines.num_engines)
        rank_group.gather("rollout", [(r, e.begin_weight_update.remote()) for r, e in enumerate(rollouts)], timeout)
        if self.args.sync_transport == "cuda_ipc":  # every rank feeds the engine worker on its own GPU
            peer_calls = rank_group.started_on_peers(self._peers(), "push_weights")
            sent = rank_group.with_peers("actor", peer_calls, self.push_weights, timeout)
        else:  # rank 0 sends; under ZeRO-3 the other ranks join the gather of each bucket
            peers = self._peers() if self.engine.is_zero3 else []
            peer_calls = rank_group.started_on_peers(peers, "join_weight_gathers")
            sent = rank_group.with_peers("actor", peer_calls, lambda: self.sender.send(
                self.engine.module, self.engine.is_zero3, rollouts), timeout)
        ended = [(r, e.end_weight_update.remote(version)) for r, e in enumerate(rollouts)]
        self.policy_version = min(rank_group.gather("rollout", ended, timeout))
        return sent

    def join_weight_gathers(self) -> int:
        """Ranks 1..n-1 under ZeRO-3, called by rank 0's sync: gather each bucket beside rank 0, which sends it."""
        return join_bucket_gathers(self.engine.module, self.args.sync_bucket_bytes)

    def push_weights(self) -> int:
        """This rank's weights to the engine worker on its GPU (CUDA IPC; `layout.EngineLayout`): the engine's first rank
        sends, the others' handles reach it through the gather; returns the bytes this rank sent."""
        layout, module, is_zero3 = self.args.engines, self.engine.module, self.engine.is_zero3
        index = layout.engine_of(self.rank)
        if index is None:  # no engine beside this rank (without vllm.num_engines one sits beside rank 0) ...
            return self.sender.send_beside(module, True, None, None) if is_zero3 else 0  # ... yet ZeRO-3 gathers
        target = rank_group.all_ranks(self.run, "rollout", index + 1)[index] if layout.leads(self.rank) else None
        feeders = layout.feeders(index) if layout.tensor_parallel_size > 1 else None
        return self.sender.send_beside(module, is_zero3, target, feeders)

    @stamped
    def write_metrics(self, step: int) -> MetricsRow:
        """Commit the step's metrics row, built from what the step committed (nothing from memory)."""
        if self.ledger.replay(step, METRICS.name):
            return MetricsRow(step=step, values=self._committed_row(step), replayed=True)
        self.ledger.begin(step, METRICS.name)
        entries = self.store.manifest()["steps"][str(step)]
        if step == 0:  # the evaluation before training (eval.at_start)
            values = eval_only_row(entries)
        else:
            tables = [self.store.read(step, s, METRIC_COLUMNS[s]) for s in (ROLLOUT.name, "reward", ADVANTAGE.name)]
            values = row_from_records(*tables, entries)
        self.ledger.commit(step, METRICS.name, metrics_table(step, values), None, {},
                           drop_from_hash=[k for k in values if k.startswith(VOLATILE_METRICS)])
        self.sinks.log(step, values)
        return MetricsRow(step=step, values=values)

    def _committed_row(self, step: int) -> dict[str, float]:
        row = self.store.read(step, METRICS.name).to_pylist()[0]
        return {k: v for k, v in row.items() if k != "step"}

    def committed_rows(self) -> list[MetricsRow]:
        """Every committed metrics row of the run, in step order (the UI's table after a resume)."""
        steps = sorted(int(k) for k, v in self.store.manifest()["steps"].items() if METRICS.name in v)
        return [MetricsRow(step=k, values=self._committed_row(k), replayed=True) for k in steps]

    @stamped
    def save_checkpoint(self, step: int) -> StageResult:
        return self.checkpoints.save(step)

    def save_share(self, step: int) -> str:
        """Ranks 1..n-1, called by rank 0's checkpoint save: this rank's part of the DeepSpeed checkpoint."""
        return self._save(step, {"step": step})

    def save_own(self, step: int) -> str:
        """Rank 0's part of a checkpoint: the client state resume needs, with the DeepSpeed state."""
        return self._save(step, {"step": step, "policy_version": self.policy_version,
                                 "kl_coef": self.kl_controller.coef, "rng": rng_state()})

    def _save(self, step: int, client_state: dict) -> str:
        uri = save_checkpoint(self.engine, self.args.ckpt_root, "actor", step, client_state)
        if self.args.save_hf:  # on every rank: ZeRO-3 gathers the weights from all of them, rank 0 writes
            export_hf(self.engine, f"{self.args.ckpt_root.rstrip('/')}/global_step{step}_hf", self.tokenizer)
        return uri

    def restore_share(self, step: int) -> int:
        """Ranks 1..n-1, called by rank 0's `restore`."""
        load_checkpoint(self.engine, self.args.ckpt_root, "actor", step)
        self.trained_step = step
        return step

    def restore(self, step: int) -> dict:
        """Load checkpoint `step` (the critic's too): weights, optimizer, scheduler, KL coefficient, RNG states."""
        self.checkpoints.restore_critic(step)
        peer_calls = rank_group.started_on_peers(self._peers(), "restore_share", step)
        state = rank_group.with_peers("actor", peer_calls, lambda: load_checkpoint(
            self.engine, self.args.ckpt_root, "actor", step), self.run.stage_timeout_s)
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
        """The run's final HF export, written by rank 0 while the other ranks join ZeRO-3's gather."""
        peer_calls = rank_group.started_on_peers(self._peers(), "export_share", out_uri)
        return rank_group.with_peers("actor", peer_calls, lambda: export_hf(self.engine, out_uri, self.tokenizer),
                                     self.run.stage_timeout_s)

    def export_share(self, out_uri: str) -> str:
        """Ranks 1..n-1, called by rank 0's `save_model`."""
        return export_hf(self.engine, out_uri, self.tokenizer)


class _ShardedPolicy:
    """The policy's no-grad logprobs of the advantage stage, every data-parallel group (a rank, or a ring of ranks)
    computing a share."""

    def __init__(self, worker: ActorWorker):
        self.worker = worker

    def logprobs(self, prompt_ids, response_ids, batching: MicroBatching) -> list[list[float]]:
        w = self.worker
        remote = [(rank, lambda p, r, peer=peer: peer.logprobs_of.remote(p, r))
                  for rank, peer in enumerate(w._peers(), start=1)]
        return rank_group.sharded_rows(prompt_ids, response_ids, "actor", remote, w.run.stage_timeout_s,
                                       local=lambda p, r: w.engine.logprobs(p, r, batching),
                                       ring_size=w.args.ds.ring_attn_size)
