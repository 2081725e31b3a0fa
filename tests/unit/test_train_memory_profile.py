"""The train-memory profile's replay of PyTorch's allocation trace (benchmarks/bench_train_memory.py): the bytes
live at the peak, by allocation site, and the plan terms it sets beside them."""
from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from tests.unit.plan_fixtures import liger, logprob_kernels  # noqa: F401 — autouse: the kernels the figures assume

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
PROFILE = runpy.run_path(str(REPO_ROOT / "benchmarks" / "bench_train_memory.py"))
QWEN3_1P7B = json.loads((REPO_ROOT / "data" / "model_shapes.json").read_text())["Qwen/Qwen3-1.7B"]


def frames(*names: str) -> list[dict]:
    """Innermost first, as PyTorch records them: `pkg/file.py:function`."""
    out = []
    for name in names:
        path, function = name.split(":")
        out.append({"filename": f"/usr/lib/python3/site-packages/{path}", "line": 7, "name": function})
    return out


def test_the_site_is_the_innermost_frame_outside_torch():
    site = PROFILE["allocation_site"]
    stack = frames("torch/nn/functional.py:linear", "torch/nn/modules/linear.py:forward",
                   "liger_kernel/ops/swiglu.py:forward", "hybrid_core/engines/actor_trainer.py:fit_actor")
    assert site(stack) == "liger_kernel/ops/swiglu.py:7 forward"
    assert site(frames("torch/autograd/graph.py:_engine_run_backward")) == PROFILE["NO_PYTHON_FRAME"]
    assert site([]) == PROFILE["NO_PYTHON_FRAME"]


def test_the_peak_holds_the_live_blocks_and_what_is_left_of_the_resident_ones():
    x, y = frames("deepspeed/zero/stage_1_and_2.py:step"), frames("hybrid_core/engines/logprob_kernel.py:forward")
    trace = [{"action": "alloc", "addr": 1, "size": 50, "frames": x},    # 150
             {"action": "alloc", "addr": 2, "size": 30, "frames": y},    # 180
             {"action": "free_requested", "addr": 1, "size": 50},        # still counted until completed
             {"action": "free_completed", "addr": 1, "size": 50},        # 130
             {"action": "alloc", "addr": 3, "size": 60, "frames": x},    # 190
             {"action": "free_completed", "addr": 99, "size": 40},       # a resident block: 150
             {"action": "alloc", "addr": 4, "size": 45, "frames": x},    # 195, the peak
             {"action": "free_completed", "addr": 2, "size": 30}]        # 165
    peak, sites = PROFILE["live_at_peak"](trace, resident_bytes=100)
    assert peak == 195
    assert sites == {"deepspeed/zero/stage_1_and_2.py:7 step": 105, PROFILE["RESIDENT"]: 60,
                     "hybrid_core/engines/logprob_kernel.py:7 forward": 30}
    assert list(sites) == ["deepspeed/zero/stage_1_and_2.py:7 step", PROFILE["RESIDENT"],
                           "hybrid_core/engines/logprob_kernel.py:7 forward"]


def test_a_trace_that_only_frees_peaks_at_its_start():
    trace = [{"action": "free_completed", "addr": 5, "size": 10}, {"action": "segment_free", "addr": 0, "size": 64}]
    assert PROFILE["live_at_peak"](trace, resident_bytes=70) == (70, {PROFILE["RESIDENT"]: 70})


def test_sites_past_the_top_are_summed_in_gib():
    gib = 2**30
    sites = {"a": 3 * gib, "b": 2 * gib, "c": gib, "d": gib // 2}
    assert PROFILE["top_sites_gib"](sites, top=2) == {"a": 3.0, "b": 2.0, "other sites (2)": 1.5}


@pytest.mark.parametrize(("checkpointing", "activations_gib"), [
    # per token and layer without recomputation (the model's own kernels): 12·2048 + 14·2048 + 12·1024 + 8·6144 =
    # 114,688 bytes; × 28 layers × 16,384 tokens = 52,613,349,376 bytes = 49.0 GiB
    ("false", 49.0),
    # with it, each layer's 2-byte input (2·2048·28 = 114,688 bytes a token) plus one recomputed layer (114,688):
    # 229,376 bytes × 16,384 tokens = 3.5 GiB
    ("true", 3.5),
])
def test_the_plan_terms_are_the_actors_train_phase_at_the_iteration_shape(tmp_path, checkpointing, activations_gib):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_1P7B))
    cfg = PROFILE["iteration_config"]("h200-iteration", tmp_path,
                                      [f"--actor.gradient_checkpointing_enable={checkpointing}"])
    terms = PROFILE["plan_terms_gib"](cfg, 139.8)
    assert terms["actor activations"] == pytest.approx(activations_gib, abs=1e-9)
    actor = {name: gib for name, gib in terms.items() if name.startswith("actor ") and name != "actor terms, summed"}
    assert set(actor) >= {"actor weights", "actor gradients", "actor optimizer states", "actor optimizer step"}
    assert terms["actor terms, summed"] == pytest.approx(sum(actor.values()))
    assert terms["phase total (all roles)"] > terms["actor terms, summed"]


def test_the_update_samples_have_the_configs_shape(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_1P7B))
    cfg = PROFILE["iteration_config"]("h200-iteration", tmp_path, [])
    samples = PROFILE["update_samples"](cfg, seed=3)
    assert len(samples) == 256
    assert {len(p) for p in samples.prompt_ids} == {PROFILE["PROMPT_TOKENS"]}
    assert {len(r) for r in samples.response_ids} == {1024}
    assert samples.old_logprobs is None  # on policy: the update's own forward serves, as in the iteration
    assert {len(r) for r in samples.ref_logprobs} == {1024}  # kl init_coef 0.001, as a loss
