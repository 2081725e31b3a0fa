"""The data-parallel ranks of a DeepSpeed role, seen from its rank 0: the one rank the Prefect tasks call.

Rank 0 leads: it starts the same method on ranks 1..n-1 (they wait idle for it, so nothing deadlocks), does its own
share, and waits for theirs; collectives inside DeepSpeed keep the ranks' updates together. No-grad forwards are
split into contiguous shares of the rows, one per rank, computed at the same time. Owns the shares and the
fan-out; it knows nothing about what the methods compute or about Prefect.
"""
from __future__ import annotations

from typing import Callable, Sequence

import ray

from hybrid_core.types import RunRef

Rows = list[list[int]]


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


def sharded_rows(prompt_ids: Rows, response_ids: Rows, remote: Sequence[Callable], timeout_s: float,
                 local: Callable | None = None) -> list:
    """One result per row, computed in shares: `local` (this process, the first share) while every `remote` call
    (returning an object ref) computes one of the following shares; an empty share calls nothing."""
    calls = ([local] if local is not None else []) + list(remote)
    shares = [(call, a, b) for call, (a, b) in zip(calls, share_bounds(len(prompt_ids), len(calls))) if b > a]
    is_local = [local is not None and call is local for call, _, _ in shares]
    pending = [None if own else call(prompt_ids[a:b], response_ids[a:b])
               for own, (call, a, b) in zip(is_local, shares)]
    rows = []
    for own, (call, a, b), ref in zip(is_local, shares, pending):
        rows.extend(call(prompt_ids[a:b], response_ids[a:b]) if own else ray.get(ref, timeout=timeout_s))
    return rows


def with_peers(peer_calls: list, own: Callable, timeout_s: float):
    """Run `own()` while the peers' already started calls (object refs) run; returns own's result once all
    finished (a peer's failure is raised)."""
    result = own()
    ray.get(peer_calls, timeout=timeout_s)
    return result
