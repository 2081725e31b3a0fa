"""The advantage stage's forwards on other workers: the reference's logprobs and the critic's values of a step's
rollout, each over its role's ranks in shares (`rank_group`).

Owns starting them early: the reward stage scores the committed rollout on the host while these forwards of the same
rows run on the GPU, and the advantage stage then collects them instead of starting them itself. Started forwards are
kept for one step and collected once: a retried advantage stage starts its own. It knows nothing about the maths or
the store.
"""
from __future__ import annotations

from hybrid_core.engines.experience_maker import ExperienceSources, SequenceForward
from hybrid_core.types import RunRef
from hybrid_core.workers import rank_group

# ExperienceSources field → (role, its worker's method)
FORWARDS = {"ref_logprobs": ("ref", "logprobs"), "values": ("critic", "values")}


class RemoteForwards:
    """The forwards of `roles` (those of FORWARDS the run has), `role_ranks` ranks each, shares by ring of
    `ring_size` ranks."""

    def __init__(self, run: RunRef, roles: tuple[str, ...], role_ranks: dict[str, int], ring_size: int):
        self.run, self.role_ranks, self.ring_size = run, role_ranks, ring_size
        self.names = [name for name, (role, _) in FORWARDS.items() if role in roles]
        self.early: tuple[int, dict[str, rank_group.StartedShares]] | None = None  # (step, started forwards)

    def _start(self, name: str, prompt_ids, response_ids) -> rank_group.StartedShares:
        role, method = FORWARDS[name]
        workers = rank_group.all_ranks(self.run, role, self.role_ranks.get(role, 1))
        remote = [(rank, lambda p, r, w=w: getattr(w, method).remote(p, r)) for rank, w in enumerate(workers)]
        return rank_group.start_shares(prompt_ids, response_ids, role, remote, ring_size=self.ring_size)[0]

    def start_early(self, step: int, prompt_ids, response_ids) -> bool:
        """Start step `step`'s forwards of these rows now (once: a retried reward stage finds them running);
        returns whether any runs."""
        if self.early is None or self.early[0] != step:
            self.early = (step, {name: self._start(name, prompt_ids, response_ids) for name in self.names})
        return bool(self.early[1])

    def sources(self, step: int) -> ExperienceSources:
        """The advantage stage's sources for step `step`: its early forwards where they were started (the rows
        given must then be the ones they were started on), the forwards themselves otherwise."""
        early = self.early[1] if self.early is not None and self.early[0] == step else {}
        self.early = None
        return ExperienceSources(**{name: self._collect(early[name]) if name in early else self._forward(name)
                                    for name in self.names})

    def _forward(self, name: str) -> SequenceForward:
        return lambda prompt_ids, response_ids: self._start(name, prompt_ids, response_ids).rows(
            self.run.stage_timeout_s)

    def _collect(self, started: rank_group.StartedShares) -> SequenceForward:
        def collect(prompt_ids, response_ids):
            rows = started.rows(self.run.stage_timeout_s)
            if [len(row) for row in rows] != [len(row) for row in response_ids]:
                raise RuntimeError(f"the {started.role} forward started early covered other rows than the advantage "
                                   f"stage's ({len(rows)} against {len(response_ids)}); the stage must be redone")
            return rows
        return collect
