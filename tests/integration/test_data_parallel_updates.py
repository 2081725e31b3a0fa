"""Data parallelism of the update loop with real DeepSpeed on CPU (gloo): two ranks that each train on their share
of every optimizer step make the same update as one rank training on all of it — the loss stays one token mean over
the whole step, DeepSpeed's average over ranks is undone, and a rank left with fewer micro-batches runs placeholder
ones so both step together (under ZeRO-3 too, where every forward gathers the weights from both ranks). ZeRO-3 with
the vocabulary head in chunks of 3 tokens makes the update of ZeRO-2 in one chunk, and of ZeRO-3 in one chunk with
tied embeddings; two ZeRO-3 ranks whose micro-batches need different chunk counts still gather the head in step and
make the update of one. With ring attention the two ranks are one ring that splits every packed row, each rank's
head in chunks over its own response tokens: logprobs, values and both updates are still those of one rank. One rank
also checks the memory options: the optimizer on the host (`ds.adam_offload`) makes the device step's update, and
Muon's update of each hidden matrix is its orthogonalised momentum."""
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


# ZeRO stage, how the micro-batches are laid out, then options (see data_parallel_update.py). The samples' 1–8
# response tokens in micro-batches of 2 make 1–4 chunks of 3 tokens, different on the two ranks; packed under a
# 16-token budget the ranks' shares make different numbers of micro-batches.
LAYOUTS = ["2-padded", "2-packed", "3-padded-chunk3", "3-packed-tied"]
ONE_RANK_LAYOUTS = ["3-packed-tied-chunk3", "2-padded-offload", "2-padded-muon"]
# ZeRO-2, packed, ring attention over every rank (data_parallel_update.ring): a rank's half of a packed row of at
# most 16 tokens holds 0–8 response tokens, so 1–3 head chunks of 3 (one empty chunk for none)
RING = "ring-chunk3"


def run_updates(out_dir, tiny_model, tied_model, world_size: int, layouts: list[str]) -> dict[str, dict]:
    """Every layout's update at `world_size` ranks, from one `torchrun` (its processes pay their imports once)."""
    out_dir.mkdir()
    env = os.environ | {"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world_size), "--master_port",
           str(free_port()), str(WORKER), str(tiny_model), str(tied_model), str(out_dir), *layouts]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return {layout: torch.load(out_dir / f"{layout}.pt") for layout in layouts}


