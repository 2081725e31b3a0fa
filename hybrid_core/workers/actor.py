"""ActorWorker: the Ray actor of one policy rank: the stages the tasks call on rank 0 (experience, train, sync, the
metrics row, checkpoints) and the shares rank 0 calls on the other ranks.

Its collaborators are explicit: `PolicyRank` (this rank's DeepSpeed engine), `PolicyLead` (rank 0's calls to the
other ranks, the critic and the rollout engines), `ExperienceStage`, `MetricsRows` and `CheckpointKeeper`; what a
stage measures is committed through the step ledger. It holds the KL controller and the engines' policy version.
It knows nothing about Prefect.
"""
from __future__ import annotations

from dataclasses import dataclass

from hybrid_core.algorithms.experience import ActorLossSettings, AdvantageSettings, PenaltySettings
from hybrid_core.algorithms.kl import AdaptiveKLController, FixedKLController
from hybrid_core.config import ActorConfig, DsConfig, KlConfig, TrainConfig
from hybrid_core.data.metric_sinks import SinkSettings
from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.data.stage_tables import experience_figures
from hybrid_core.engines.actor_trainer import ISCorrection
from hybrid_core.engines.checkpoint import rng_state, set_rng_state
from hybrid_core.engines.deepspeed_train import clear_stale_build_locks
from hybrid_core.engines.sequence_batch import MicroBatching
from hybrid_core.layout import EngineLayout
from hybrid_core.step_contract import ADVANTAGE, SYNC, TRAIN
from hybrid_core.types import MetricsRow, RunRef, StageResult
from hybrid_core.workers.checkpoints import CheckpointKeeper
from hybrid_core.workers.experience_stage import ExperienceStage
from hybrid_core.workers.faults import FaultPoints
from hybrid_core.workers.metrics_rows import MetricsRows
from hybrid_core.workers.policy_lead import PolicyLead
from hybrid_core.workers.policy_rank import PolicyRank
from hybrid_core.workers.remote_forwards import RemoteForwards
from hybrid_core.workers.stage_clock import freeze_startup_heap, stamped
from hybrid_core.workers.step_ledger import StepLedger, check_reproduced, result_from_entry


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
    """Rank `rank` of the policy's data-parallel ranks; the tasks call rank 0, which leads the others and the critic
    (`PolicyLead`); the ranks call each other's `*_share` methods and the rest only delegates to `PolicyRank`."""

    PRELOAD = ("deepspeed", "transformers")  # imported while the other workers start (placement.deferred)

    def __init__(self, run: RunRef, args: ActorWorkerArgs, rank: int = 0):
        clear_stale_build_locks(args.extensions_dir)
        self.run, self.args, self.rank = run, args, rank
        store = RolloutStore(run.run_dir)
        self.ledger = StepLedger(store, FaultPoints(args.faults, store.log_event))
        self.policy = PolicyRank(args, rank, self.ledger, run.stage_timeout_s)
        self.kl_controller = make_kl_controller(args.kl)
        self.policy_version = 0
        ranks = dict(args.role_ranks)
        self.lead = PolicyLead(run, num_ranks=ranks.get("actor", 1), num_engines=args.engines.num_engines,
                               has_critic="critic" in args.roles)
        forwards = RemoteForwards(run, args.roles, ranks, args.ds.ring_attn_size)
        self.experience = ExperienceStage(args, self.ledger, self.lead, self.policy, forwards)
        self.rows = MetricsRows(self.ledger, args.sinks) if rank == 0 else None
        self.checkpoints = CheckpointKeeper(args, self.ledger, self.lead, self.rows) if rank == 0 else None
        freeze_startup_heap()

    def ready(self) -> dict:
        return {"policy_version": self.policy_version, "trained_step": self.policy.trained_step}

    @stamped
    def make_experience(self, step: int) -> StageResult:
        return self.experience.run(step, self.kl_controller.coef, self.clock)

    def start_forwards(self, step: int) -> bool:
        """Called as the reward stage begins (see `ExperienceStage.start_forwards`)."""
        return self.experience.start_forwards(step)

    @stamped
    def train(self, step: int) -> StageResult:
        committed = self.ledger.entry(step, TRAIN.name)
        if self.policy.trained_step >= step:  # a re-attached actor that already trained this step
            return result_from_entry(TRAIN.name, step, committed, replayed=True)
        self.policy.check_weights(step, TRAIN.name)
        self.ledger.begin(step, TRAIN.name)
        stats = self._train_ranks(step)
        if committed is not None:  # trained again after a restore: it must reproduce what it committed
            check_reproduced(step, TRAIN.name, committed["metrics"], stats, REPLAY_TOLERANCE[self.args.train.device])
            return self._reproduced(step, TRAIN.name, committed)
        return result_from_entry(TRAIN.name, step, self.ledger.record(step, TRAIN.name, self.clock, stats))

    def _train_ranks(self, step: int) -> dict:
        """The critic's update, then every policy rank's; the KL controller follows the step's KL."""
        experience = experience_figures(self.ledger.entry(step, ADVANTAGE.name))
        kl_coef = self.kl_controller.coef
        critic = self.lead.train_critic(step)
        policy = self.lead.train(step, kl_coef, lambda: self.train_share(step, kl_coef))
        stats = experience | critic | policy
        self.kl_controller.update(stats.get("experience_kl_seq", 0.0), int(experience.get("num_samples", 0)))
        return stats

    def _reproduced(self, step: int, stage: str, committed: dict) -> StageResult:
        """A stage done again after a restore: its committed record stands."""
        self.ledger.seconds(step, stage)
        self.ledger.store.log_event(step, stage, "reproduced")
        return result_from_entry(stage, step, committed, replayed=True)

    def train_share(self, step: int, kl_coef: float) -> dict:
        """This rank's part of step `step`'s policy update (ranks 1..n-1 are called by rank 0's `train`)."""
        stats = self.policy.fit(step, kl_coef)
        self.policy.trained_step = step
        return stats

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
            return self._reproduced(step, SYNC.name, committed)
        stats = {"bytes": float(sent), "sync/bytes": float(sent), "timing_s/ds_sleep_wait": waited}
        return result_from_entry(SYNC.name, step, self.ledger.record(step, SYNC.name, self.clock, stats,
                                                                     policy_version=step))

    def finish_sleeps(self, unless_free_share: float | None = None) -> float:
        """Every rank's DeepSpeed sleep that `train_share` started is done and its GPU memory free, except on a rank
        whose GPU has `unless_free_share` of its memory free already (the copy then runs on beside the rollout; the
        next call that touches the optimizer finishes it); returns the seconds this rank waited."""
        return self.lead.finish_sleeps(unless_free_share, lambda: self.finish_sleep(unless_free_share))

    def finish_sleep(self, unless_free_share: float | None = None) -> float:
        """This rank's part of `finish_sleeps` (ranks 1..n-1 are called by rank 0)."""
        return self.policy.finish_sleep(unless_free_share)

    def push_to_engines(self, version: int) -> int:
        """Every rollout engine loads this policy's weights, then holds `version`; returns the bytes of one copy
        (also how restored weights reach the engines when workers start)."""
        self.lead.begin_weight_update()
        if self.args.sync_transport == "cuda_ipc":  # every rank feeds the engine worker on its own GPU
            sent = self.lead.push_weights(self.push_weights)
        else:  # rank 0 sends; under ZeRO-3 the other ranks join the gather of each bucket
            send = lambda: self.policy.send_weights(self.lead.engines)  # noqa: E731
            sent = self.lead.join_weight_gathers(self.policy.engine.is_zero3, send)
        self.policy_version = self.lead.end_weight_update(version)
        return sent

    def join_weight_gathers(self) -> int:
        """Ranks 1..n-1 under ZeRO-3, called by rank 0's sync."""
        return self.policy.join_weight_gathers()

    def push_weights(self) -> int:
        """This rank's weights to the engine worker on its GPU (CUDA IPC), called by rank 0's sync."""
        return self.policy.push_weights(self.lead.engine)

    @stamped
    def write_metrics(self, step: int, step_started_at: float | None = None) -> MetricsRow:
        """Commit the step's metrics row, built from what the step committed (nothing from memory); async mode adds
        the step's wall time since the driver began it (`step_started_at`, a wall clock)."""
        return self.rows.write(step, step_started_at)

    def committed_rows(self) -> list[MetricsRow]:
        """Every committed metrics row of the run, in step order (the UI's table after a resume)."""
        return self.rows.every()

    @stamped
    def save_checkpoint(self, step: int) -> StageResult:
        return self.checkpoints.save(step, self.clock, lambda: self.policy.save(step, self._client_state(step)))

    def _client_state(self, step: int) -> dict:
        """What a resume needs of rank 0 beside DeepSpeed's state."""
        return {"step": step, "policy_version": self.policy_version, "kl_coef": self.kl_controller.coef,
                "rng": rng_state()}

    def save_share(self, step: int) -> str:
        """Ranks 1..n-1, called by rank 0's checkpoint save: this rank's part of the DeepSpeed checkpoint."""
        return self.policy.save(step, {"step": step})

    def restore_share(self, step: int) -> int:
        """Ranks 1..n-1, called by rank 0's `restore`."""
        self.policy.load(step)
        return step

    def restore(self, step: int) -> dict:
        """Load checkpoint `step` (the critic's too): weights, optimizer, scheduler, KL coefficient, RNG states; the
        rollout engines get the weights by `sync(step)` or `push_to_engines`."""
        self.lead.restore_critic(step)
        state = self.lead.restore(step, lambda: self.policy.load(step))
        self.ledger.store.log_event(step, "checkpoint", "restore")
        self.kl_controller.coef = state["kl_coef"]
        set_rng_state(state["rng"])
        return self.ready()

    def close(self) -> None:
        """Flush the metric sinks before the run's actors are killed."""
        if self.rows is not None:
            self.rows.close()

    def logprobs_of(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        return self.policy.logprobs(prompt_ids, response_ids)

    def ref_logprobs_of(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """A LoRA policy's reference logprobs (its base), called by rank 0's advantage stage on ranks 1..n-1."""
        return self.policy.ref_logprobs(prompt_ids, response_ids)

    def save_model(self, out_uri: str) -> str:
        """The run's final HF export, written by rank 0 while the other ranks join ZeRO-3's gather."""
        return self.lead.export(out_uri, lambda: self.policy.export(out_uri))

    def export_share(self, out_uri: str) -> str:
        """Ranks 1..n-1, called by rank 0's `save_model`."""
        return self.policy.export(out_uri)
