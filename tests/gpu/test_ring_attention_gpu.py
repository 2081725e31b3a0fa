"""Ring attention on CUDA with one GPU (a ring of two ranks needs two GPUs: NCCL refuses two ranks on one device).

1. The ranks simulated in one process (their all-gather played by slices of the whole row): each rank's chunk
   through PyTorch's varlen flash kernel in bf16 — queries with more keys than themselves, bottom-right causal —
   gives the whole row's varlen attention, outputs and gradients, as close to an fp32 reference as the whole-row
   kernel is, for several ring sizes and head strides.
2. A ring of one rank through transformers and a real NCCL process group (the `hybrid_ring` kernel, the chunk's
   inputs, the all-gather of results and the keys' reduce-scatter): the `hybrid_varlen` model's logprobs and
   gradients.

Only torch and transformers: the tiny model is built here.
"""
from __future__ import annotations

import runpy

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.gpu
LENGTHS = [300, 17, 1000, 5, 700, 2]  # samples of one packed row (2,024 tokens)
HEADS, KV_HEADS, DIM = 8, 4, 64


@pytest.fixture(scope="module")
def torch_cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch


def _row(torch, dtype):
    g = torch.Generator("cuda").manual_seed(0)
    total = sum(LENGTHS)
    return [torch.randn(total, heads, DIM, generator=g, device="cuda").to(dtype).requires_grad_()
            for heads in (HEADS, KV_HEADS, KV_HEADS)]


def _with_grads(torch, attention, q, k, v, weights):
    out = attention(q, k, v)
    grads = torch.autograd.grad((out.float() * weights).sum(), (q, k, v))
    return out.float(), [g.float() for g in grads]


def _relative(torch, got: list, exact: list) -> float:
    return float(torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(got, exact)) / sum((b ** 2).sum() for b in exact)))


@pytest.mark.parametrize("ring_size, head_stride", [(2, 1), (2, 4), (3, 2), (4, 1)])
def test_simulated_ring_chunks_match_the_varlen_kernel(torch_cuda, ring_size, head_stride, monkeypatch):
    from hybrid_core.engines import varlen_attention
    from hybrid_core.engines.varlen_attention import VarlenBounds, causal_varlen_attention
    from tests.ring_simulation import simulated_ring_attention

    torch = torch_cuda
    flash_calls = []
    real_flash = varlen_attention._flash_varlen
    monkeypatch.setattr(varlen_attention, "_flash_varlen", lambda *a: flash_calls.append(1) or real_flash(*a))
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    whole = lambda q, k, v: causal_varlen_attention(q, k, v, VarlenBounds.same(cu, max(LENGTHS)),  # noqa: E731
                                                   DIM ** -0.5)
    ring = lambda q, k, v: simulated_ring_attention(q, k, v, LENGTHS, ring_size, head_stride)  # noqa: E731
    weights = torch.randn(sum(LENGTHS), HEADS, DIM, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    exact, exact_grads = _with_grads(torch, whole, *_row(torch, torch.float32), weights)  # fp32: exact sdpa
    assert not flash_calls
    kernel, kernel_grads = _with_grads(torch, whole, *_row(torch, torch.bfloat16), weights)
    chunks, chunk_grads = _with_grads(torch, ring, *_row(torch, torch.bfloat16), weights)
    assert len(flash_calls) == 1 + ring_size * KV_HEADS // head_stride  # bf16 took the flash kernel every time
    kernel_error, chunk_error = float((kernel - exact).abs().max()), float((chunks - exact).abs().max())
    kernel_grad_error = _relative(torch, kernel_grads, exact_grads)
    chunk_grad_error = _relative(torch, chunk_grads, exact_grads)
    print(f"ring {ring_size} stride {head_stride}: output max error whole-row varlen {kernel_error:.3e}, ring chunks "
          f"{chunk_error:.3e}; gradient relative error {kernel_grad_error:.3e}, {chunk_grad_error:.3e}")
    assert chunk_error <= 2 * kernel_error + 1e-3
    assert chunk_grad_error <= 2 * kernel_grad_error + 1e-3


@pytest.fixture(scope="module")
def tiny_dir(torch_cuda, tmp_path_factory):
    return runpy.run_path(str(REPO_ROOT / "data" / "build_tiny_model.py"))["build"](tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def nccl_world_of_one(torch_cuda):
    import torch.distributed as dist

    from hybrid_core.workers.placement import free_port

    if dist.is_initialized():  # an earlier test of the session (a DeepSpeed engine) made this process's world of one
        assert dist.get_world_size() == 1 and dist.get_backend() == "nccl", (dist.get_world_size(), dist.get_backend())
        yield dist.group.WORLD
        return
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _logprobs_and_grads(torch, model, batch, weights):
    from hybrid_core.engines.vocab_head import response_logprobs

    model.zero_grad()
    logprobs = response_logprobs(model, batch)
    (logprobs.float() * weights).sum().backward()
    return logprobs.detach().float(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


def test_a_ring_of_one_rank_through_the_model_matches_the_varlen_kernel(torch_cuda, tiny_dir, nccl_world_of_one):
    from hybrid_core.engines.frozen_model import load_causal_lm
    from hybrid_core.engines.ring_attention import RingGroup, register_ring_attention
    from hybrid_core.engines.sequence_batch import make_sequence_batch, on_ring
    from hybrid_core.engines.varlen_attention import register_varlen_attention

    torch = torch_cuda
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 100, (n,), generator=g).tolist() for n in (5, 40, 9, 3)]
    responses = [torch.randint(3, 100, (n,), generator=g).tolist() for n in (64, 7, 30, 1)]
    batch = make_sequence_batch(prompts, responses, 0, is_packed=True).to("cuda")
    weights = torch.randn(4, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    varlen = load_causal_lm(str(tiny_dir), "bf16", register_varlen_attention()).cuda()
    expected, expected_grads = _logprobs_and_grads(torch, varlen, batch, weights)
    ring_model = load_causal_lm(str(tiny_dir), "bf16", register_ring_attention()).cuda()
    ring = RingGroup(group=nccl_world_of_one, rank=0, size=1, head_stride=1)
    got, got_grads = _logprobs_and_grads(torch, ring_model, on_ring(batch, ring, 0), weights)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)  # the same kernel on the same tokens
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=0, atol=1e-6 * max(1.0, float(grad.abs().max())),
                                   msg=name)
