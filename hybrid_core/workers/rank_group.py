"""The ranks of a role, seen from its rank 0: the one rank the Prefect tasks call.

Rank 0 leads: it starts the same method on ranks 1..n-1 (they wait idle for it, so nothing deadlocks), does its own
share, and waits for theirs; collectives inside DeepSpeed keep the ranks' updates together. No-grad forwards (and
rollout engines' prompts) are split into contiguous shares, one per rank — with ring attention one per ring of
consecutive ranks, each rank of it computing its chunk of the same rows —, computed at the same time; every rank is
called for a forward, an empty share included. Owns the shares, the fan-out and the one way a peer's failure is
reported: `RankFailure`, naming the role and rank. It knows nothing about what the methods compute or about Prefect.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import ray

from hybrid_core.types import PermanentError, RunRef

Rows = list[list[int]]


class RankFailure(RuntimeError):
    """A rank that rank 0 led died, hung past the stage timeout or raised; `cause` is the rank's own error."""

    def __init__(self, role: str, rank: int, what: str, cause: BaseException | None = None):
        super().__init__(f"{role} rank {rank} {what}")
        self.role, self.rank, self.what, self.cause = role, rank, what, cause

    @property
    def is_permanent(self) -> bool:
        return isinstance(self.cause, PermanentError) or getattr(self.cause, "is_permanent", False)


def _handles(run: RunRef, role: str, ranks: range) -> list:
    return [ray.get_actor(run.actor_name(role, rank), namespace=run.namespace) for rank in ranks]


def all_ranks(run: RunRef, role: str, world_size: int) -> list:
    """Handles of ranks 0..world_size-1 of `role` (named `<run_id>/<role>/<rank>`)."""
    return _handles(run, role, range(world_size))


def peers(run: RunRef, role: str, world_size: int) -> list:
    """Ranks 1..world_size-1: the ones rank 0 leads (none, and no lookup, with one rank)."""
    return _handles(run, role, range(1, world_size))


def share_bounds(num_rows: int, num_parts: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) shares of `num_rows`, as equal as can be, the larger ones first."""
    size, extra = divmod(num_rows, num_parts)
    bounds, start = [], 0
    for part in range(num_parts):
        end = start + size + (part < extra)
        bounds.append((start, end))
        start = end
    return bounds


# Rank 0 gives its peers a little less than the stage timeout, so a hung peer is reported by rank 0, naming it,
# before the task gives up on rank 0 itself.
PEER_TIMEOUT_SHARE = 0.9


def _deadline(timeout_s: float) -> float:
    return time.monotonic() + PEER_TIMEOUT_SHARE * timeout_s


def gather(role: str, pending: Sequence[tuple[int, object]], timeout_s: float, deadline: float | None = None) -> list:
    """The results of `(rank, object ref)` calls in order, waiting until `deadline` (monotonic; default: from now,
    the peers' share of the stage timeout); a failing rank raises `RankFailure` naming it."""
    deadline = _deadline(timeout_s) if deadline is None else deadline
    results = []
    for rank, ref in pending:
        try:
            results.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
        except ray.exceptions.GetTimeoutError:
            raise RankFailure(role, rank, f"gave no answer within {timeout_s:.0f}s (train.stage_timeout_s)") from None
        except ray.exceptions.RayActorError as err:
            raise RankFailure(role, rank, f"died ({type(err).__name__}); resume the run to recreate it") from err
        except ray.exceptions.RayTaskError as err:
            raise RankFailure(role, rank, f"failed: {err.cause!r}", err.cause) from err
    return results


class StartedShares:
    """Remote shares of a forward, running: `rows` waits for them and returns their rows in order."""

    def __init__(self, role: str, pending: list[tuple[int, object]], ring_size: int):
        self.role, self.pending, self.ring_size = role, pending, ring_size

    def rows(self, timeout_s: float, deadline: float | None = None) -> list:
        rows = []
        for (rank, _), result in zip(self.pending, gather(self.role, self.pending, timeout_s, deadline)):
            if rank % self.ring_size == 0:  # the ring's other ranks returned the same rows
                rows.extend(result)
        return rows


def start_shares(prompt_ids: Rows, response_ids: Rows, role: str, remote: Sequence[tuple[int, Callable]],
                 ring_size: int = 1, has_local: bool = False) -> tuple[StartedShares, tuple[int, int] | None]:
    """Start every remote `(rank, call)` (returning an object ref; ranks in order) on its share of the rows, after
    the first share when `has_local` (this process, rank 0, computes that one). Returns the started shares and the
    bounds of the local share (None without one). Every rank is called, an empty share included: ZeRO-3 ranks gather
    the weights inside each forward, so each must join its peers' forwards. With `ring_size` > 1 each ring of that
    many consecutive ranks takes one share, all its ranks the same rows."""
    calls = ([(0, None)] if has_local else []) + list(remote)
    bounds = share_bounds(len(prompt_ids), len(calls) // ring_size)
    shares = [(rank, call, *bounds[i // ring_size]) for i, (rank, call) in enumerate(calls)]
    pending = [(rank, call(prompt_ids[a:b], response_ids[a:b])) for rank, call, a, b in shares if call is not None]
    return StartedShares(role, pending, ring_size), (shares[0][2], shares[0][3]) if has_local else None


def sharded_rows(prompt_ids: Rows, response_ids: Rows, role: str, remote: Sequence[tuple[int, Callable]],
                 timeout_s: float, local: Callable | None = None, ring_size: int = 1) -> list:
    """One result per row, computed in shares (`start_shares`): `local` (this process, rank 0, the first share)
    while every remote `(rank, call)` computes one of the following shares; the results of a ring's first rank are
    kept (every rank of a ring returns the gathered whole)."""
    deadline = _deadline(timeout_s)
    started, own = start_shares(prompt_ids, response_ids, role, remote, ring_size, has_local=local is not None)
    rows = list(local(prompt_ids[own[0]:own[1]], response_ids[own[0]:own[1]])) if own else []
    return rows + started.rows(timeout_s, deadline)


def with_peers(role: str, peer_calls: Sequence[tuple[int, object]], own: Callable, timeout_s: float):
    """Run `own()` while the peers' already started `(rank, object ref)` calls run; returns own's result once all
    finished within the stage timeout (a peer's failure raises `RankFailure`)."""
    deadline = _deadline(timeout_s)
    result = own()
    gather(role, peer_calls, timeout_s, deadline)
    return result
