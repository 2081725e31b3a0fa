"""`benchmarks/run_all.py --only train_gaps` on the CPU: the iteration config's update, shrunk by flags onto the
tiny model, runs under torch's profiler with its host calls as ranges, and the results file counts them (its GPU
figures are the GPU's to give: on the CPU no GPU work is traced, so the update's window is idle throughout)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
# 4 samples of 48 prompt + 16 new tokens, a token budget of 64 a micro-batch: one sample each, 4 micro-batches
CPU_FLAGS = ["--train.device=cpu", "--ds.param_dtype=fp32", "--rollout.batch_size=2",
             "--rollout.n_samples_per_prompt=2", "--train.batch_size=4", "--train.micro_batch_size=2",
             "--rollout.micro_batch_size=2", "--rollout.max_new_tokens=16", "--train.max_tokens_per_gpu=64",
             "--data.max_len=128"]


def test_the_train_gaps_section_profiles_every_micro_batch_of_the_update(tiny_model, tmp_path):
    out = tmp_path / "gaps.json"
    command = [sys.executable, "benchmarks/run_all.py", "--model", str(tiny_model), "--only", "train_gaps",
               "--out", str(out), *(f"--iteration-flag={flag}" for flag in CPU_FLAGS)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    results = json.loads(out.read_text())
    assert results["errors"] == {}, done.stderr[-3000:]
    gaps = results["trials"]["train_gpu_busy_fraction"]
    calls = {name: figures["calls"] for name, figures in gaps["host_calls"].items() if not name.startswith("gc_")}
    assert calls == {"fit_actor": 1, "micro_batch": 4, "build_micro_batch": 4, "policy_forward": 4,
                     "loss_maths": 4, "backward": 4, "ds_step": 4}
    assert gaps["steps"] == 1
    assert results["figures"]["train_gpu_busy_fraction"] == 0.0
    assert gaps["gpu_idle_s"] == gaps["window_s"] > 0.0
