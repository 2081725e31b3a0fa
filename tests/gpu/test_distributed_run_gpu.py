"""Distributed mode on two GPUs: `hybrid train` without --train.colocate_all puts the actor and the reference on
GPU 0 and the vLLM engine on GPU 1 of their own, and every sync is an NCCL broadcast of flat buckets from the
actor to the engine (`plan.placement.sync_transport` = process_group:nccl). Needs 2 GPUs (skipped on one).

The check that the broadcast carried the weights: at step 2 the engine's logprobs of its own samples
(`rollout_logprobs`) match the trained actor's (`old_logprobs`), while the reference (the initial weights) is far
from both, so an engine still holding the initial weights would fail."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from test_colocated_run_gpu import REPO_ROOT, colocated_config, product_env

pytestmark = pytest.mark.gpu
STEPS = 2


@pytest.fixture(scope="module")
def two_gpus(cuda):
    if cuda.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (distributed mode puts the engine on a GPU of its own)")


def distributed_config(standin, root):
    path = colocated_config(standin, root)
    cfg = yaml.safe_load(path.read_text())
    cfg["train"] |= {"colocate_all": False, "colocate_actor_ref": True}
    cfg["vllm"] |= {"enable_sleep": False, "sync_backend": "nccl", "gpu_memory_utilization": 0.5}
    cfg["ds"] |= {"enable_sleep": False}
    # two optimizer steps a step: not on-policy, so the advantage stage commits the actor's own logprobs (compared)
    cfg["train"] |= {"batch_size": 4, "micro_batch_size": 2}
    cfg["rollout"] |= {"logprobs": True}  # compared below; nothing of the run reads them, so they are asked for
    # the random stand-in earns no reward, so advantages are 0; the entropy bonus makes the first update move anyway
    cfg["actor"] |= {"entropy_coef": 0.01}
    path.write_text(yaml.safe_dump(cfg))
    return path


def by_sample(table, column: str) -> dict[tuple[int, int], list[float]]:
    keys = zip(table.column("prompt_index").to_pylist(), table.column("sample_index").to_pylist())
    return dict(zip(keys, table.column(column).to_pylist()))


def mean_abs_by_sample(a: dict, b: dict) -> float:
    """Mean |a − b| over every response token of the samples both hold (same keys, same lengths)."""
    assert a.keys() == b.keys() and all(len(a[k]) == len(b[k]) for k in a), "tables disagree on samples"
    diffs = [abs(x - y) for key in a for x, y in zip(a[key], b[key])]
    return sum(diffs) / len(diffs)


def test_distributed_run_syncs_over_nccl(standin, two_gpus, tmp_path):
    import pyarrow.dataset as pds

    from hybrid_core.config import RunConfig
    from hybrid_core.plan.placement import make_placement
    from hybrid_core.plan.run_plan import sync_transport

    config = distributed_config(standin, tmp_path)
    cfg = RunConfig.model_validate(yaml.safe_load(config.read_text()))
    assert sync_transport(cfg) == "process_group:nccl" and make_placement(cfg).num_gpus == 2
    done = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--config", str(config), "--run_id", "dist2"],
                          cwd=REPO_ROOT, env=product_env(tmp_path), capture_output=True, text=True, timeout=900)
    print(done.stdout[-6000:], done.stderr[-6000:])
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "dist2"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert sorted(manifest["steps"]) == [str(k) for k in range(1, STEPS + 1)]
    rollout = pds.dataset(str(run_dir / "steps" / "2" / "rollout"), format="parquet").to_table()
    experience = pds.dataset(str(run_dir / "steps" / "2" / "advantage"), format="parquet").to_table()
    actor = by_sample(experience, "old_logprobs")
    synced = mean_abs_by_sample(by_sample(rollout, "rollout_logprobs"), actor)
    moved = mean_abs_by_sample(by_sample(experience, "ref_logprobs"), actor)
    print(f"step 2: mean |engine - actor| = {synced:.4f}, mean |initial - actor| = {moved:.4f}")
    assert moved >= 0.05, "the first update did not move the policy enough to tell synced from stale weights"
    assert synced <= 0.05
