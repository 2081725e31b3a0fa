"""One rank of the policy: its DeepSpeed engine and what the rank does with it — its share of a step's update, its
sleep, its part of a weight sync, its checkpoint shard, the HF export, no-grad logprobs — and the step it trained.

Every rank has one (rank 0 leads the others through `policy_lead`). It reads the step's committed samples through the
ledger; it knows nothing about the other ranks, the stages' records or Prefect.
"""
from __future__ import annotations

import dataclasses
import time

from hybrid_core.data.stage_tables import action_masks, experience_figures
from hybrid_core.engines.actor_trainer import TrainSamples, fit_actor
from hybrid_core.engines.checkpoint import export_hf, load_checkpoint, save_checkpoint
from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine, load_policy, start_sleep_buffer
from hybrid_core.engines.ema import EmaWeights
from hybrid_core.engines.experience_maker import OLD_FROM_UPDATE
from hybrid_core.engines.frozen_model import load_tokenizer, memory_peak_gib, reset_memory_peak
from hybrid_core.engines.lora_policy import reference_forward
from hybrid_core.engines.minibatch_updates import BatchPlan
from hybrid_core.engines.sequence_batch import MicroBatching
from hybrid_core.engines.weight_sync import join_bucket_gathers
from hybrid_core.step_contract import ADVANTAGE, ROLLOUT, derive_seed, generating_version
from hybrid_core.workers.step_ledger import StepLedger
from hybrid_core.workers.weight_sender import WeightSender


class PolicyRank:
    """Rank `rank` of the policy, built from the actor's arguments (`ActorWorkerArgs`)."""

    def __init__(self, args, rank: int, ledger: StepLedger, timeout_s: float):
        self.args, self.rank, self.ledger, self.store = args, rank, ledger, ledger.store
        self.tokenizer = load_tokenizer(args.model_path)
        num_ranks = dict(args.role_ranks).get("actor", 1)
        sleep_buffer = start_sleep_buffer(args.model_path, args.ds, num_ranks)  # allocated while the model loads
        policy = load_policy(args.model_path, args.actor, args.ds, args.train.seed)
        self.engine = DeepSpeedTrainEngine(policy, args.actor, args.ds, args.train, args.total_optimizer_steps,
                                           self.tokenizer.pad_token_id, sleep_buffer)
        if args.train.enable_ema and rank == 0:  # the ranks' weights are equal (ZeRO ≤ 2): rank 0 keeps the average
            self.engine.ema = EmaWeights(self.engine.module, args.train.ema_beta)
        self.engine.sleep()
        self.sender = WeightSender(args.sync_transport, args.sync_bucket_bytes, timeout_s)
        self.trained_step = 0

    def check_weights(self, step: int, stage: str) -> None:
        """Refuse a stage of step `step` unless this rank holds the weights that generated it."""
        if self.trained_step != generating_version(step):
            raise RuntimeError(f"actor rank {self.rank} holds the weights of step {self.trained_step}; {stage} of step "
                               f"{step} needs version {generating_version(step)}: restore a checkpoint first")

    def fit(self, step: int, kl_coef: float) -> dict:
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

    def _train_samples(self, step: int) -> TrainSamples:
        ro, adv = self.store.read(step, ROLLOUT.name), self.store.read(step, ADVANTAGE.name)
        column = lambda table, name: table.column(name).to_pylist()  # noqa: E731
        old_from_update = OLD_FROM_UPDATE in experience_figures(self.ledger.entry(step, ADVANTAGE.name))
        engine_logprobs = ro.column("rollout_logprobs")  # null: the engine was asked for none
        return TrainSamples(column(ro, "prompt_ids"), column(ro, "response_ids"),
                            None if old_from_update else column(adv, "old_logprobs"),
                            column(adv, "ref_logprobs") if self.args.kl.init_coef > 0 else None,
                            column(adv, "advantages"),
                            None if engine_logprobs.null_count else engine_logprobs.to_pylist(), action_masks(ro))

    def _batch_plan(self, step: int) -> BatchPlan:
        t = self.args.train
        return BatchPlan(batch_size=t.batch_size, batching=self.args.train_batching, max_epochs=t.max_epochs,
                         seed=derive_seed(t.seed, step, "actor-batches"))

    def finish_sleep(self, unless_free_share: float | None = None) -> float:
        """This rank's DeepSpeed sleep done, unless its GPU has `unless_free_share` free already; seconds waited."""
        return self.engine.finish_sleep(unless_free_share)

    def send_weights(self, engines: list) -> int:
        """Rank 0 alone sends every bucket to the engines (object store or broadcast); the bytes of one copy."""
        return self.sender.send(self.engine.module, self.engine.is_zero3, engines)

    def join_weight_gathers(self) -> int:
        """Ranks 1..n-1 under ZeRO-3: gather each bucket beside rank 0, which sends it."""
        return join_bucket_gathers(self.engine.module, self.args.sync_bucket_bytes)

    def push_weights(self, engine_of) -> int:
        """This rank's weights to the engine worker on its GPU (CUDA IPC; `layout.EngineLayout`): the engine's first
        rank sends (`engine_of(index)`: the engine's handle), the others' handles reach it through the gather;
        returns the bytes this rank sent."""
        layout, module, is_zero3 = self.args.engines, self.engine.module, self.engine.is_zero3
        index = layout.engine_of(self.rank)
        if index is None:  # no engine beside this rank (without vllm.num_engines one sits beside rank 0) ...
            return self.sender.send_beside(module, True, None, None) if is_zero3 else 0  # ... yet ZeRO-3 gathers
        target = engine_of(index) if layout.leads(self.rank) else None
        feeders = layout.feeders(index) if layout.tensor_parallel_size > 1 else None
        return self.sender.send_beside(module, is_zero3, target, feeders)

    def save(self, step: int, client_state: dict) -> str:
        """This rank's part of DeepSpeed checkpoint `step` (and of its HF export with ckpt.save_hf); rank 0's EMA
        goes in its client state."""
        if self.engine.ema is not None:
            client_state = client_state | {"ema": self.engine.ema.state_dict()}
        uri = save_checkpoint(self.engine, self.args.ckpt_root, "actor", step, client_state)
        if self.args.save_hf:  # on every rank: ZeRO-3 gathers the weights from all of them, rank 0 writes
            self.export(f"{self.args.ckpt_root.rstrip('/')}/global_step{step}_hf")
        return uri

    def load(self, step: int) -> dict:
        """Checkpoint `step` into this rank's engine (and EMA); its client state. The rank then holds version
        `step`."""
        state = load_checkpoint(self.engine, self.args.ckpt_root, "actor", step)
        if self.engine.ema is not None:
            self.engine.ema.load_state_dict(state["ema"])
        self.trained_step = step
        return state

    def export(self, out_uri: str) -> str:
        return export_hf(self.engine, out_uri, self.tokenizer, self.args.ds.lora.save_merged)

    def ref_logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]],
                     batching: MicroBatching | None = None) -> list[list[float]]:
        """A LoRA policy's reference logprobs: its base with the adapters off, which is the initial policy."""
        with reference_forward(self.engine.module):
            return self.logprobs(prompt_ids, response_ids, batching)

    def logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]],
                 batching: MicroBatching | None = None) -> list[list[float]]:
        return self.engine.logprobs(prompt_ids, response_ids, batching or self.args.experience_batching)
