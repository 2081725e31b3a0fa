"""Unit tests for hybrid_core.workers.placement: what a worker's process gets (no Ray is started)."""
import os
import sys

from hybrid_core.workers import placement


class _Worker:
    """A role's worker."""

    PRELOAD = ("tests.unit.workers.preload_probe",)

    def __init__(self, value: int, rank: int = 0):
        self.seen = (value, rank, os.environ.get("HYBRID_TEST_SECRET"))


def test_secrets_reach_the_worker_as_an_argument_never_through_the_runtime_env(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "k-123")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    env = placement.role_env("actor", on_cpu=True)
    assert "WANDB_API_KEY" not in env and env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"  # settings, not secrets
    assert placement.secrets() == {"WANDB_API_KEY": "k-123"}
    monkeypatch.delenv("HYBRID_TEST_SECRET", raising=False)
    sys.modules.pop("tests.unit.workers.preload_probe", None)
    wrapped = placement.deferred(_Worker)
    worker = wrapped(_secrets={"HYBRID_TEST_SECRET": "s"})
    assert "tests.unit.workers.preload_probe" in sys.modules  # imported by the first phase
    assert not hasattr(worker, "seen")  # the worker's own constructor has not run yet
    worker.construct(7, rank=2)
    assert worker.seen == (7, 2, "s")  # the secret was set before the worker's own constructor ran
    assert (wrapped.__name__, wrapped.__doc__, isinstance(worker, _Worker)) == ("_Worker", "A role's worker.", True)
    monkeypatch.delenv("HYBRID_TEST_SECRET")


class _Rank:
    """A DeepSpeed rank: reads where its role meets when it starts."""

    def __init__(self):
        self.seen = (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))


def test_a_rank_meets_at_the_address_it_is_given_before_its_constructor_runs(monkeypatch, tmp_path):
    env = placement.role_env("actor", on_cpu=True, rendezvous=placement.Rendezvous(rank=1, world_size=2))
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("1", "2", "0")
    assert "MASTER_ADDR" not in env and "MASTER_PORT" not in env  # known only once rank 0's process runs
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # restored after the test
    monkeypatch.setenv("MASTER_PORT", "1")
    worker = placement.deferred(_Rank)(_secrets={})
    worker.construct(_meet_at=("10.0.0.7", 29600))
    assert worker.seen == ("10.0.0.7", "29600")
    assert worker.sees(str(tmp_path)) is False  # no manifest: a node that does not share the store
    (tmp_path / "manifest.json").write_text("{}")
    assert worker.sees(str(tmp_path)) is True


def test_a_run_is_killed_engines_first_whatever_its_ranks():
    names = ["r/actor/9", "r/critic/0", "r/rollout/12", "r/ref/1", "r/actor/0", "r/reward/3"]
    assert sorted(names, key=placement._kill_rank) == ["r/rollout/12", "r/ref/1", "r/actor/9", "r/actor/0",
                                                       "r/critic/0", "r/reward/3"]
