"""gpu_probe: what nvidia-smi says of this machine's GPUs (its answers faked: no driver here)."""
import subprocess

import pytest

from hybrid_core.plan import gpu_probe
from hybrid_core.plan.gpu_probe import gpu_memory_gib


def _fake_nvidia_smi(monkeypatch, answers: dict[str, tuple[int, str]]):
    def run(args, **_):
        query = args[1].removeprefix("--query-gpu=")
        returncode, stdout = answers[query]
        return subprocess.CompletedProcess(args, returncode, stdout, "")

    monkeypatch.setattr(gpu_probe.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(gpu_probe.subprocess, "run", run)


def test_gpu_memory_from_nvidia_smi(monkeypatch):
    # an H200: 143771 MiB total, 588 MiB reserved by the driver → 143183 MiB = 139.83 GiB; the smaller GPU counts
    _fake_nvidia_smi(monkeypatch, {"memory.total,memory.reserved": (0, "143771, 588\n143771, 600\n")})
    assert gpu_memory_gib() == pytest.approx((143771 - 600) / 1024, rel=0, abs=1e-9)
    _fake_nvidia_smi(monkeypatch, {"memory.total,memory.reserved": (0, "81559, [N/A]\n"),
                                   "memory.total": (0, "81559\n")})
    assert gpu_memory_gib() == pytest.approx(81559 / 1024, rel=0, abs=1e-9)
    _fake_nvidia_smi(monkeypatch, {"memory.total,memory.reserved": (6, "Field is not a valid field\n"),
                                   "memory.total": (9, "")})
    assert gpu_memory_gib() is None
    monkeypatch.setattr("hybrid_core.plan.gpu_probe.shutil.which", lambda name: None)
    assert gpu_memory_gib() is None
