"""The `hybrid` command line, run as a real subprocess: refusal before anything starts, plan output, typos."""
from __future__ import annotations

import subprocess
import sys
import time

from test_flags import SEED_ARGV  # the spec's launch recipe, verbatim

from tests.conftest import REPO_ROOT


def hybrid(*args: str, timeout: float = 60) -> tuple[int, str, float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout, env={"PATH": "/usr/bin:/bin", "HOME": str(REPO_ROOT)})
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start


def test_train_refuses_the_seed_recipe_with_one_message():
    rc, out, seconds = hybrid("train", *SEED_ARGV)
    assert rc == 2, out
    assert seconds < 30
    assert "Traceback" not in out
    assert out.count("hybrid train cannot start") == 1
    assert "needs 4 GPUs, found 0" in out
    assert "not implemented" not in out  # ZeRO-3 over 4 ranks, ring attention and TP engines: all accepted now
    assert "ray" not in out.lower().replace("ring_attn", "").replace("array", "")  # Ray never started


def test_plan_prints_the_seed_placement_and_exits_0():
    rc, out, _ = hybrid("plan", *SEED_ARGV)
    assert rc == 0, out
    assert "needs 4 GPUs" in out
    assert "actor 0.2, ref 0.2, rollout 0.2" in out
    assert "2 vLLM engines × TP 2" in out
    assert "sleep: vLLM on (level 1), DeepSpeed on" in out
    assert "ring attention: each packed sample split over 2 ranks" in out


def test_typo_suggests_the_flag():
    rc, out, _ = hybrid("plan", "--vllm.enable_slep")
    assert rc == 2
    assert "did you mean --vllm.enable_sleep?" in out
    assert "Traceback" not in out


def test_sleep_with_async_names_both_flags():
    rc, out, _ = hybrid("train", "--train.colocate_all", "--vllm.enable_sleep", "--train.async_enable")
    assert rc == 2
    assert "vllm.enable_sleep" in out and "train.async_enable" in out
    assert "Traceback" not in out


def test_train_on_cpu_lists_missing_inputs_without_gpus_named():
    rc, out, _ = hybrid("train", "--train.device", "cpu", "--train.colocate_all", "--actor.num_gpus_per_node", "1",
                        "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
                        "--algo.advantage.estimator", "reinforce")
    assert rc == 2, out
    assert "actor.model_name_or_path is required" in out
    assert "data.prompt_dataset is required" in out
    assert "GPUs" not in out


def test_plan_prints_the_seed_memory_estimate_without_a_gpu():
    rc, out, _ = hybrid("plan", *SEED_ARGV)
    assert rc == 0, out
    assert "memory per GPU of the actor's group, estimated for a 139.80 GiB GPU (assumed: no GPU found" in out
    assert "    vLLM reservation: 97.86 GiB" in out  # 0.7 of the GPU
    # its logits are one chunk's (vocab_head), a ring of 2 halves each sample's activations, and the reference is
    # whole on every GPU (ZeRO-3 does not partition it)
    assert "  peak: " in out and "  fits on a 139.80 GiB GPU (" in out
    assert "Traceback" not in out
