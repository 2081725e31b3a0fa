"""RolloutWorker: the Ray actor owning one vLLM engine, the prompt sampler (with oversampling, the prompt ledger's
batches: `rollout_surplus`) and the run's reward source.

Methods only delegate to `engines` and move datasets in and out of the run's store through the step ledger; the
reward source is scored here, beside generation, as in OpenRLHF. It knows nothing about Prefect.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa
import torch

from hybrid_core.data.prompts import PromptRow, PromptSampler, load_prompt_rows, step_count
from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.data.stage_tables import response_token_count
from hybrid_core.engines.agent_rollout import AgentSettings, EpisodeRun, generate_episode_rows, summed_figures
from hybrid_core.engines.frozen_model import load_tokenizer
from hybrid_core.engines.rollout_step import (GroupFilter, PromptFormat, filtered_rollout, generate_rows, reward_rows,
                                             taking_from)
from hybrid_core.engines.sync_group import WeightSyncGroup
from hybrid_core.engines.vllm_rollout import EngineSettings, SamplingSettings, VllmRolloutEngine
from hybrid_core.engines.weight_sync import Bucket, SharedBucket, unflatten
from hybrid_core.rewards.agents import load_agent_executor
from hybrid_core.rewards.sources import (EpisodeRewardSource, RewardModelSource, RewardSource, RewardSourceSpec,
                                         open_reward_source)
from hybrid_core.step_contract import REWARD, ROLLOUT, consumable_versions
from hybrid_core.types import RunRef, Sample, StageResult
from hybrid_core.workers import rank_group
from hybrid_core.workers.evaluation import EvalSettings, Evaluator
from hybrid_core.workers.faults import FaultPoints
from hybrid_core.workers.rollout_ahead import AheadGeneration, EngineTurns, async_figures
from hybrid_core.workers.rollout_surplus import Oversampling, StepBatch, SurplusBatches, oldest_version
from hybrid_core.workers.stage_clock import freeze_startup_heap, stamped
from hybrid_core.workers.step_ledger import StepLedger


@dataclass(frozen=True, kw_only=True)
class PromptSource:
    dataset: str  # a comma list of sources, mixed by `probs` (seeded by `seed`) or concatenated
    probs: str | None
    split: str
    input_key: str
    label_key: str | None
    max_samples: int
    batch_size: int
    num_episodes: int
    max_steps: int | None
    seed: int
    is_oversampling: bool = False  # a step's batch_size groups come from the prompt ledger's stream (`step_count`)

    def rows(self) -> list[PromptRow]:
        return load_prompt_rows(self.dataset, self.input_key, self.label_key, split=self.split,
                                max_samples=self.max_samples, probs=self.probs, seed=self.seed)

    def num_steps(self) -> int:
        """The run's step count as the worker's sampler counts it (the driver asks while the workers start)."""
        return step_count(len(self.rows()), self.batch_size, self.num_episodes, self.max_steps, self.is_oversampling)


@dataclass(frozen=True, kw_only=True)
class RolloutWorkerArgs:
    engine: EngineSettings
    prompts: PromptSource
    prompt_format: PromptFormat
    sampling: SamplingSettings
    reward: RewardSourceSpec
    seed: int
    group_filter: GroupFilter | None
    num_engines: int  # rank 0 coordinates: it samples the prompts, shares them out and commits the datasets
    reward_model_ranks: int  # 0: reward.remote_url scores; else the reward model's ranks score (`score`)
    is_reward_normalized: bool  # reward.normalize_enable (the model's raw value is then logged beside)
    eval: EvalSettings | None  # None: the run has no eval.dataset
    agent: AgentSettings | None = None  # train.agent_func_path: every sample an episode of the agent's environment
    partial_rollout: bool = False  # train.partial_rollout_enable: a batch generating ahead pauses for weight pushes
    generate_batch_size: int | None = None  # oversampling (async): rollout.vllm_generate_batch_size prompts a batch
    faults: tuple = ()


class RolloutWorker:
    PRELOAD = ("vllm", "vllm.entrypoints.llm")  # imported while the other workers start (placement.deferred)

    def __init__(self, run: RunRef, args: RolloutWorkerArgs, rank: int = 0):
        self.run, self.args, self.rank = run, args, rank
        self.store = RolloutStore(run.run_dir)
        self.ledger = StepLedger(self.store, FaultPoints(args.faults, self.store.log_event))
        self.tokenizer = load_tokenizer(args.engine.model_path)
        p = args.prompts
        self.sampler = PromptSampler(p.rows(), p.batch_size, p.num_episodes, args.seed, p.max_steps,
                                     p.is_oversampling)
        self.surplus = self.oversampled_batches() if args.generate_batch_size else None
        self.reward_source = open_reward_source(args.reward)
        self.agent = load_agent_executor(args.agent.path) if args.agent is not None else None
        self.engine = VllmRolloutEngine(args.engine)
        self.evaluator = Evaluator(self, args.eval) if args.eval is not None else None
        self.policy_version = 0
        self.turns = EngineTurns()  # the engine's lock: async mode generates ahead while other calls are served
        self.is_pausing = False  # partial rollout: the batch generating now pauses for weight pushes
        self.ahead = AheadGeneration(self)
        if args.engine.enable_sleep:  # the weights from disk are version 0: keep them even at sleep level 2
            self.engine.sleep(level=1)
        freeze_startup_heap()

    def oversampled_batches(self) -> SurplusBatches:
        args = self.args
        settings = Oversampling(batch_size=args.prompts.batch_size, generate_batch_size=args.generate_batch_size,
                                n=args.sampling.n, queue_size=self.run.async_queue_size,
                                group_filter=args.group_filter)
        return SurplusBatches(self.store, self.sampler, settings)

    def info(self) -> dict:
        return {"num_steps": self.sampler.num_steps, "policy_version": self.policy_version}

    @stamped
    def generate(self, step: int, waited_s: float = 0.0) -> StageResult:
        """The rollout stage: replay the committed batch, take the one generated ahead (async mode: `waited_s` is
        how long the driver waited for it), or generate it now."""
        versions = consumable_versions(step, self.run.async_queue_size)
        if entry := self.ledger.replay(step, ROLLOUT.name, versions):  # generated by a policy it may use: replay
            return StageResult(stage=ROLLOUT.name, step=step, seconds=0.0, rows=entry["rows"], replayed=True,
                               path=self.store.stage_uri(step, ROLLOUT.name))
        if self.run.async_queue_size and (ahead := self.store.ahead_entry(step, ROLLOUT.name)) is not None:
            return self.ahead.take(step, ahead, waited_s)
        with self.turns.lock:
            self.check_policy_version(step)
            self.ledger.begin(step, ROLLOUT.name)
            batch, metrics = self.generate_awake(step)
        table, version = batch.rollout, oldest_version(batch.rollout, self.policy_version)
        metrics["tokens"] = float(response_token_count(table))
        if self.run.async_queue_size:
            metrics |= async_figures(step, version, waited_s)
        beside = {name: (t, oldest_version(t, self.policy_version), batch.records.get(name, {}))
                  for name, t in batch.beside().items()}
        entry = self.ledger.commit(step, ROLLOUT.name, table, self.clock, metrics, version=version, beside=beside)
        return StageResult(stage=ROLLOUT.name, step=step, seconds=entry["seconds"], rows=table.num_rows,
                           path=self.store.stage_uri(step, ROLLOUT.name), metrics=entry["metrics"])

    def generate_ahead(self, step: int) -> dict:
        """Async mode, in the `generation` concurrency group: generate step `step`'s batch now, while the driver
        runs earlier steps (see `rollout_ahead`)."""
        return self.ahead.generate(step)

    def settle(self) -> dict:
        """Async mode, on re-attaching to live workers: wait for a batch still generating (see `rollout_ahead`)."""
        return self.ahead.settle()

    def generate_awake(self, step: int, pausing: bool = False) -> tuple[StepBatch, dict]:
        """Wake the engines, generate step `step`'s batch, sleep them (with vllm.enable_sleep); the engine's turn is
        the caller's. `pausing` (partial rollout): this engine's share pauses for weight pushes between its engine
        steps (the other engines' shares finish with the version they began with)."""
        start = time.perf_counter()
        self.engine.wake_up(["weights", "kv_cache"])
        awake = time.perf_counter()
        self.is_pausing = pausing
        try:
            batch, metrics = self._generate(step)
        finally:
            self.is_pausing = False
        sleep_start = time.perf_counter()
        if self.args.engine.enable_sleep:
            self.engine.sleep()
        metrics |= {"timing_s/vllm_wake": awake - start, "timing_s/generate": sleep_start - awake,
                    "timing_s/vllm_sleep": time.perf_counter() - sleep_start}
        return batch, metrics

    def _generate(self, step: int) -> tuple[StepBatch, dict]:
        shares: list[pa.Table] = []
        generate = lambda batch: self._generate_shared_out(batch, step, shares)  # noqa: E731
        score = lambda table: reward_rows(table, self.reward_source_for(table))  # noqa: E731
        if self.surplus is not None:
            batch, figures = self.surplus.compose(step, generate, score)
        else:
            table, figures = self._step_rows(step, generate, score)
            batch = StepBatch(tables={ROLLOUT.name: table.replace_schema_metadata(None)})
        if self.agent is not None:  # the counters travel in the shares' metadata; the committed tables have none
            figures |= summed_figures(shares)
        return batch, figures

    def _step_rows(self, step: int, generate, score) -> tuple[pa.Table, dict]:
        """Step k's own prompts (`PromptSampler.for_step`), dynamic filtering refilling from the other rows."""
        prompts = self.sampler.for_step(step)
        if self.args.group_filter is None:
            return generate(prompts), {}
        refill = self.sampler.refill_for_step(step, {p.index for p in prompts})
        filtered = filtered_rollout(generate, score, prompts, taking_from(refill), len(prompts), self.args.sampling.n,
                                    self.args.group_filter)
        return filtered.rows, {"filter/pass_rate": filtered.pass_rate}

    def _generate_shared_out(self, prompts: list, step: int, shares: list[pa.Table]) -> pa.Table:
        """Generate on every engine: engine r takes the r-th contiguous share of the prompts; rows keep prompt order
        (seeds are per prompt, so which engine generates a prompt does not change its samples)."""
        engines = rank_group.peers(self.run, ROLLOUT.role, self.args.num_engines)
        bounds = rank_group.share_bounds(len(prompts), self.args.num_engines)
        pending = [(rank, peer.generate_share.remote(prompts[a:b], step))
                   for rank, (peer, (a, b)) in enumerate(zip(engines, bounds[1:]), start=1) if b > a]
        own = self.generate_share(prompts[bounds[0][0]:bounds[0][1]], step)
        tables = [own, *rank_group.gather(ROLLOUT.role, pending, self.run.stage_timeout_s)]
        shares.extend(tables)
        return pa.concat_tables(tables)

    def pause_point(self) -> int:
        """Partial rollout, between engine steps: let a waiting weight push load; the version now held."""
        self.turns.pause_point()
        return self.policy_version

    def check_policy_version(self, step: int) -> None:
        """The engine must hold a version step `step` may consume: k − 1 in sync mode (see `consumable_versions`)."""
        versions = consumable_versions(step, self.run.async_queue_size)
        if self.policy_version not in versions:
            wanted = versions[0] if len(versions) == 1 else f"one of {list(versions)}"
            raise RuntimeError(f"rollout engine {self.rank} holds policy version {self.policy_version}, step {step} "
                               f"needs {wanted}: sync the restored weights first")

    def generate_share(self, prompts: list, step: int) -> pa.Table:
        """This engine's rows for `prompts` (other ranks wake for it and sleep again afterwards)."""
        if self.rank:  # rank 0 checked its version and woke up in `generate`
            self.check_policy_version(step)
            self.engine.wake_up(["weights", "kv_cache"])
        table = self.rows_of(prompts, self.args.sampling, step)
        if self.rank and self.args.engine.enable_sleep:
            self.engine.sleep()
        return table

    def rows_of(self, prompts: list, sampling: SamplingSettings, step: int | str) -> pa.Table:
        """`sampling.n` samples of each prompt: one generation each, or with an agent one episode each."""
        if self.agent is None:
            pause_point = self.pause_point if self.is_pausing else None
            return generate_rows(self.engine, self.tokenizer, prompts, self.args.prompt_format, sampling,
                                 self.args.seed, step, self.policy_version, pause_point)
        fmt = self.args.prompt_format
        run = EpisodeRun(engine=self.engine, tokenizer=self.tokenizer, executor=self.agent, settings=self.args.agent,
                         sampling=sampling, seed=self.args.seed, step=step)
        return generate_episode_rows(run, prompts, fmt.apply_chat_template, fmt.input_template, self.policy_version)

    @stamped
    def score(self, step: int) -> StageResult:
        """The reward stage: scores the committed batch, recorded with the batch's policy version."""
        version = self.ledger.entry(step, ROLLOUT.name)["policy_version"]
        if entry := self.ledger.replay(step, REWARD.name, version):
            return StageResult(stage=REWARD.name, step=step, seconds=0.0, rows=entry["rows"], replayed=True,
                               path=self.store.stage_uri(step, REWARD.name))
        self.ledger.begin(step, REWARD.name)
        rollout = self.store.read(step, ROLLOUT.name)
        table = reward_rows(rollout, self.reward_source_for(rollout))
        entry = self.ledger.commit(step, REWARD.name, table, self.clock, {}, version=version)
        return StageResult(stage=REWARD.name, step=step, seconds=entry["seconds"], rows=table.num_rows,
                           path=self.store.stage_uri(step, REWARD.name), metrics=entry["metrics"])

    @stamped
    def evaluate(self, step: int) -> StageResult:
        """The eval stage after step `step` (0: the initial policy), served by rank 0 (async mode: after the batch
        generating, which has the same weights)."""
        with self.turns.lock:
            return self.evaluator.run(step)

    def evaluate_share(self, prompts: list, step: int) -> pa.Table:
        return self.evaluator.share(prompts, step)

    def reward_source_for(self, rollout: pa.Table) -> RewardSource:
        """The run's reward source; an agent's episodes carry their rewards; the reward model's is bound to the
        step's token ids, and its ranks each score a contiguous share of them (as the actor leads the reference's
        forwards)."""
        if self.agent is not None:
            return EpisodeRewardSource(rewards=rollout.column("episode_reward").to_pylist(),
                                       scores=rollout.column("episode_score").to_pylist(),
                                       turns=rollout.column("turns").to_pylist())
        if not self.args.reward_model_ranks:
            return self.reward_source
        ranks = rank_group.all_ranks(self.run, "reward", self.args.reward_model_ranks)
        remote = [(rank, lambda p, r, w=w: w.rewards.remote(p, r)) for rank, w in enumerate(ranks)]
        forward = lambda p, r: rank_group.sharded_rows(p, r, "reward", remote, self.run.stage_timeout_s)  # noqa: E731
        return RewardModelSource(prompt_ids=rollout.column("prompt_ids").to_pylist(),
                                 response_ids=rollout.column("response_ids").to_pylist(), forward=forward,
                                 is_normalized=self.args.is_reward_normalized)

    def preview(self, step: int, num_samples: int = 4) -> list[Sample]:
        """A few decoded samples of the step with their rewards (for the run's UI)."""
        ro = self.store.read(step, ROLLOUT.name, ["prompt_text", "response_text"]).slice(0, num_samples)
        rw = self.store.read(step, REWARD.name, ["reward"]).slice(0, num_samples)
        rows = zip(ro.column("prompt_text").to_pylist(), ro.column("response_text").to_pylist(),
                   rw.column("reward").to_pylist())
        return [Sample(prompt=p, response=r, reward=x) for p, r, x in rows]

    def begin_weight_update(self) -> None:
        self.turns.begin_update()  # async mode: a batch still generating finishes with the weights it began with
        self.engine.wake_up(["weights"])  # weights only: never weights and KV cache together during a sync

    def load_bucket(self, bucket: Bucket) -> int:
        self.engine.load_weights(unflatten(bucket))
        return bucket.num_bytes

    def load_shared_bucket(self, shared: SharedBucket) -> int:
        """A bucket the actor shares through CUDA IPC (same GPU, another process): loaded without a copy."""
        self.engine.load_shared_bucket(shared)
        return shared.num_bytes

    def join_sync_group(self, host: str, port: int, world_size: int, rank: int, backend: str) -> bool:
        """Distributed mode: join the actor's weight-sync process group (blocks until every rank joined)."""
        self.sync_group = WeightSyncGroup(host, port, world_size, rank, backend, self.run.stage_timeout_s)
        return True

    def receive_bucket(self, entries: tuple, numel: int, dtype: str) -> int:
        """Distributed mode: receive one bucket by the actor's broadcast and load it."""
        flat = torch.empty(numel, dtype=getattr(torch, dtype.removeprefix("torch.")), device=self.sync_group.device)
        self.sync_group.broadcast(flat)
        self.engine.load_weights(unflatten(Bucket(entries, flat)))
        return flat.numel() * flat.element_size()

    def end_weight_update(self, policy_version: int) -> int:
        self.engine.finish_weight_update()
        self.policy_version = policy_version
        self.turns.end_update()
        return policy_version

    def logprobs_of(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        with self.turns.lock:
            self.engine.wake_up(["weights", "kv_cache"])
            return self.engine.score(prompt_ids, response_ids)
