"""memory_plan: where DeepSpeed's deferred sleep leaves the actor's optimizer states outside the train phase (the
sleep copy beside the rollout, the early wake beside the forwards) and the sync beside a copying sleep."""
import pytest

from hybrid_core.plan.memory import estimate_memory
from tests.unit.plan_fixtures import H200_GIB, HEAD_GRADIENT_SUM, config, terms
from tests.unit.plan_fixtures import liger, logprob_kernels  # noqa: F401 — autouse: the kernels the figures assume


def small_reservation_plan(share: float):
    return estimate_memory(config(vllm={"num_engines": 1, "enable_sleep": True, "gpu_memory_utilization": share},
                                  ds={"enable_sleep": True}, train={"colocate_all": True, "micro_batch_size": 8},
                                  actor={"gradient_checkpointing_enable": True}), H200_GIB)


def test_a_small_reservation_leaves_the_optimizer_states_on_the_gpu_outside_the_train_phase():
    plan = small_reservation_plan(0.2)
    # 1.72e9 parameters · 12 bytes; the logits are one 4,096-token chunk's (6.38 GiB), not 8 · 2048 tokens'
    states = 19.2289237976
    assert terms(plan.phases[2])["actor optimizer states"] == pytest.approx(states, rel=0, abs=1e-9)
    # at the sync's end the GPU holds the actor's weights 3.2048 and states, contexts 1.5, DeepSpeed buffers 0.8,
    # sync buffers 1.1592 and vLLM's woken weights 3.2048: 29.10 GiB, so 79% of it is free, more than the 20% the
    # engine maps when it wakes; the sleep copy runs on and the states stay through the rollout
    assert terms(plan.phases[0]) == pytest.approx({
        "vLLM reservation": 27.96, "actor weights": 3.2048206329,
        "actor optimizer states (their sleep copy left running)": states, "CUDA contexts": 1.5,
        "DeepSpeed NCCL/cuBLAS buffers": 0.8, "actor weight-sync buffers": 1.1591796875}, rel=0, abs=1e-9)
    # the advantage stage starts their wake (beside the reference's forward): back in the experience phase
    assert terms(plan.phases[1])["actor optimizer states (woken early, beside the forwards)"] == pytest.approx(
        states, rel=0, abs=1e-9)
    assert plan.peak_phase.name == "rollout"
    assert plan.peak_gib == pytest.approx(27.96 + 3.2048206329 + states + 1.5 + 0.8 + 1.1591796875, rel=0, abs=1e-9)


def test_the_sleep_copy_runs_on_beside_the_rollout_only_where_the_waking_engine_finds_its_share_free():
    # free at the sync's end: (139.8 − 29.0977) / 139.8 = 0.79188 of the GPU
    outlasting = {share: any(name.startswith("actor optimizer states") for name in terms(small_reservation_plan(share)
                                                                                         .phases[0]))
                  for share in (0.79, 0.792, 0.8)}
    assert outlasting == {0.79: True, 0.792: False, 0.8: False}


@pytest.mark.parametrize("ds", [{"zero_stage": 3}, {"adam_offload": True}, {"enable_sleep": False}])
def test_states_leave_the_gpu_outside_training_where_deepspeed_sleeps_at_once(ds):
    # ZeRO-3 and DeepSpeed's own offload sleep at once and wake in the train stage; without sleep nothing moves
    # (the states then count in every phase as the last train step's cached blocks)
    plan = estimate_memory(config(vllm={"num_engines": 1, "enable_sleep": True, "gpu_memory_utilization": 0.2},
                                  ds={"enable_sleep": True} | ds), H200_GIB)
    for phase in plan.phases:
        assert not any("sleep copy left running" in name or "woken early" in name for name in terms(phase))


def sync_beside_sleep_config(**ds):
    """8 GPUs, ZeRO-2, a 2,048-token micro-batch and 1,536-token head chunks: the train step's freed blocks are
    smaller than the vLLM weights that wake for the sync."""
    return config(world=8, train={"micro_batch_size": 1, "colocate_all": True},
                  actor={"gradient_checkpointing_enable": True},
                  ds={"enable_sleep": True, "logit_chunk_tokens": 1536} | ds,
                  vllm={"num_engines": 8, "sync_bucket_mb": 256, "enable_sleep": True})


def test_the_sync_beside_a_copying_sleep_counts_in_the_train_phase():
    # the sync runs while DeepSpeed's sleep still copies: weights, gradients and optimizer states stay beside the
    # vLLM weights (1,720,574,976 · 2 bytes = 3.2048206329 GiB) instead of the step's activations (2,048 tokens ·
    # (28 layers · 2048 · 2 bytes checkpointed + one recomputed layer of the same) = 0.4375 GiB), logits
    # (1,536 · 151,936 · 10 bytes + the head's gradient sum = 2.7530517578 GiB) and step temporaries (none: the
    # 215M-parameter partition's step reuses the logits' cached blocks)
    train = terms(estimate_memory(sync_beside_sleep_config(), H200_GIB).phases[2])
    excess = 3.2048206329 - 0.4375 - (2.17346191406 + HEAD_GRADIENT_SUM)
    assert train["vLLM weights in the sync, beside DeepSpeed's sleep copy"] == pytest.approx(excess, rel=0, abs=1e-9)


@pytest.mark.parametrize("ds", [{"zero_stage": 3}, {"adam_offload": True}, {"enable_sleep": False},
                                {"logit_chunk_tokens": 4096}])
def test_no_sync_term_where_the_sleep_is_not_deferred_or_the_step_frees_more(ds):
    # ZeRO-3 and adam_offload sleep at once (nothing copies during the sync); without sleep the states stay anyway;
    # with 4,096-token chunks the freed logits alone (3.48 GiB) exceed the vLLM weights
    train = terms(estimate_memory(sync_beside_sleep_config(**ds), H200_GIB).phases[2])
    assert not any(name.startswith("vLLM weights in the sync") for name in train)
