"""memory_plan: the vocabulary head's logit blocks: bytes per logit with PyTorch's ops or the fused Triton kernels, and
when the optimizer step's temporaries come out of the blocks the backward freed."""
import pytest

from hybrid_core.plan.memory import GIB, model_shape, trainer_bytes
from tests.unit.plan_fixtures import HEAD_GRADIENT_SUM, QWEN3_1_7B_PARAMS, config
from tests.unit.plan_fixtures import logprob_kernels  # noqa: F401 — autouse: the PyTorch head's bytes


def test_the_fused_head_kernels_keep_the_logits_and_their_gradient_only(logprob_kernels, monkeypatch):
    # one chunk of min(2048, 4096) tokens: 2048 · 151936 · (2 + 2) bytes = 1.1591796875 GiB, and the head's gradient
    # sum; the same chunk in the no-grad forward
    logprob_kernels(True)
    b = trainer_bytes(config(), model_shape("Qwen/Qwen3-1.7B"), has_logits=True)
    assert (b.logits, b.forward) == pytest.approx((1.1591796875 + HEAD_GRADIENT_SUM, 1.1591796875), rel=0, abs=1e-9)
    fp32 = trainer_bytes(config(ds={"param_dtype": "fp32"}), model_shape("Qwen/Qwen3-1.7B"), has_logits=True)
    assert fp32.forward == pytest.approx(2048 * 151936 * 8 / GIB, rel=0, abs=1e-9)  # fp32 logits and gradient
    cpu = trainer_bytes(config(train={"device": "cpu"}), model_shape("Qwen/Qwen3-1.7B"), has_logits=True)
    assert cpu.forward == pytest.approx(2048 * 151936 * 10 / GIB, rel=0, abs=1e-9)  # PyTorch's ops on CPU
    monkeypatch.setenv("HYBRID_LOGPROB_KERNEL", "torch")
    assert trainer_bytes(config(), model_shape("Qwen/Qwen3-1.7B"), has_logits=True).forward == cpu.forward


def test_with_the_fused_kernels_the_step_fits_in_a_freed_bf16_block_only_when_it_is_twice_as_large(
        logprob_kernels):
    # the backward frees 16-bit blocks of chunk × vocab: each fp32 temporary (4 × 1.72e9 bytes) needs 3.44e9 logits
    logprob_kernels(True)
    shape = model_shape("Qwen/Qwen3-1.7B")

    def step_of(chunk: int) -> float:
        cfg = config(train={"colocate_all": True, "micro_batch_size": 16}, ds={"logit_chunk_tokens": chunk})
        return trainer_bytes(cfg, shape, has_logits=True).step
    assert step_of(16384) == pytest.approx(QWEN3_1_7B_PARAMS * 8 / GIB, rel=0, abs=1e-9)  # 2.49e9 logits: too few
    assert step_of(32768) == 0.0  # 32,768 · 151,936 = 4.98e9 logits


def test_optimizer_step_reuses_freed_logit_blocks_when_they_are_as_large():
    shape = model_shape("Qwen/Qwen3-1.7B")
    one_gpu_step = QWEN3_1_7B_PARAMS * 8 / GIB  # the fp32 gradient copy and Adam's temporary: 2 × 4 bytes/param

    def step_of(micro_batch_size: int, stage: int = 2, has_logits: bool = True, chunk: int = 16384) -> float:
        cfg = config(train={"colocate_all": True, "micro_batch_size": micro_batch_size},
                     ds={"zero_stage": stage, "logit_chunk_tokens": chunk})
        return trainer_bytes(cfg, shape, has_logits=has_logits).step

    # a chunk of 8 × 2048 = 16,384 tokens × 151,936 = 2.49e9 logits ≥ 1.72e9 parameters: an fp32 logit block holds
    # each temporary
    assert step_of(8) == 0.0
    # 4 × 2048 = 8,192 tokens × 151,936 = 1.24e9 < 1.72e9: the temporaries need memory of their own
    assert step_of(4) == pytest.approx(one_gpu_step, rel=0, abs=1e-9)
    # 16,384 tokens in the default chunks of 4,096: 0.62e9 logits a block, too small
    assert step_of(8, chunk=4096) == pytest.approx(one_gpu_step, rel=0, abs=1e-9)
    assert step_of(8, stage=3) == pytest.approx(8e9 / GIB, rel=0, abs=1e-9)  # ZeRO-3: not seen to reuse; counted
    assert step_of(8, has_logits=False) == pytest.approx(one_gpu_step, rel=0, abs=1e-9)  # a value head frees little
