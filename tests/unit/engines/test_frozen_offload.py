"""Frozen models with their weights in host memory (`--ref.offload`, `--reward.offload`; engines/frozen_offload.py):
outside their forwards every parameter and buffer is its host copy; during a forward each is a separate device copy
(on a CPU machine the device is the CPU, so the visit is exercised as a copy); nothing is copied back, and the
reference's logprobs are those of the model that never left the device."""
from pathlib import Path

import pytest
import torch

from hybrid_core.engines.frozen_model import FrozenModel, FrozenModelSettings
from hybrid_core.engines.frozen_offload import HostResidentWeights
from hybrid_core.engines.ring_attention import RingSettings
from hybrid_core.engines.sequence_batch import MicroBatching, pad

TINY_MODEL = Path(__file__).resolve().parents[3] / "data" / "tiny-qwen3"
PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
RESPONSES = [[20, 21, 22, 2], [30, 31, 32, 33, 34, 2], [40]]


def reference(is_offloaded: bool) -> FrozenModel:
    settings = FrozenModelSettings(model_path=str(TINY_MODEL), param_dtype="fp32",
                                   batching=MicroBatching(num_samples=2), use_liger=False, is_offloaded=is_offloaded,
                                   ring=RingSettings(size=1, head_stride=1))
    return FrozenModel(settings, pad_id=0)


def pointers(module: torch.nn.Module) -> list[int]:
    return [t.data_ptr() for t in [*module.parameters(), *module.buffers()]]


def test_weights_visit_the_device_for_the_forwards_only():
    offloaded = reference(is_offloaded=True)
    weights = offloaded.weights
    host = [h.data_ptr() for h in weights.host_copies]
    assert len(host) == len(set(host)) and weights.num_bytes > 0
    assert sorted(pointers(offloaded.model)) == sorted(host)  # outside a forward: the host copies themselves
    during: list[list[int]] = []
    hook = offloaded.model.register_forward_pre_hook(lambda module, args: during.append(pointers(module)))
    try:
        got = offloaded.logprobs(PROMPTS, RESPONSES)
    finally:
        hook.remove()
    assert len(during) == 2 and not set(during[0]) & set(host)  # two micro-batches, on copies made for them
    assert sorted(pointers(offloaded.model)) == sorted(host)  # back on the host copies: nothing copied back
    expected = reference(is_offloaded=False).logprobs(PROMPTS, RESPONSES)
    torch.testing.assert_close(pad(got, 6), pad(expected, 6), rtol=0, atol=0)


def test_the_weights_return_to_the_host_when_a_forward_fails():
    module = torch.nn.Linear(3, 2)
    weights = HostResidentWeights(module, "cpu")
    host = [h.data_ptr() for h in weights.host_copies]
    with pytest.raises(RuntimeError, match="mat1 and mat2"), weights.on_device() as on_device:
        assert on_device.weight.data_ptr() not in host
        on_device(torch.zeros(1, 4))
    assert [module.weight.data_ptr(), module.bias.data_ptr()] == host


def test_an_empty_share_runs_nothing():
    offloaded = reference(is_offloaded=True)
    calls: list = []
    hook = offloaded.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    assert offloaded.logprobs([], []) == [] and calls == []
    hook.remove()
