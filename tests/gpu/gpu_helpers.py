"""Small helpers shared by the GPU tests (kept out of conftest so they can be imported by name)."""
from __future__ import annotations


def fixed_sequence(length: int, seed: int, vocab: int = 100) -> list[int]:
    """Token ids from the stand-in tokenizer's character range (ids 3..vocab-1), reproducible."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=generator).tolist()


def mean_abs_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def qwen3_own_kernels() -> dict:
    """The Qwen3 module's own rotary function and classes as first read (at collection, before any test loads a
    model): Liger, the default on CUDA, patches them process-wide; a test comparing with them puts these back."""
    return dict(_QWEN3_OWN_KERNELS)


def _read_qwen3_kernels() -> dict:
    from transformers.models.qwen3 import modeling_qwen3

    return {name: getattr(modeling_qwen3, name) for name in ("apply_rotary_pos_emb", "Qwen3RMSNorm", "Qwen3MLP")}


_QWEN3_OWN_KERNELS = _read_qwen3_kernels()


def send_buckets(conn, module, bucket_bytes: int) -> None:
    """The actor's side of a CUDA IPC sync over a pipe: `module`'s parameters packed into two reused buffers, each
    bucket sent as a shared handle; a buffer comes round again only after the receiver answered "loaded". Ends with
    None."""
    import torch

    from hybrid_core.engines.weight_sync import BucketBuffers, iter_buckets, largest_bucket_bytes, share_bucket

    buffers = BucketBuffers(largest_bucket_bytes(module, bucket_bytes), torch.device("cuda"))
    for bucket in iter_buckets(module, bucket_bytes, buffers=buffers):
        torch.cuda.synchronize()
        conn.send(share_bucket(bucket))
        assert conn.recv() == "loaded"
    conn.send(None)
