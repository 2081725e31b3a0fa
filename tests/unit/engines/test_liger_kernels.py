"""Unit tests for hybrid_core.engines.liger_kernels: which of Liger's patches are asked for, the default (on CUDA
where they apply, with a message where they do not), and the errors.

Liger's kernels are Triton (CUDA only) and the package is not installed on CPU machines, so these tests put a
recording stand-in for its patch table in place; tests/gpu/test_liger_gpu.py runs the real kernels."""
import sys
import types

import pytest
import torch

from hybrid_core.engines.liger_kernels import apply_fast_kernels, apply_liger_kernels


class _Model(torch.nn.Module):
    def __init__(self, model_type: str):
        super().__init__()
        self.config = types.SimpleNamespace(model_type=model_type)


def _install_fake_liger(monkeypatch, calls: list) -> None:
    def apply_to_qwen3(rope=True, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True, swiglu=True,
                       model=None):
        calls.append({"rope": rope, "cross_entropy": cross_entropy, "fused": fused_linear_cross_entropy,
                      "rms_norm": rms_norm, "swiglu": swiglu, "model": model})

    def apply_without_swiglu(rope=True, rms_norm=True, model=None):
        calls.append({"rope": rope, "rms_norm": rms_norm, "model": model})

    patch = types.ModuleType("liger_kernel.transformers.monkey_patch")
    patch.MODEL_TYPE_TO_APPLY_LIGER_FN = {"qwen3": apply_to_qwen3, "tiny": apply_without_swiglu}
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", patch)


def test_the_fused_kernels_are_applied_and_the_cross_entropy_forwards_are_not(monkeypatch):
    calls = []
    _install_fake_liger(monkeypatch, calls)
    model = _Model("qwen3")
    apply_liger_kernels(model)
    assert calls == [{"rope": True, "cross_entropy": False, "fused": False, "rms_norm": True, "swiglu": True,
                      "model": model}]  # Liger's default would replace the forward with its fused loss
    calls.clear()
    apply_liger_kernels(_Model("tiny"))  # only the arguments its function takes
    assert [set(c) for c in calls] == [{"rope", "rms_norm", "model"}]


def test_a_model_type_liger_does_not_cover_is_named(monkeypatch):
    _install_fake_liger(monkeypatch, [])
    with pytest.raises(ValueError, match=r"no kernels for model type 'gpt_oss_x' \(it covers qwen3, tiny\); drop "
                                         r"--ds.use_liger_kernel"):
        apply_liger_kernels(_Model("gpt_oss_x"))


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # import fails as when it is not installed
    with pytest.raises(ImportError, match=r"pip install 'hybrid-engine\[liger\]'"):
        apply_liger_kernels(_Model("qwen3"))


def test_the_default_applies_them_on_cuda_only_and_says_why_not(monkeypatch, caplog):
    calls = []
    _install_fake_liger(monkeypatch, calls)
    assert apply_fast_kernels(_Model("qwen3"), None) is False and not calls  # CPU: the model's own kernels
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert apply_fast_kernels(_Model("qwen3"), None) is True and len(calls) == 1
    assert apply_fast_kernels(_Model("qwen3"), False) is False and len(calls) == 1  # asked for the model's own
    with caplog.at_level("WARNING"):
        assert apply_fast_kernels(_Model("gpt_oss_x"), None) is False
    assert "Liger has none for model type 'gpt_oss_x'; the model's own kernels run" in caplog.text
    with pytest.raises(ValueError, match="drop --ds.use_liger_kernel"):  # the flag still requires them
        apply_fast_kernels(_Model("gpt_oss_x"), True)


def test_the_default_without_the_package_says_how_to_install_it(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with caplog.at_level("WARNING"):
        assert apply_fast_kernels(_Model("qwen3"), None) is False
    assert "liger-kernel package is not installed (pip install 'hybrid-engine[liger]')" in caplog.text
