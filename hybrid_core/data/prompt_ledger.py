"""The oversampling prompt ledger: which prompts a batch serves, and which groups a step trains, carries or lets expire.

Owns the rules of async oversampling (`rollout.vllm_generate_batch_size` G > `rollout.batch_size` B) as pure
functions of what earlier steps committed: the sampler's state (a position in the stream of episode orders and the
prompts waiting to be served before it), drawing prompts so that no row is in flight twice, the consume/carry/expire
schedule of a step's groups, and the ledger rows that say what became of every prompt a step touched. It knows
nothing about generation, rewards or where the ledger is stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

FATES = ("trained", "expired", "surplus", "filtered")


class Served(NamedTuple):
    """A prompt as the sampler serves it: its pass over the data (the stream's episode) and its row."""

    epoch: int
    index: int


@dataclass(frozen=True, kw_only=True)
class SamplerState:
    """Where the sampler stands after a batch: `position` stream entries read, and the prompts served before the
    stream's next ones (returned by expired groups first, then entries passed over while their row was in flight)."""

    position: int = 0
    waiting: tuple[Served, ...] = ()

    def record(self) -> dict:
        return {"position": self.position, "waiting": [list(served) for served in self.waiting]}

    @classmethod
    def from_record(cls, record: dict) -> SamplerState:
        return cls(position=record["position"], waiting=tuple(Served(*served) for served in record["waiting"]))


def returned(state: SamplerState, prompts: Sequence[Served]) -> SamplerState:
    """The prompts of expired groups go back to the sampler: served again before any other, in their order."""
    return SamplerState(position=state.position, waiting=(*prompts, *state.waiting))


def draw(state: SamplerState, count: int, stream_entry: Callable[[int], tuple[int, int]], num_rows: int,
         busy: set[int]) -> tuple[list[Served], SamplerState]:
    """Serve `count` prompts: the waiting ones first, then the stream's next entries. A prompt whose row is `busy`
    (in flight: served and not yet trained, filtered or returned) or drawn already here is passed over and waits,
    in order, for a later draw; fewer than `count` come only when every row is busy."""
    taken, waiting, busy = [], [], set(busy)
    for served in state.waiting:
        if len(taken) < count and served.index not in busy:
            taken.append(served)
            busy.add(served.index)
        else:
            waiting.append(served)
    position = state.position
    while len(taken) < count and len(busy) < num_rows:
        served = Served(*stream_entry(position))
        position += 1
        if served.index in busy:
            waiting.append(served)
        else:
            taken.append(served)
            busy.add(served.index)
    return taken, SamplerState(position=position, waiting=tuple(waiting))


@dataclass(frozen=True, kw_only=True)
class GroupSchedule:
    """Step k's groups by position: `used` and `expired` among the groups carried from step k − 1 (in order),
    `fresh` and `surplus` among the passing groups of batch k (in order)."""

    used: list[int]
    expired: list[int]
    fresh: list[int]
    surplus: list[int]


def carried_use(carried_versions: Sequence[int], batch_size: int, versions: range) -> tuple[list[int], list[int]]:
    """Which carried groups step k trains: the first `batch_size` of those whose policy version it may consume
    (`versions`); the others expire. Known before batch k is generated, so its prompts can be served again at once."""
    usable = [i for i, version in enumerate(carried_versions) if version in versions]
    used = usable[:batch_size]
    return used, [i for i in range(len(carried_versions)) if i not in set(used)]


def take_groups(carried_versions: Sequence[int], num_passing: int, batch_size: int, versions: range) -> GroupSchedule:
    """Step k trains `batch_size` groups: the carried ones first (`carried_use`), then batch k's passing groups in
    order (groups dynamic filtering dropped are not among them); batch k's other passing groups are its surplus."""
    used, expired = carried_use(carried_versions, batch_size, versions)
    num_fresh = max(0, min(batch_size - len(used), num_passing))
    return GroupSchedule(used=used, expired=expired, fresh=list(range(num_fresh)),
                         surplus=list(range(num_fresh, num_passing)))


def ledger_rows(carried: Sequence[tuple[Served, int]], schedule: GroupSchedule, drawn: Sequence[Served],
                passed: Sequence[bool], batch_step: int) -> list[dict]:
    """What became of every prompt step k touched: each carried group's (with the step whose batch generated it),
    trained or expired, then each prompt batch k served, in order: trained, surplus or filtered."""
    used, fresh = set(schedule.used), set(schedule.fresh)
    rows = [_row(served, batch, "trained" if i in used else "expired") for i, (served, batch) in enumerate(carried)]
    num_passed = 0
    for served, is_passed in zip(drawn, passed, strict=True):
        fate = "filtered"
        if is_passed:
            fate = "trained" if num_passed in fresh else "surplus"
            num_passed += 1
        rows.append(_row(served, batch_step, fate))
    return rows


def _row(served: Served, batch_step: int, fate: str) -> dict:
    return {"epoch": served.epoch, "prompt_index": served.index, "batch_step": batch_step, "fate": fate}
