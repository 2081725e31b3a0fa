"""CriticWorker: the Ray actor owning the DeepSpeed value model (estimator `gae`): values and critic updates.

Methods only delegate to `engines` and read the committed datasets; it knows nothing about Prefect.
"""
from __future__ import annotations

from dataclasses import dataclass

from hybrid_core.config import CriticConfig, DsConfig, TrainConfig
from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.data.stage_tables import action_masks
from hybrid_core.engines.checkpoint import load_checkpoint, save_checkpoint
from hybrid_core.engines.critic_trainer import CriticSamples, fit_critic
from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine, clear_stale_build_locks, start_sleep_buffer
from hybrid_core.engines.frozen_model import attn_implementation_for, load_tokenizer
from hybrid_core.engines.minibatch_updates import BatchPlan
from hybrid_core.engines.sequence_batch import MicroBatching
from hybrid_core.engines.value_model import batched_values, load_value_model
from hybrid_core.step_contract import derive_seed
from hybrid_core.types import RunRef
from hybrid_core.workers import rank_group


@dataclass(frozen=True, kw_only=True)
class CriticWorkerArgs:
    model_path: str
    critic: CriticConfig
    ds: DsConfig
    train: TrainConfig
    forward_batching: MicroBatching  # the advantage stage's no-grad value forwards
    train_batching: MicroBatching    # the critic update's micro-batches
    total_optimizer_steps: int
    extensions_dir: str
    ckpt_root: str
    num_ranks: int  # data-parallel ranks; the actor calls rank 0, which leads the others (`rank_group`)


class CriticWorker:
    PRELOAD = ("deepspeed", "transformers")  # imported while the other workers start (placement.deferred)

    def __init__(self, run: RunRef, args: CriticWorkerArgs, rank: int = 0):
        clear_stale_build_locks(args.extensions_dir)
        self.run, self.args, self.store, self.rank = run, args, RolloutStore(run.run_dir), rank
        pad_id = load_tokenizer(args.model_path).pad_token_id
        sleep_buffer = start_sleep_buffer(args.model_path, args.ds, args.num_ranks)  # pinned while the model loads
        model = load_value_model(args.model_path, args.ds.param_dtype, args.ds.value_head_prefix,
                                 attn_implementation_for(args.ds.packing_samples, args.ds.ring_attn_size > 1,
                                                         args.ds.packed_attention),
                                 args.ds.use_liger_kernel)
        self.engine = DeepSpeedTrainEngine(model, args.critic, args.ds, args.train, args.total_optimizer_steps, pad_id,
                                           sleep_buffer)
        self.engine.sleep()
        self.trained_step, self.last_metrics = 0, {}

    def ready(self) -> dict:
        return {"trained_step": self.trained_step}

    def _peers(self) -> list[tuple[int, object]]:
        """(rank, handle) of ranks 1..n-1, which rank 0 leads (none on the other ranks)."""
        peers = rank_group.peers(self.run, "critic", self.args.num_ranks) if self.rank == 0 else []
        return list(enumerate(peers, start=1))

    def save_checkpoint(self, step: int) -> str:
        """DeepSpeed saves collectively: rank 0 starts the other ranks' saves."""
        peer_calls = [(rank, peer.save_checkpoint.remote(step)) for rank, peer in self._peers()]
        return rank_group.with_peers("critic", peer_calls, lambda: save_checkpoint(
            self.engine, self.args.ckpt_root, "critic", step, {"step": step}), self.run.stage_timeout_s)

    def restore(self, step: int) -> dict:
        peer_calls = [(rank, peer.restore.remote(step)) for rank, peer in self._peers()]
        rank_group.with_peers("critic", peer_calls, lambda: load_checkpoint(
            self.engine, self.args.ckpt_root, "critic", step), self.run.stage_timeout_s)
        self.trained_step = step
        return self.ready()

    def values(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        self.engine.engine.eval()
        return batched_values(self.engine.engine, prompt_ids, response_ids, self.engine.pad_id,
                              self.args.forward_batching, self.engine.ring, self.engine.forward_count)

    def train(self, step: int) -> dict:
        """The critic's update of step `step` (called by the actor's rank 0, which leads the step's training);
        returns its namespaced figures."""
        if self.trained_step >= step:  # a re-attached critic that already trained this step
            return self.last_metrics
        peer_calls = [(rank, peer.train.remote(step)) for rank, peer in self._peers()]  # each trains on its share
        stats = rank_group.with_peers("critic", peer_calls, lambda: self._fit(step), self.run.stage_timeout_s)
        self.trained_step = step
        self.last_metrics = {"critic/value_loss": stats["value_loss"], "critic/grad_norm": stats.get("grad_norm", 0.0)}
        return self.last_metrics

    def _fit(self, step: int) -> dict:
        ro, adv = self.store.read(step, "rollout"), self.store.read(step, "advantage")
        samples = CriticSamples(ro.column("prompt_ids").to_pylist(), ro.column("response_ids").to_pylist(),
                                adv.column("values").to_pylist(), adv.column("returns").to_pylist(), action_masks(ro))
        t = self.args.train
        self.engine.wake_up()
        stats = fit_critic(self.engine, samples, self.args.critic.value_clip,
                           BatchPlan(batch_size=t.batch_size, batching=self.args.train_batching,
                                     max_epochs=t.max_epochs, seed=derive_seed(t.seed, step, "critic-batches")))
        self.engine.sleep()
        return stats
