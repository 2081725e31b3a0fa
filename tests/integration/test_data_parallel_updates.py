"""Data parallelism of the update loop with real DeepSpeed on CPU (gloo): two ranks that each train on their share
of every optimizer step make the same update as one rank training on all of it — the loss stays one token mean over
the whole step, DeepSpeed's average over ranks is undone, and a rank left with fewer micro-batches runs empty ones
so both step together."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from hybrid_core.workers.placement import free_port
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration
WORKER = REPO_ROOT / "tests" / "integration" / "data_parallel_update.py"


def run_update(tmp_path, tiny_model, world_size: int, zero_stage: int, layout: str) -> dict:
    out = tmp_path / f"update-{world_size}-{zero_stage}-{layout}.pt"
    env = os.environ | {"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world_size), "--master_port",
           str(free_port()),
           str(WORKER), str(tiny_model), str(out), str(zero_stage), layout]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out)


@pytest.mark.parametrize(("zero_stage", "layout"), [(2, "padded"), (2, "packed"), (3, "padded")])
def test_two_ranks_make_the_update_of_one(tmp_path, tiny_model, zero_stage, layout):
    one = run_update(tmp_path, tiny_model, 1, zero_stage, layout)
    two = run_update(tmp_path, tiny_model, 2, zero_stage, layout)
    assert (one["world_size"], two["world_size"]) == (1, 2)
    largest = max(d.abs().max().item() for d in one["deltas"].values())
    assert largest > 1e-3  # the update moved the weights
    for name, delta in one["deltas"].items():
        torch.testing.assert_close(two["deltas"][name], delta, rtol=0, atol=1e-5 * largest, msg=name)
    assert two["stats"].keys() == one["stats"].keys()
    for key, value in one["stats"].items():
        assert two["stats"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
