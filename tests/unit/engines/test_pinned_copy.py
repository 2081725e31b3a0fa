"""Unit tests for hybrid_core.engines.pinned_copy: the kernel copies every byte and nothing past its target, run
by Triton's interpreter on CPU tensors in a child process (`pinned_copy_interpreted.py`); which copies take it
(CUDA target and pinned source only, aligned, right after a free under `auto` or always under `sm`, never under
`engine`); the copy engine's fallback; the choice's error. The kernel on the GPU at the wake's size:
benchmarks/probe_wake_copy.py and bench_ds_sleep."""
import math
from unittest import mock

import pytest
import torch

from hybrid_core.engines.pinned_copy import DRIVER_BUSY_S, copy_choice, copy_pinned_to_device, sm_copy_applies
from tests.unit.engines.triton_interpreter import run_interpreted


def test_the_kernel_copies_every_byte_and_nothing_past_its_target_under_the_interpreter():
    run = run_interpreted("pinned_copy_interpreted.py")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == ["ok 0 256 torch.uint8", "ok 4 256 torch.uint8", "ok 4000 256 torch.uint8",
                                       "ok 4096 256 torch.int32", "ok 3108 64 torch.bfloat16", "ok warm up"]


def test_a_cpu_target_takes_the_copy_engines_path_and_gets_every_byte(monkeypatch):
    source = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    target = torch.zeros(4096, dtype=torch.uint8)
    monkeypatch.setenv("HYBRID_WAKE_COPY", "sm")
    assert not sm_copy_applies(target, source, seconds_since_free=0.0)
    assert copy_pinned_to_device(target, source, seconds_since_free=0.0) is target
    assert torch.equal(target, source)


def test_the_choice_defaults_to_auto_and_sm_or_engine_force_one_way(monkeypatch):
    monkeypatch.delenv("HYBRID_WAKE_COPY", raising=False)
    assert copy_choice() == "auto"
    for choice in ("sm", "engine"):
        monkeypatch.setenv("HYBRID_WAKE_COPY", choice)
        assert copy_choice() == choice


@pytest.mark.parametrize("choice, seconds_since_free, kernel", [
    ("auto", 0.0, True), ("auto", DRIVER_BUSY_S * 0.99, True), ("auto", DRIVER_BUSY_S, False),
    ("auto", math.inf, False), ("sm", math.inf, True), ("engine", 0.0, False)])
def test_auto_takes_the_kernel_only_right_after_a_free(monkeypatch, choice, seconds_since_free, kernel):
    """What `sm_copy_applies` decides for a copy the kernel could take (a CUDA target: a mock stands in, and
    a pinned source: `is_pinned` patched), by the choice and the seconds since the caller's free."""
    monkeypatch.setenv("HYBRID_WAKE_COPY", choice)
    source = torch.zeros(64, dtype=torch.uint8)
    target = mock.Mock(is_cuda=True, data_ptr=lambda: 256, numel=lambda: 64, element_size=lambda: 1,
                       is_contiguous=lambda: True)
    with mock.patch.object(torch.Tensor, "is_pinned", lambda self: True):
        assert sm_copy_applies(target, source, seconds_since_free) is kernel


def test_an_unknown_copy_choice_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv("HYBRID_WAKE_COPY", "dma")
    with pytest.raises(ValueError, match=r"HYBRID_WAKE_COPY must be one of \['auto', 'sm', 'engine'\]: got 'dma'"):
        copy_choice()
