"""Weight sync on the GPU: a trained DeepSpeed policy's weights reach the vLLM engine in buckets (in-process
copy), and buckets shared through CUDA IPC open in another process without a copy."""
from __future__ import annotations

import multiprocessing

import pytest
from gpu_helpers import fixed_sequence, mean_abs_diff, send_buckets

pytestmark = pytest.mark.gpu


def sft_loss(prompt: list[int], response: list[int]):
    """The negative mean logprob of `response` after `prompt`, as a DeepSpeed micro-batch loss."""
    from hybrid_core.engines.sequence_batch import make_sequence_batch
    from hybrid_core.engines.vocab_head import response_logprobs

    def loss_fn(model):
        batch = make_sequence_batch([prompt], [response], 0).to("cuda")
        logprobs = response_logprobs(model, batch)
        return -(logprobs * batch.response_mask).sum() / batch.response_mask.sum(), {}
    return loss_fn


def test_sync_makes_vllm_logprobs_match_the_trained_policy(rollout_engine, make_trainer):
    from hybrid_core.engines.sequence_batch import MicroBatching
    from hybrid_core.engines.weight_sync import iter_buckets, unflatten

    engine, _ = rollout_engine
    engine.wake_up(["weights", "kv_cache"])
    trainer = make_trainer(lr=1e-3)
    prompt, response = fixed_sequence(16, 100), fixed_sequence(256, 101)
    trainer.wake_up()
    trainer.train_micro_batch(sft_loss(prompt, response), is_boundary=True)
    trained = trainer.logprobs([prompt], [response], MicroBatching(num_samples=1))[0]
    stale = engine.score([prompt], [response])[0]
    assert mean_abs_diff(trained, stale) >= 0.05
    for bucket in iter_buckets(trainer.module, 64 * 2**20):
        engine.load_weights(unflatten(bucket))
    engine.finish_weight_update()
    synced = engine.score([prompt], [response])[0]
    assert mean_abs_diff(trained, synced) <= 0.02


def _share_from_child(conn, seed: int) -> None:
    """Child process: pack a seeded module's parameters into persistent buffers and share them via CUDA IPC."""
    import torch

    torch.manual_seed(seed)
    module = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)]).cuda().to(torch.bfloat16)
    send_buckets(conn, module, 300_000)
    conn.recv()


def test_cuda_ipc_buckets_open_in_another_process_without_copies(cuda):
    import sys

    from hybrid_core.engines.weight_sync import open_shared_bucket, unflatten

    torch = cuda
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_share_from_child, args=(child, 7))
    process.start()
    torch.manual_seed(7)
    expected = dict(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)]).cuda()
                    .to(torch.bfloat16).named_parameters())
    received, buffers_seen = {}, set()
    while (shared := parent.recv()) is not None:
        bucket = open_shared_bucket(shared)
        assert open_shared_bucket(shared).flat is bucket.flat  # a second open reuses the cached mapping
        buffers_seen.add(bucket.flat.data_ptr())
        received |= {name: tensor.clone() for name, tensor in unflatten(bucket)}
        parent.send("loaded")
    parent.send("bye")
    process.join(timeout=60)
    assert process.exitcode == 0, sys.stderr
    assert received.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(received[name], tensor.detach()), name
    assert len(received) == 8 and len(buffers_seen) <= 2
