"""Data parallelism of the update loop with real DeepSpeed on CPU (gloo): two ranks that each train on their share
of every optimizer step make the same update as one rank training on all of it — the loss stays one token mean over
the whole step, DeepSpeed's average over ranks is undone, and a rank left with fewer micro-batches runs empty ones
so both step together. With ring attention the two ranks are one ring that splits every packed row: logprobs,
values and both updates are still those of one rank."""
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


LAYOUTS = ["2-padded", "2-packed", "3-padded"]  # ZeRO stage, then how the micro-batches are laid out
RING = "ring"  # ZeRO-2, packed, ring attention over every rank (data_parallel_update.ring)


def run_updates(out_dir, tiny_model, world_size: int) -> dict[str, dict]:
    """Every layout's update at `world_size` ranks, from one `torchrun` (its processes pay their imports once)."""
    out_dir.mkdir()
    env = os.environ | {"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world_size), "--master_port",
           str(free_port()), str(WORKER), str(tiny_model), str(out_dir), *LAYOUTS, RING]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return {layout: torch.load(out_dir / f"{layout}.pt") for layout in (*LAYOUTS, RING)}


@pytest.fixture(scope="module")
def updates(tmp_path_factory, tiny_model) -> dict[int, dict[str, dict]]:
    root = tmp_path_factory.mktemp("updates")
    return {world_size: run_updates(root / str(world_size), tiny_model, world_size) for world_size in (1, 2)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_ranks_make_the_update_of_one(updates, layout):
    one, two = updates[1][layout], updates[2][layout]
    assert (one["world_size"], two["world_size"]) == (1, 2)
    largest = max(d.abs().max().item() for d in one["deltas"].values())
    assert largest > 1e-3  # the update moved the weights
    for name, delta in one["deltas"].items():
        torch.testing.assert_close(two["deltas"][name], delta, rtol=0, atol=1e-5 * largest, msg=name)
    assert two["stats"].keys() == one["stats"].keys()
    for key, value in one["stats"].items():
        assert two["stats"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def _assert_same_update(one: dict, two: dict) -> None:
    largest = max(d.abs().max().item() for d in one.values())
    assert largest > 1e-3  # the update moved the weights
    for name, delta in one.items():
        torch.testing.assert_close(two[name], delta, rtol=0, atol=1e-5 * largest, msg=name)


def test_a_ring_of_two_ranks_computes_what_one_rank_does(updates):
    one, two = updates[1][RING], updates[2][RING]
    assert (one["ring_size"], two["ring_size"]) == (1, 2)
    for key in ("logprobs", "values"):  # ragged per-sample lists of the 8 samples
        assert [len(row) for row in two[key]] == [len(row) for row in one[key]] == [3, 5, 8, 2, 6, 4, 7, 1]
        torch.testing.assert_close(torch.tensor(sum(two[key], [])), torch.tensor(sum(one[key], [])),
                                   rtol=0, atol=1e-5, msg=key)
    assert max(abs(v) for row in one["values"] for v in row) > 0.1  # the random head gives values to compare
    _assert_same_update(one["deltas"], two["deltas"])
    _assert_same_update(one["critic_deltas"], two["critic_deltas"])
    for stats in ("stats", "critic_stats"):
        assert two[stats].keys() == one[stats].keys()
        for key, value in one[stats].items():
            assert two[stats][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (stats, key)
