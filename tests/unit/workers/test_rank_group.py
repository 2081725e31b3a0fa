"""How rank 0 splits the rows of a no-grad forward among a role's ranks (no Ray started: local shares only)."""
from __future__ import annotations

import pytest

from hybrid_core.workers.rank_group import share_bounds, sharded_rows


def test_shares_are_contiguous_and_as_equal_as_can_be():
    assert share_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert share_bounds(4, 2) == [(0, 2), (2, 4)]
    assert share_bounds(1, 3) == [(0, 1), (1, 1), (1, 1)]
    assert share_bounds(0, 2) == [(0, 0), (0, 0)]


def test_only_the_local_share_runs_here_and_empty_shares_are_still_called():
    seen = []

    def local(prompts, responses):
        seen.append((prompts, responses))
        return [len(p) + len(r) for p, r in zip(prompts, responses)]

    prompts, responses = [[1], [2, 3], [4, 5, 6]], [[7], [8], [9, 9]]
    assert sharded_rows(prompts, responses, "actor", [], 1.0, local=local) == [2, 3, 5]
    assert seen == [(prompts, responses)]
    # one row for two ranks: the remote rank's share is empty, and it is called all the same (a ZeRO-3 rank must
    # join its peers' forwards); the call stops here before anything waits on Ray
    called = []

    def remote(p, r):
        called.append((p, r))
        raise StopIteration

    with pytest.raises(StopIteration):
        sharded_rows(prompts[:1], responses[:1], "actor", [(1, remote)], 1.0, local=local)
    assert called == [([], [])]


def test_a_failing_rank_is_named_and_its_cause_kept():
    from hybrid_core.types import PermanentError
    from hybrid_core.workers.rank_group import RankFailure

    failure = RankFailure("critic", 2, "failed: ValueError('bad')", PermanentError("bad"))
    assert str(failure) == "critic rank 2 failed: ValueError('bad')" and failure.is_permanent
    assert not RankFailure("actor", 1, "died (RayActorError)").is_permanent
