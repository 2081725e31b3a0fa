"""Rank 0 of the policy as the lead of the ranks it calls: the policy's ranks 1..n-1, the critic's rank 0 and the
rollout engines. Each method starts one named call on every peer of a kind, runs rank 0's own part (a callable)
while they run, and waits for them within the stage timeout (`rank_group`), so no caller names a peer's method by a
string or holds a peer's handle.

Owns the peers' handles (looked up at first use) and which call each stage makes of them. It knows nothing about
what the calls compute, nor about Prefect.
"""
from __future__ import annotations

import functools
from typing import Callable

from hybrid_core.types import RunRef
from hybrid_core.workers import rank_group


class PolicyLead:
    """The peers of the policy's rank 0 in run `run`: `num_ranks` policy ranks, `num_engines` rollout engines and,
    with `has_critic`, the critic's rank 0 (which leads the critic's own ranks)."""

    def __init__(self, run: RunRef, num_ranks: int, num_engines: int, has_critic: bool):
        self.run, self.num_ranks, self.num_engines, self.has_critic = run, num_ranks, num_engines, has_critic
        self.timeout_s = run.stage_timeout_s

    @functools.cached_property
    def peers(self) -> list:
        """Ranks 1..n-1 of the policy, in order (none with one rank)."""
        return rank_group.peers(self.run, "actor", self.num_ranks)

    @functools.cached_property
    def engines(self) -> list:
        """The rollout engines, in order."""
        return rank_group.all_ranks(self.run, "rollout", self.num_engines)

    @functools.cached_property
    def critic(self):
        return rank_group.all_ranks(self.run, "critic", 1)[0]

    def _ranked(self, peers: list | None = None) -> list[tuple[int, object]]:
        return list(enumerate(self.peers if peers is None else peers, start=1))

    def _together(self, peer_calls: list[tuple[int, object]], own: Callable):
        """`own()` while the peers' started calls run; its result once they all answered."""
        return rank_group.with_peers("actor", peer_calls, own, self.timeout_s)

    def train(self, step: int, kl_coef: float, own: Callable[[], dict]) -> dict:
        """Every policy rank's part of step `step`'s update; rank 0's figures."""
        return self._together([(rank, peer.train_share.remote(step, kl_coef)) for rank, peer in self._ranked()], own)

    def finish_sleeps(self, unless_free_share: float | None, own: Callable[[], float]) -> float:
        """Every rank's DeepSpeed sleep finished (see `ActorWorker.finish_sleeps`); rank 0's seconds waited."""
        calls = [(rank, peer.finish_sleep.remote(unless_free_share)) for rank, peer in self._ranked()]
        return self._together(calls, own)

    def push_weights(self, own: Callable[[], int]) -> int:
        """CUDA IPC: every rank feeds the engine worker on its own GPU; the bytes rank 0 sent."""
        return self._together([(rank, peer.push_weights.remote()) for rank, peer in self._ranked()], own)

    def join_weight_gathers(self, is_zero3: bool, own: Callable[[], int]) -> int:
        """Rank 0 sends the weights (`own`); under ZeRO-3 the other ranks join the gather of each bucket."""
        peers = self.peers if is_zero3 else []
        return self._together([(rank, peer.join_weight_gathers.remote()) for rank, peer in self._ranked(peers)], own)

    def save(self, step: int, own: Callable[[], str]) -> str:
        """Every rank's part of checkpoint `step` (DeepSpeed saves collectively); rank 0's URI."""
        return self._together([(rank, peer.save_share.remote(step)) for rank, peer in self._ranked()], own)

    def restore(self, step: int, own: Callable[[], dict]) -> dict:
        """Every rank loads checkpoint `step`; rank 0's client state."""
        return self._together([(rank, peer.restore_share.remote(step)) for rank, peer in self._ranked()], own)

    def export(self, out_uri: str, own: Callable[[], str]) -> str:
        """The HF export, written by rank 0 while the other ranks join ZeRO-3's gather."""
        return self._together([(rank, peer.export_share.remote(out_uri)) for rank, peer in self._ranked()], own)

    def logprobs(self, prompt_ids, response_ids, own: Callable, ring_size: int,
                 is_reference: bool = False) -> list[list[float]]:
        """The policy's no-grad logprobs in shares, one per data-parallel group (a rank, or a ring of ranks); rank
        0 computes the first by `own`. `is_reference`: a LoRA policy's base, its adapters off (the reference)."""
        method = "ref_logprobs_of" if is_reference else "logprobs_of"
        remote = [(rank, lambda p, r, peer=peer: getattr(peer, method).remote(p, r)) for rank, peer in self._ranked()]
        return rank_group.sharded_rows(prompt_ids, response_ids, "actor", remote, self.timeout_s, local=own,
                                       ring_size=ring_size)

    def _critic_call(self, started) -> object:
        return rank_group.gather("critic", [(0, started)], self.timeout_s)[0]

    def train_critic(self, step: int) -> dict:
        """The critic's update of step `step` (before the policy's); nothing without a critic."""
        return self._critic_call(self.critic.train.remote(step)) if self.has_critic else {}

    def save_critic(self, step: int) -> None:
        if self.has_critic:
            self._critic_call(self.critic.save_checkpoint.remote(step))

    def restore_critic(self, step: int) -> None:
        if self.has_critic:
            self._critic_call(self.critic.restore.remote(step))

    def begin_weight_update(self) -> None:
        """Every engine readies for new weights."""
        pending = [(rank, engine.begin_weight_update.remote()) for rank, engine in enumerate(self.engines)]
        rank_group.gather("rollout", pending, self.timeout_s)

    def end_weight_update(self, version: int) -> int:
        """Every engine takes up the weights as `version`; the version all of them hold now."""
        pending = [(rank, engine.end_weight_update.remote(version)) for rank, engine in enumerate(self.engines)]
        return min(rank_group.gather("rollout", pending, self.timeout_s))

    def engine(self, index: int):
        """Rollout engine `index` (a rank that feeds it by CUDA IPC looks it up, rank 0 or not)."""
        return self.engines[index]
