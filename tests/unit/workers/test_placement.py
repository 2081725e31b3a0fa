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
