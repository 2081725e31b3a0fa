"""Unit tests for hybrid_core.engines.weight_sync: bucketing by byte budget and dtype, and unflatten."""

import pytest
import torch
from torch import nn

from hybrid_core.engines.weight_sync import Bucket, BucketEntry, iter_buckets, unflatten


class Tiny(nn.Module):
    """Parameters in registration order (bytes): embed.weight 2×2 fp32 (16), proj.weight 3×2 fp32 (24),
    proj.bias 3 fp32 (12), norm.weight 5 bf16 (10), norm.bias 5 bf16 (10), head.weight 2×5 fp32 (40),
    final.weight 1×1 fp32 (4).
    """

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(2, 2)
        self.proj = nn.Linear(2, 3)
        self.norm = nn.LayerNorm(5).to(torch.bfloat16)
        with torch.no_grad():  # LayerNorm starts at ones/zeros: give it distinct values
            self.norm.weight.copy_(torch.randn(5))
            self.norm.bias.copy_(torch.randn(5))
        self.head = nn.Linear(5, 2, bias=False)
        self.final = nn.Linear(1, 1, bias=False)  # a submodule: a module's own parameters would be listed first


NAMES = ["embed.weight", "proj.weight", "proj.bias", "norm.weight", "norm.bias", "head.weight", "final.weight"]


def _names(buckets):
    return [[e.name for e in b.entries] for b in buckets]


def test_module_fixture_is_as_documented():
    module = Tiny()
    assert [(n, p.numel() * p.element_size(), p.dtype) for n, p in module.named_parameters()] == [
        ("embed.weight", 16, torch.float32), ("proj.weight", 24, torch.float32), ("proj.bias", 12, torch.float32),
        ("norm.weight", 10, torch.bfloat16), ("norm.bias", 10, torch.bfloat16), ("head.weight", 40, torch.float32),
        ("final.weight", 4, torch.float32)]


def test_budget_of_40_bytes():
    buckets = list(iter_buckets(Tiny(), 40))
    # 16 + 24 = 40 ≤ 40 fits; + 12 = 52 does not; bf16 starts a bucket (10 + 10 = 20); fp32 head (40) starts one;
    # + 4 = 44 > 40 → final alone
    assert _names(buckets) == [["embed.weight", "proj.weight"], ["proj.bias"], ["norm.weight", "norm.bias"],
                               ["head.weight"], ["final.weight"]]
    assert [b.num_bytes for b in buckets] == [40, 12, 20, 40, 4]
    assert [b.flat.dtype for b in buckets] == [torch.float32, torch.float32, torch.bfloat16, torch.float32,
                                               torch.float32]
    assert buckets[0].entries == (BucketEntry("embed.weight", (2, 2), 0), BucketEntry("proj.weight", (3, 2), 4))
    assert buckets[2].entries == (BucketEntry("norm.weight", (5,), 0), BucketEntry("norm.bias", (5,), 5))


def test_a_tensor_over_the_budget_gets_its_own_bucket():
    buckets = list(iter_buckets(Tiny(), 16))
    # 16 fits alone; 24 and 12 each exceed what is left; bf16 10 + 10 = 20 > 16 → split; head (40) over budget alone
    assert _names(buckets) == [[n] for n in NAMES]
    for b in buckets:
        assert len(b.entries) == 1 or b.num_bytes <= 16
    assert [b.num_bytes for b in buckets] == [16, 24, 12, 10, 10, 40, 4]


def test_a_big_budget_still_splits_by_dtype():
    buckets = list(iter_buckets(Tiny(), 1 << 20))
    assert _names(buckets) == [NAMES[:3], NAMES[3:5], NAMES[5:]]
    assert [b.flat.dtype for b in buckets] == [torch.float32, torch.bfloat16, torch.float32]
    assert [b.flat.dim() for b in buckets] == [1, 1, 1]
    assert [b.num_bytes for b in buckets] == [52, 20, 44]  # 16 + 24 + 12, 10 + 10, 40 + 4


@pytest.mark.parametrize("budget", [16, 40, 1 << 20])
def test_unflatten_restores_every_tensor_exactly_in_order(budget):
    module = Tiny()
    restored = [pair for b in iter_buckets(module, budget) for pair in unflatten(b)]
    params = list(module.named_parameters())
    assert [n for n, _ in restored] == [n for n, _ in params] == NAMES
    for (_, got), (_, want) in zip(restored, params):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want.detach())


def test_buckets_are_copies_and_unflatten_gives_views():
    module = Tiny()
    bucket = next(iter_buckets(module, 40))
    before = bucket.flat.clone()
    with torch.no_grad():
        module.embed.weight.add_(1.0)  # a later optimizer step must not change a bucket already sent
    assert torch.equal(bucket.flat, before)
    name, view = unflatten(bucket)[1]
    assert name == "proj.weight" and view.data_ptr() == bucket.flat[4:].data_ptr()


def test_unflatten_of_a_hand_made_bucket():
    bucket = Bucket((BucketEntry("a", (2, 2), 0), BucketEntry("b", (), 4), BucketEntry("c", (1,), 5)),
                    torch.arange(6, dtype=torch.float32))
    out = unflatten(bucket)
    assert [n for n, _ in out] == ["a", "b", "c"]
    assert out[0][1].tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert out[1][1].shape == () and out[1][1].item() == 4.0  # a 0-d tensor takes one element
    assert out[2][1].tolist() == [5.0]


@pytest.mark.parametrize("budget", [0, -1])
def test_invalid_budget_raises(budget):
    with pytest.raises(ValueError, match=rf"vllm\.sync_bucket_mb must be positive: got {budget} bytes"):
        list(iter_buckets(Tiny(), budget))


def test_an_engines_handles_are_its_ranks_one_per_gpu():
    from hybrid_core.engines.weight_sync import merge_handles

    # four actor ranks on GPUs a-d, two engines of TP 2: engine 1's workers on c and d get ranks 2 and 3's copies
    parts = [{"gpu-a": ("h", 0)}, {"gpu-b": ("h", 1)}, {"gpu-c": ("h", 2)}, {"gpu-d": ("h", 3)}]
    assert merge_handles(parts, range(2, 4)) == {"gpu-c": ("h", 2), "gpu-d": ("h", 3)}
    assert merge_handles(parts, range(0, 2)) == {"gpu-a": ("h", 0), "gpu-b": ("h", 1)}
    with pytest.raises(RuntimeError, match=r"actor ranks 0-1 hold copies on 1 GPUs \(\['gpu-a'\]\): each TP worker "
                                           r"of their engine needs the actor rank on its own GPU"):
        merge_handles([{"gpu-a": ("h", 0)}, {"gpu-a": ("h", 1)}], range(0, 2))
