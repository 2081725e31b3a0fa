"""The advantage stage as the policy's rank 0 runs it: the policy's old logprobs over its ranks (or none, when the
update's own forward gives them), the reference's and critic's forwards (started early, beside the reward stage,
where they can be), the advantages, and their commit through the step ledger; or the committed ones replayed.

It holds the stage's collaborators and no state of its own beyond them; the maths is `engines.experience_maker`'s.
It knows nothing about Prefect.
"""
from __future__ import annotations

import dataclasses

from hybrid_core.algorithms.experience import reads_old_logprobs
from hybrid_core.engines.experience_maker import ExperienceSources, make_advantage_table
from hybrid_core.engines.frozen_model import memory_peak_gib, reset_memory_peak
from hybrid_core.engines.sequence_batch import MicroBatching
from hybrid_core.step_contract import ADVANTAGE, ROLLOUT
from hybrid_core.types import StageResult
from hybrid_core.workers.policy_lead import PolicyLead
from hybrid_core.workers.policy_rank import PolicyRank
from hybrid_core.workers.remote_forwards import RemoteForwards
from hybrid_core.workers.stage_clock import CallClock
from hybrid_core.workers.step_ledger import StepLedger


class ShardedPolicy:
    """The policy's no-grad logprobs of the advantage stage, every data-parallel group (a rank, or a ring of ranks)
    computing a share, rank 0 (`own`) the first."""

    def __init__(self, lead: PolicyLead, own: PolicyRank, ring_size: int):
        self.lead, self.own, self.ring_size = lead, own, ring_size

    def logprobs(self, prompt_ids, response_ids, batching: MicroBatching) -> list[list[float]]:
        local = lambda p, r: self.own.logprobs(p, r, batching)  # noqa: E731
        return self.lead.logprobs(prompt_ids, response_ids, local, self.ring_size)

    def ref_logprobs(self, prompt_ids, response_ids, batching: MicroBatching) -> list[list[float]]:
        """A LoRA policy's base, its adapters off: the reference, without a reference worker."""
        local = lambda p, r: self.own.ref_logprobs(p, r, batching)  # noqa: E731
        return self.lead.logprobs(prompt_ids, response_ids, local, self.ring_size, is_reference=True)


class ExperienceStage:
    """Step by step, the advantage stage of the actor whose arguments are `args` (`ActorWorkerArgs`)."""

    def __init__(self, args, ledger: StepLedger, lead: PolicyLead, policy: PolicyRank, forwards: RemoteForwards):
        self.args, self.ledger, self.store = args, ledger, ledger.store
        self.lead, self.policy, self.forwards = lead, policy, forwards

    def run(self, step: int, kl_coef: float, clock: CallClock | None) -> StageResult:
        """Step `step`'s advantages with the KL coefficient `kl_coef`, committed (or replayed)."""
        if entry := self.ledger.replay(step, ADVANTAGE.name):  # produced by exactly this policy: replay it
            return StageResult(stage=ADVANTAGE.name, step=step, seconds=0.0, rows=entry["rows"], replayed=True)
        self.policy.check_weights(step, ADVANTAGE.name)
        self.ledger.begin(step, ADVANTAGE.name)
        if step > self.args.freezing_steps:  # the optimizer states come back while the reference's forward runs
            self.policy.engine.wake_up_soon()
        reset_memory_peak()
        settings = dataclasses.replace(self.args.advantage, kl_coef=kl_coef)
        sharded = ShardedPolicy(self.lead, self.policy, self.args.ds.ring_attn_size)
        policy = None if self._old_from_update(step) else sharded
        table, stats = make_advantage_table(policy, self.store.read(step, ROLLOUT.name),
                                            self.store.read(step, "reward"), self._sources(step, sharded), settings,
                                            self.args.penalties, self.args.experience_batching)
        stats |= memory_peak_gib("actor_experience") | {"kl_coef": kl_coef, "num_samples": float(table.num_rows)}
        entry = self.ledger.commit(step, ADVANTAGE.name, table, clock, stats)
        return StageResult(stage=ADVANTAGE.name, step=step, seconds=entry["seconds"], rows=table.num_rows,
                           path=self.store.stage_uri(step, ADVANTAGE.name), metrics=entry["metrics"])

    def _sources(self, step: int, sharded: ShardedPolicy) -> ExperienceSources:
        """The other workers' forwards; a LoRA policy's reference logprobs come from the policy's own ranks."""
        sources = self.forwards.sources(step)
        if not self._reference_from_actor:
            return sources
        batching = self.args.experience_batching
        return dataclasses.replace(sources, ref_logprobs=lambda p, r: sharded.ref_logprobs(p, r, batching))

    @property
    def _reference_from_actor(self) -> bool:
        return self.args.ds.lora.rank > 0 and self.args.kl.init_coef > 0

    def _old_from_update(self, step: int) -> bool:
        """Whether step `step`'s old logprobs come from its update's own forward (no separate forward): the update is
        exactly on-policy, the advantages do not read them, and the actor trains this step."""
        a = self.args
        return a.is_update_on_policy and step > a.freezing_steps and \
            not reads_old_logprobs(a.kl.init_coef > 0, a.advantage.kl_use_loss)

    def start_forwards(self, step: int) -> bool:
        """As the reward stage begins, start the reference's and critic's forwards of step `step`'s committed
        rollout, so their GPUs work while the reward is computed on the host; `run` collects them. Nothing starts
        when a reward model shares the GPUs or the stage will be replayed. Returns whether any started."""
        if not self.args.starts_forwards_early or self.ledger.entry(step, ADVANTAGE.name) is not None:
            return False
        rollout = self.store.read(step, ROLLOUT.name)
        started = self.forwards.start_early(step, rollout.column("prompt_ids").to_pylist(),
                                            rollout.column("response_ids").to_pylist())
        if started:
            self.store.log_event(step, ADVANTAGE.name, "forwards-started")
        return started
