"""A fixture the memory-plan tests share: import `logprob_kernels` into a test module to apply it there (not a
conftest.py: the integration tests import the root conftest by its module name, which a second one would shadow)."""
import pytest


@pytest.fixture(autouse=True)
def logprob_kernels(monkeypatch):
    """Whether Triton is installed, as the memory plan sees it: not, unless a test says so (the plan's figures by hand
    are the PyTorch head's, whatever this machine has installed: the CPU build's vLLM brings Triton)."""
    import hybrid_core.plan.memory as memory_plan

    def installed(value: bool) -> None:
        monkeypatch.setattr(memory_plan, "triton_installed", lambda: value)
    monkeypatch.delenv("HYBRID_LOGPROB_KERNEL", raising=False)
    installed(False)
    return installed