def tied_copy(tiny_model, out_dir):
    """The tiny model with its vocabulary head tied to the embedding: one weight, the embedding's (transformers will
    not tie a checkpoint whose two matrices differ, so the head's is left out)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    untied = AutoModelForCausalLM.from_pretrained(tiny_model)
    tied = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model, tie_word_embeddings=True))
    tied.load_state_dict({k: v for k, v in untied.state_dict().items() if k != "lm_head.weight"}, strict=False)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    tied.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def updates(tmp_path_factory, tiny_model) -> dict[int, dict[str, dict]]:
    root = tmp_path_factory.mktemp("updates")
    tied = tied_copy(tiny_model, root / "tied-model")
    return {world_size: run_updates(root / str(world_size), tiny_model, tied, world_size,
                                    [*LAYOUTS, RING, *(ONE_RANK_LAYOUTS if world_size == 1 else [])])
            for world_size in (1, 2)}


def assert_same_update(got: dict, expected: dict) -> None:
    largest = max(d.abs().max().item() for d in expected["deltas"].values())
    assert largest > 1e-3  # the update moved the weights
    assert got["deltas"].keys() == expected["deltas"].keys()
    for name, delta in expected["deltas"].items():
        torch.testing.assert_close(got["deltas"][name], delta, rtol=0, atol=1e-5 * largest, msg=name)
    assert got["stats"].keys() == expected["stats"].keys()
    for key, value in expected["stats"].items():
        assert got["stats"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_ranks_make_the_update_of_one(updates, layout):
    one, two = updates[1][layout], updates[2][layout]
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert_same_update(two, one)


def test_the_chunked_head_makes_the_update_of_one_chunk(updates):
    one = updates[1]
    assert_same_update(one["3-padded-chunk3"], one["2-padded"])  # ZeRO-3 gathers the head for every chunk
    tied, tied_chunked = one["3-packed-tied"], one["3-packed-tied-chunk3"]
    assert "model.embed_tokens.weight" in tied["deltas"] and "lm_head.weight" not in tied["deltas"]  # one weight
    assert_same_update(tied_chunked, tied)


def test_a_ring_of_two_ranks_computes_what_one_rank_does(updates):
    one, two = updates[1][RING], updates[2][RING]
    assert (one["ring_size"], two["ring_size"]) == (1, 2)
    for key in ("logprobs", "values"):  # ragged per-sample lists of the 8 samples
        assert [len(row) for row in two[key]] == [len(row) for row in one[key]] == [3, 5, 8, 2, 6, 4, 7, 1]
        torch.testing.assert_close(torch.tensor(sum(two[key], [])), torch.tensor(sum(one[key], [])),
                                   rtol=0, atol=1e-5, msg=key)
    assert max(abs(v) for row in one["values"] for v in row) > 0.1  # the random head gives values to compare
    assert_same_update(two, one)
    critic = [{"deltas": run["critic_deltas"], "stats": run["critic_stats"]} for run in (one, two)]
    assert_same_update(critic[1], critic[0])


@pytest.mark.parametrize("layout", ["3-padded-chunk3", "3-packed-tied"])
def test_zero3_ranks_take_uneven_shares_of_the_forwards_in_lockstep(updates, layout):
    """One sample on rank 0 and seven on rank 1 (one forward against four): the logprobs of the one-rank forward."""
    one, two = updates[1][layout]["logprobs"], updates[2][layout]["logprobs"]
    assert [len(row) for row in one] == [3, 5, 8, 2, 6, 4, 7, 1]
    assert [len(row) for row in two] == [len(row) for row in one]
    for got, expected in zip(two, one):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_the_optimizer_on_the_host_makes_the_device_steps_update(updates):
    on_host, on_device = updates[1]["2-padded-offload"], updates[1]["2-padded"]
    assert on_host["is_offloaded"] and not on_device["is_offloaded"]  # DeepSpeed's ZeRO-Offload is on
    assert on_host["optimizer"] == on_device["optimizer"] == "AdamW"  # torch's AdamW on a CPU run (no op to build)
    assert on_host["state_devices"] == ["cpu"]  # fp32 masters and Adam moments
    assert_same_update(on_host, on_device)


def newton_schulz(update: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Muon's orthogonalisation written out in fp64: the quintic Newton–Schulz iteration (a, b, c) = (3.4445, −4.7750,
    2.0315) on the update scaled to unit Frobenius norm, run on its wide orientation, then scaled by
    sqrt(max(1, rows / cols)) (Keller Jordan's Muon, as DeepSpeed applies it)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    rows, cols = update.shape
    x = update.double().T if rows > cols else update.double()
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if rows > cols else x) * max(1.0, rows / cols) ** 0.5


def test_muon_steps_each_hidden_matrix_by_its_orthogonalised_momentum(updates):
    """Step 1 from zero momentum: Nesterov's update is (1 − β²)·G, which the normalisation cancels, so each hidden
    matrix moves by −lr · NS(G); the embeddings, the head and the norms take the auxiliary Adam's first step,
    −lr · G / (|G| + eps)."""
    from deepspeed.runtime.zero.muon.original_muon import ns_compute_dtype

    muon = updates[1]["2-padded-muon"]
    assert muon["optimizer"] == "MuonWithAuxAdam"
    lr, gradients, uses_muon = muon["muon"]["lr"], muon["gradients"], muon["uses_muon"]
    matrices = [n for n, is_muon in uses_muon.items() if is_muon]
    assert matrices and all(".layers." in n and n.endswith("proj.weight") for n in matrices)
    assert {n for n, is_muon in uses_muon.items() if not is_muon} >= {"model.embed_tokens.weight", "lm_head.weight"}
    # DeepSpeed runs the iteration in fp16 where the processor has it (CPUs with AVX512-FP16 do), else in fp32
    tolerance = 2e-2 if ns_compute_dtype("gram") == torch.float16 else 1e-4
    for name in matrices:
        expected = -lr * newton_schulz(gradients[name]).float()
        torch.testing.assert_close(muon["deltas"][name], expected, rtol=0, atol=tolerance * lr, msg=name)
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        g = gradients[name]
        torch.testing.assert_close(muon["deltas"][name], -1e3 * g / (g.abs() + 1e3), rtol=1e-4, atol=1e-7, msg=name)
    # DeepSpeed's gradient norm (and so its clipping, --actor.max_norm) is taken after Newton–Schulz: the norm of the
    # orthogonalised updates and the auxiliary gradients (22.1 here, where max_norm 1.0 would shrink Muon's step 22×)
    norm = sum(float((newton_schulz(g) ** 2).sum()) if uses_muon[n] else float((g ** 2).sum())
               for n, g in gradients.items()) ** 0.5
    assert muon["stats"]["grad_norm"] == pytest.approx(norm, rel=5e-3)
