"""Unit tests for hybrid_core.workers.placement: what a worker's process gets (no Ray is started)."""
import os

from hybrid_core.workers import placement


class _Worker:
    """A role's worker."""

    def __init__(self, value: int, rank: int = 0):
        self.seen = (value, rank, os.environ.get("HYBRID_TEST_SECRET"))


def test_secrets_reach_the_worker_as_an_argument_never_through_the_runtime_env(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "k-123")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    env = placement.role_env("actor", on_cpu=True)
    assert "WANDB_API_KEY" not in env and env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"  # settings, not secrets
    assert placement.secrets() == {"WANDB_API_KEY": "k-123"}
    monkeypatch.delenv("HYBRID_TEST_SECRET", raising=False)
    wrapped = placement.with_secrets(_Worker)
    worker = wrapped(7, rank=2, _secrets={"HYBRID_TEST_SECRET": "s"})
    assert worker.seen == (7, 2, "s")  # set before the worker's own constructor ran
    assert (wrapped.__name__, wrapped.__doc__, isinstance(worker, _Worker)) == ("_Worker", "A role's worker.", True)
    monkeypatch.delenv("HYBRID_TEST_SECRET")
