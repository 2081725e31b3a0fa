"""Unit tests for hybrid_core.engines.pinned_copy: the kernel copies every byte and nothing past its target, run
by Triton's interpreter on CPU tensors in a child process (`pinned_copy_interpreted.py`); which copies take it
(CUDA target and pinned source only, aligned, unless `HYBRID_WAKE_COPY=engine`); the copy engine's fallback; the
choice's error. The kernel on the GPU at the wake's size: benchmarks/probe_wake_copy.py and bench_ds_sleep."""
import os
import subprocess
import sys

import pytest
import torch

from hybrid_core.engines.pinned_copy import copy_choice, copy_pinned_to_device, sm_copy_applies
from tests.conftest import REPO_ROOT


def test_the_kernel_copies_every_byte_and_nothing_past_its_target_under_the_interpreter():
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_ROOT)}
    script = REPO_ROOT / "tests" / "unit" / "engines" / "pinned_copy_interpreted.py"
    run = subprocess.run([sys.executable, "-W", "ignore", str(script)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == ["ok 0 256 torch.uint8", "ok 4 256 torch.uint8", "ok 4000 256 torch.uint8",
                                       "ok 4096 256 torch.int32", "ok 3108 64 torch.bfloat16"]


def test_a_cpu_target_takes_the_copy_engines_path_and_gets_every_byte(monkeypatch):
    monkeypatch.delenv("HYBRID_WAKE_COPY", raising=False)
    source = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    target = torch.zeros(4096, dtype=torch.uint8)
    assert not sm_copy_applies(target, source)
    assert copy_pinned_to_device(target, source) is target
    assert torch.equal(target, source)


def test_the_choice_defaults_to_the_kernel_and_engine_keeps_the_copy_engine(monkeypatch):
    monkeypatch.delenv("HYBRID_WAKE_COPY", raising=False)
    assert copy_choice() == "sm"
    monkeypatch.setenv("HYBRID_WAKE_COPY", "engine")
    assert copy_choice() == "engine"


def test_an_unknown_copy_choice_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv("HYBRID_WAKE_COPY", "dma")
    with pytest.raises(ValueError, match=r"HYBRID_WAKE_COPY must be one of \['sm', 'engine'\]: got 'dma'"):
        copy_choice()
