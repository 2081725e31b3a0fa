"""The product on one GPU: `hybrid train` (Prefect flow on the embedded server) runs 2 steps with the actor, the
reference and the rollout engine as Ray workers sharing the GPU through one placement group of fractional GPUs.
Ray and Prefect are imported by the child process only (they come with the payload's --with-ray-prefect)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.gpu
REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 2


def colocated_config(standin: Path, root: Path) -> Path:
    cfg = yaml.safe_load((REPO_ROOT / "data" / "demo.yaml").read_text())
    cfg["actor"]["model_name_or_path"] = str(standin)
    cfg["vllm"] |= {"gpu_memory_utilization": 0.3, "enforce_eager": True, "enable_sleep": True}
    cfg["ds"] |= {"param_dtype": "bf16", "enable_sleep": True}
    cfg["rollout"] |= {"batch_size": 4, "n_samples_per_prompt": 2, "micro_batch_size": 8, "max_new_tokens": 32}
    cfg["train"] |= {"batch_size": 8, "micro_batch_size": 4, "max_steps": STEPS, "device": "cuda"}
    cfg["data"]["prompt_dataset"] = str(REPO_ROOT / "data" / "demo_prompts.jsonl")
    cfg["reward"]["remote_url"] = str(REPO_ROOT / "data" / "letters_reward.py")
    eval_file = root / "letters_eval.jsonl"
    eval_file.write_text("".join((REPO_ROOT / "data" / "demo_prompts.jsonl").read_text().splitlines(True)[:6]))
    cfg["eval"] = {"dataset": str(eval_file), "steps": 1, "at_start": True, "n_samples_per_prompt": 2}
    cfg["store"] = {"root": str(root / "runs")}
    path = root / "colocated.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def product_env(root: Path) -> dict[str, str]:
    """The environment of a `hybrid train` child: the repository importable, Prefect's home under `root`."""
    return os.environ | {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                         "PREFECT_HOME": str(root / "prefect"), "PYTHONPATH": os.pathsep.join(
                             [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}


def test_two_colocated_steps_on_one_gpu(standin, tmp_path):
    import pyarrow.dataset as pds

    config = colocated_config(standin, tmp_path)
    done = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--config", str(config), "--run_id", "gpu2"],
                          cwd=REPO_ROOT, env=product_env(tmp_path), capture_output=True, text=True, timeout=900)
    print(done.stdout[-6000:], done.stderr[-6000:])
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "gpu2"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert sorted(manifest["steps"]) == [str(k) for k in range(0, STEPS + 1)]  # step 0: the initial evaluation
    for step in range(0, STEPS + 1):  # the engine slept between its evaluation and the next rollout
        evaluated = pds.dataset(str(run_dir / "steps" / str(step) / "eval"), format="parquet").to_table()
        assert evaluated.num_rows == 12 and set(evaluated.column("policy_version").to_pylist()) == {step}
    for step in range(1, STEPS + 1):
        row = pds.dataset(str(run_dir / "steps" / str(step) / "metrics"), format="parquet").to_table().to_pylist()[0]
        assert row["rollout/response_length_mean"] > 0
        for key in ("timing_s/rollout", "timing_s/train", "timing_s/sync", "timing_s/vllm_wake",
                    "timing_s/ds_wake", "timing_s/ds_sleep", "memory_gib/actor_experience", "memory_gib/actor_train"):
            assert key in row, key
        assert 0.0 <= row["eval/letters_eval_pass1"] <= row["eval/letters_eval_pass2"] <= 1.0
        # the actor's peaks lie between its bf16 weights (0.6B: > 1 GiB) and the whole GPU
        assert 1.0 < row["memory_gib/actor_experience"] < 140 and 1.0 < row["memory_gib/actor_train"] < 140
        print(f"step {step}: " + ", ".join(f"{k}={v:.3f}" for k, v in row.items()
                                           if k.startswith(("timing_s/", "memory_gib/")) and isinstance(v, float)))
