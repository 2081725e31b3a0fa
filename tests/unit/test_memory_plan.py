"""memory_plan: model shapes (table and config.json), per-role bytes by ZeRO stage, phases with and without sleep."""
import json

import pytest

from hybrid_core.config import RunConfig
from hybrid_core.plan.memory import (GIB, ModelShape, estimate_memory, fit_summary, model_shape,
                                     optimizer_bytes_per_param, render_memory, trainer_bytes)
from tests.unit.plan_fixtures import H200_GIB, HEAD_GRADIENT_SUM, QWEN3_1_7B_PARAMS, config, terms
from tests.unit.plan_fixtures import liger, logprob_kernels  # noqa: F401 — autouse: the kernels the figures assume

QWEN3_1_7B_UNTIED = QWEN3_1_7B_PARAMS + 311_164_928


def test_qwen3_1_7b_parameters_by_hand():
    shape = model_shape("Qwen/Qwen3-1.7B")
    assert shape.tie_word_embeddings
    assert shape.num_params == QWEN3_1_7B_PARAMS
    assert shape.num_params == pytest.approx(1.72e9, rel=2e-3)  # the public figure, tied
    untied = ModelShape(**{**shape.__dict__, "tie_word_embeddings": False})
    assert untied.num_params == QWEN3_1_7B_UNTIED
    assert untied.num_params == pytest.approx(2.03e9, rel=2e-3)  # the public figure counted untied
    assert shape.non_embedding_params == 1_409_408_000 + 2_048  # "1.4B non-embedding" on the model card


def test_qwen3_8b_is_untied():
    # embedding 151936·4096 = 622,329,856, twice (lm_head untied); per layer 2·4096² + 2·4096·1024 + 3·4096·12288
    # + 2·4096 + 2·128 = 192,946,432, × 36 = 6,946,071,552; final norm 4,096 → 8,190,735,360 ("8.2B", 6.95B non-emb.)
    shape = model_shape("Qwen/Qwen3-8B")
    assert shape.num_params == 8_190_735_360
    assert shape.non_embedding_params == 6_946_071_552 + 4_096


@pytest.mark.parametrize(("stage", "weights", "grads", "optimizer", "step"), [
    # bytes per parameter over 2^30, world 4: bf16 weights 2, grads 2, fp32 master + Adam moments 12, step 8
    (0, 3.2048206329, 3.2048206329, 19.2289237976, 12.8192825317),  # nothing partitioned
    (1, 3.2048206329, 3.2048206329, 4.8072309494, 3.2048206329),    # optimizer states and the step ÷ 4
    (2, 3.2048206329, 0.8012051582, 4.8072309494, 3.2048206329),    # and gradients ÷ 4
    (3, 0.8012051582, 0.8012051582, 4.8072309494, 3.2048206329),    # and weights ÷ 4 (430M < one sub-group)
])
def test_zero_stage_divides_by_world_size(stage, weights, grads, optimizer, step):
    b = trainer_bytes(config(world=4, ds={"zero_stage": stage}), model_shape("Qwen/Qwen3-1.7B"), has_logits=True)
    got = (b.weights, b.gradients, b.optimizer, b.step)
    assert got == pytest.approx((weights, grads, optimizer, step), rel=0, abs=1e-9)


def test_zero3_steps_one_sub_group_at_a_time():
    # one GPU: the partition is all 1.72e9 parameters, but the optimizer steps groups of 1e9: 8e9 bytes at once
    b = trainer_bytes(config(ds={"zero_stage": 3}), model_shape("Qwen/Qwen3-1.7B"), has_logits=True)
    assert b.step == pytest.approx(8e9 / GIB, rel=0, abs=1e-9)


def test_adam_offload_keeps_the_optimizer_off_the_gpu():
    plan = estimate_memory(config(ds={"adam_offload": True}), H200_GIB)
    train = terms(plan.phases[2])
    assert "actor optimizer states" not in train and "actor optimizer step" not in train
    assert train["actor gradients"] == pytest.approx(3.2048206329, rel=0, abs=1e-9)


def test_adam_offload_says_where_the_states_live():
    plan = estimate_memory(config(world=4, ds={"adam_offload": True, "enable_sleep": True}), H200_GIB)
    # 1,720,574,976 parameters / 4 ranks · 12 bytes (fp32 master + two moments) = 4.8072 GiB of host memory per GPU
    assert ("ds.adam_offload: the actor's fp32 master weights and Adam moments live and step in host memory "
            "(4.81 GiB of RAM per GPU); DeepSpeed's sleep moves none of them") in plan.notes
    assert not any(note.startswith("DeepSpeed sleeps") for note in plan.notes)


def test_muon_keeps_one_momentum_buffer_for_each_hidden_matrix():
    # Qwen3-1.7B's hidden matrices: per layer q, k, v, o 12,582,912 and the MLP 37,748,736 = 50,331,648 (the layer's
    # 50,336,000 less its four norms), × 28 = 1,409,286,144. Adam keeps two fp32 moments, Muon one: 4 bytes fewer
    # per matrix parameter. World 4: (12 · 1,720,574,976 − 4 · 1,409,286,144) / 4 bytes = 3.4947 GiB
    shape = model_shape("Qwen/Qwen3-1.7B")
    assert shape.matrix_params == 1_409_286_144
    muon = trainer_bytes(config(world=4, actor={"model_name_or_path": "Qwen/Qwen3-1.7B", "optim": "muon",
                                                "num_gpus_per_node": 4}), shape, has_logits=True)
    assert muon.optimizer == pytest.approx(3.4947309494, rel=0, abs=1e-9)
    assert optimizer_bytes_per_param(RunConfig().actor, shape, "fp32") == 8  # no master copy in fp32
    critic = config(world=4, critic={"optim": "muon"})
    assert trainer_bytes(critic, shape, has_logits=False).optimizer == pytest.approx(3.4947309494, rel=0, abs=1e-9)
    assert trainer_bytes(critic, shape, has_logits=True).optimizer == pytest.approx(4.8072309494, rel=0, abs=1e-9)


def test_activations_and_logits_by_hand():
    # 2048 tokens, bf16, no checkpointing: per layer 12·2048 + 14·2048 + 12·1024 + 8·6144 = 114,688 bytes/token,
    # × 28 layers × 2048 tokens = 6.125 GiB; logits: one chunk of min(2048, 4096) tokens, 2048 · 151936 · 10 bytes
    # = 2.8979 GiB, and the head's gradient sum
    b = trainer_bytes(config(), model_shape("Qwen/Qwen3-1.7B"), has_logits=True)
    assert (b.activations, b.logits) == pytest.approx((6.125, 2.89794921875 + HEAD_GRADIENT_SUM), rel=0, abs=1e-9)
    # checkpointed: the 28 layer inputs (2048 · 2 bytes each) + one recomputed layer (114,688 bytes) per token
    cp = trainer_bytes(config(actor={"model_name_or_path": "Qwen/Qwen3-1.7B", "gradient_checkpointing_enable": True}),
                       model_shape("Qwen/Qwen3-1.7B"), has_logits=True)
    assert cp.activations == pytest.approx(2048 * (28 * 4096 + 114_688) / GIB, rel=0, abs=1e-9)
    # an entropy bonus in the loss uses the same two fp32 blocks of the chunk (log p and p)
    ent = trainer_bytes(config(actor={"model_name_or_path": "Qwen/Qwen3-1.7B", "entropy_coef": 0.01}),
                        model_shape("Qwen/Qwen3-1.7B"), has_logits=True)
    assert ent.logits == b.logits


def test_fused_kernels_keep_fewer_activations_by_hand(liger):
    # Liger per layer: 8·2048 + 8·2048 + 6·1024 + 6·6144 = 75,776 bytes/token (114,688 unfused), × 28 × 2048 tokens
    shape = model_shape("Qwen/Qwen3-1.7B")
    liger(True)
    fused = trainer_bytes(config(), shape, has_logits=True)
    assert fused.activations == pytest.approx(2048 * 28 * 75_776 / GIB, rel=0, abs=1e-9)
    cp = trainer_bytes(config(actor={"model_name_or_path": "Qwen/Qwen3-1.7B", "gradient_checkpointing_enable": True}),
                       shape, has_logits=True)
    assert cp.activations == pytest.approx(2048 * (28 * 4096 + 75_776) / GIB, rel=0, abs=1e-9)  # inputs unchanged
    assert fused.logits == trainer_bytes(config(train={"device": "cpu"}), shape, has_logits=True).logits
    # Liger's kernels run on CUDA only, by default where the package is installed, always with the flag
    assert trainer_bytes(config(train={"device": "cpu"}), shape, has_logits=True).activations == 6.125
    liger(False)
    assert trainer_bytes(config(), shape, has_logits=True).activations == 6.125
    flagged = trainer_bytes(config(ds={"use_liger_kernel": True}), shape, has_logits=True)
    assert flagged.activations == fused.activations
    liger(True)  # installed, but turned off
    assert trainer_bytes(config(ds={"use_liger_kernel": False}), shape, has_logits=True).activations == 6.125


def test_partial_checkpointing_keeps_the_later_layers_by_hand(liger):
    # the first 20 of 28 layers checkpointed: their inputs (2048 · 2 bytes per token each), the other 8 layers' full
    # activations (Liger: 75,776 bytes per token each) and one recomputed layer; 2,048 tokens
    shape = model_shape("Qwen/Qwen3-1.7B")
    liger(True)
    actor = {"model_name_or_path": "Qwen/Qwen3-1.7B", "gradient_checkpointing_enable": True}
    partial = trainer_bytes(config(actor=actor | {"gradient_checkpointing_layers": 20}), shape, has_logits=True)
    assert partial.activations == pytest.approx(2048 * (20 * 4096 + 8 * 75_776 + 75_776) / GIB, rel=0, abs=1e-9)
    every = trainer_bytes(config(actor=actor), shape, has_logits=True)
    assert trainer_bytes(config(actor=actor | {"gradient_checkpointing_layers": 28}), shape,
                         has_logits=True).activations == every.activations
    assert every.activations == pytest.approx(2048 * (28 * 4096 + 75_776) / GIB, rel=0, abs=1e-9)
    # the critic's trainer never checkpoints: the actor's flag leaves its activations whole
    critic = trainer_bytes(config(actor=actor), shape, has_logits=False)
    assert critic.activations == pytest.approx(2048 * 28 * 75_776 / GIB, rel=0, abs=1e-9)


def test_a_ring_keeps_the_gathered_kv_of_every_layer_it_does_not_checkpoint():
    # 2 ranks, 2,048 tokens a micro-batch → 1,024 a rank; a layer's gathered K and V: 2 · 1,024 · 2 · 1,024 · 2 bytes
    # = 8 MiB. None checkpointed: 28 layers'; 20 of 28: the 8 kept layers' and the recomputed one's; all: one layer's
    shape = model_shape("Qwen/Qwen3-1.7B")
    checkpointing = {"gradient_checkpointing_enable": True}
    actors = {"none": {}, "partial": checkpointing | {"gradient_checkpointing_layers": 20}, "all": checkpointing}

    def activations(ring_attn_size: int, actor: dict) -> float:
        cfg = config(world=2, ds={"ring_attn_size": ring_attn_size, "packing_samples": True}, actor=actor)
        return trainer_bytes(cfg, shape, has_logits=True).activations

    # a rank of the ring holds half the micro-batch's tokens, so half the unringed activations, plus the K/V
    kv = {name: activations(2, actor) - activations(1, actor) / 2 for name, actor in actors.items()}
    layer_kv = 2 * 1024 * 2 * 1024 * 2 / GIB
    assert kv == pytest.approx({"none": 28 * layer_kv, "partial": 9 * layer_kv, "all": layer_kv}, rel=0, abs=1e-9)


def test_logits_grow_with_the_chunk_not_the_micro_batch():
    shape = model_shape("Qwen/Qwen3-1.7B")

    def logits_of(micro_batch_size: int, chunk_tokens: int) -> tuple[float, float]:
        cfg = config(train={"colocate_all": True, "micro_batch_size": micro_batch_size},
                     rollout={"micro_batch_size": micro_batch_size}, ds={"logit_chunk_tokens": chunk_tokens})
        b = trainer_bytes(cfg, shape, has_logits=True)
        return b.logits, b.forward

    # 8 × 2048 = 16,384 tokens in chunks of 4,096 (the default): 4096 · 151936 · 10 bytes = 5.7959 GiB, and the
    # no-grad forward the same without the gradient sum; 36 samples of 2,048 tokens (73,728) change nothing
    assert logits_of(8, 4096) == pytest.approx((5.7958984375 + HEAD_GRADIENT_SUM, 5.7958984375), rel=0, abs=1e-9)
    assert logits_of(36, 4096) == logits_of(8, 4096)
    # chunks of 1,024 tokens: a quarter; a chunk larger than the micro-batch: the micro-batch (2,048 tokens)
    assert logits_of(8, 1024)[1] == pytest.approx(5.7958984375 / 4, rel=0, abs=1e-9)
    assert logits_of(1, 65536)[1] == pytest.approx(2.89794921875, rel=0, abs=1e-9)


def test_dynamic_batch_counts_the_budget_or_one_longer_sample():
    shape = model_shape("Qwen/Qwen3-1.7B")
    budget = trainer_bytes(config(train={"colocate_all": True, "dynamic_batch_enable": True,
                                         "max_tokens_per_gpu": 8192}), shape, has_logits=True)
    assert budget.activations == pytest.approx(8192 * 28 * 114_688 / GIB, rel=0, abs=1e-9)
    long = trainer_bytes(config(train={"colocate_all": True, "dynamic_batch_enable": True,
                                       "max_tokens_per_gpu": 1024}), shape, has_logits=True)
    assert long.activations == pytest.approx(2048 * 28 * 114_688 / GIB, rel=0, abs=1e-9)  # a 2048-token sample
    assert long.logits == pytest.approx(2048 * 151936 * 10 / GIB + HEAD_GRADIENT_SUM, rel=0, abs=1e-9)


def test_sleep_leaves_vllm_setting_the_peak_in_the_rollout_phase():
    plan = estimate_memory(config(vllm={"num_engines": 1, "enable_sleep": True, "gpu_memory_utilization": 0.8},
                                  ds={"enable_sleep": True}), H200_GIB)
    assert [p.name for p in plan.phases] == ["rollout", "experience", "train"]
    assert plan.peak_phase.name == "rollout"
    # 0.8 · 139.8 = 111.84; bf16 weights 3.2048; contexts of the actor, the rollout worker and (colocated on GPUs, by
    # default) its engine's model runner in a child process 3 · 0.5; DeepSpeed buffers 0.8; two sync buffers of the
    # embedding 151936 · 2048 · 2 bytes = 2 · 0.5796 GiB
    assert terms(plan.phases[0]) == pytest.approx({
        "vLLM reservation": 111.84, "actor weights": 3.2048206329, "CUDA contexts": 1.5,
        "DeepSpeed NCCL/cuBLAS buffers": 0.8, "actor weight-sync buffers": 1.1591796875}, rel=0, abs=1e-9)
    assert plan.peak_gib == pytest.approx(111.84 + 3.2048206329 + 1.5 + 0.8 + 1.1591796875, rel=0, abs=1e-9)
    assert "vLLM reservation" not in terms(plan.phases[2])  # asleep while DeepSpeed trains
    assert plan.fits and plan.largest_term.name == "vLLM reservation"
    # the model runner in the rollout worker's own process: one context fewer
    inside = estimate_memory(config(vllm={"num_engines": 1, "enable_sleep": True, "gpu_memory_utilization": 0.8,
                                          "executor_backend": "uni"}, ds={"enable_sleep": True}), H200_GIB)
    assert terms(inside.phases[0])["CUDA contexts"] == 1.0


def test_without_sleep_every_term_adds_up():
    plan = estimate_memory(config(vllm={"num_engines": 1, "gpu_memory_utilization": 0.5}), H200_GIB)
    rollout, _, train = plan.phases
    assert rollout.total_gib == pytest.approx(train.total_gib, rel=0, abs=1e-9)  # nothing leaves the GPU
    assert plan.peak_phase.name == "train"
    # 69.9 vLLM + 3.2048 weights + 3.2048 grads + 19.2289 optimizer + 6.125 activations + 2.8979 logits + 0.5796
    # head gradient sum + 12.8193 step + 1.5 contexts + 0.8 DeepSpeed buffers + 1.1592 sync buffers
    expected = 69.9 + 3.2048206329 * 2 + 19.2289237976 + 6.125 + 2.89794921875 + HEAD_GRADIENT_SUM \
        + 12.8192825317 + 1.5 + 0.8 + 1.1591796875
    assert plan.peak_gib == pytest.approx(expected, rel=0, abs=1e-8)


def test_the_cached_experience_forward_adds_only_what_the_train_phase_does_not_reallocate():
    def forward_term(sleeps: bool) -> float:
        cfg = config(vllm={"num_engines": 1, "enable_sleep": sleeps}, ds={"enable_sleep": sleeps,
                                                                          "logit_chunk_tokens": 32768},
                     rollout={"micro_batch_size": 16}, train={"colocate_all": True, "micro_batch_size": 1})
        return terms(estimate_memory(cfg, H200_GIB).phases[2]).get("actor logprob forward", 0.0)

    # chunks of 32,768 tokens: forward 16 · 2048 · 151,936 · 10 bytes = 46.3672 GiB; the train step reallocates
    # activations 6.125, logits 2.8979 + 0.5796 and the step's temporaries 12.8193 (2,048 · 151,936 < 1.72e9)
    awake_beyond = 46.3671875 - 6.125 - 2.89794921875 - HEAD_GRADIENT_SUM - 12.8192825317
    assert forward_term(False) == pytest.approx(awake_beyond, rel=0, abs=1e-8)
    # asleep, the woken gradients (3.2048) and optimizer states (19.2289) come out of the same cache
    assert forward_term(True) == pytest.approx(awake_beyond - 3.2048206329 - 19.2289237976, rel=0, abs=1e-8)


def test_reference_and_critic_are_counted_where_they_live():
    plan = estimate_memory(config(algo={"advantage": {"estimator": "gae"}, "kl": {"init_coef": 0.01}},
                                  ds={"enable_sleep": True}, vllm={"num_engines": 1, "enable_sleep": True}), H200_GIB)
    assert [p.name for p in plan.phases] == ["rollout", "experience", "train", "critic train"]
    rollout = terms(plan.phases[0])
    assert rollout["ref weights"] == pytest.approx(3.2048206329, rel=0, abs=1e-9)
    # no-grad forward of 2048 tokens (one chunk): 2048 · 151936 · 10 bytes = 2.8979 GiB, only where it runs (the
    # ref worker empties PyTorch's cache afterwards)
    assert "ref logprob forward" not in rollout
    experience = terms(plan.phases[1])
    assert experience["ref logprob forward"] == pytest.approx(2048 * 151936 * 10 / GIB, rel=0, abs=1e-9)
    assert rollout["CUDA contexts"] == 2.5  # actor, rollout worker, its model runner, ref and critic processes
    assert rollout["DeepSpeed NCCL/cuBLAS buffers"] == pytest.approx(1.6)
    critic_train = terms(plan.phases[3])
    assert critic_train["critic optimizer states"] == pytest.approx(19.2289237976, rel=0, abs=1e-9)
    assert "critic logits" not in critic_train and "actor optimizer states" not in critic_train


def test_the_reference_is_whole_on_every_rank_and_offloaded_outside_its_forwards():
    """The reference is a plain PyTorch replica per GPU: ZeRO-3 does not divide it. With ref.offload its weights
    are on the GPU in the experience phase only."""
    blocks = dict(algo={"advantage": {"estimator": "reinforce"}, "kl": {"init_coef": 0.01}}, ds={"zero_stage": 3},
                  vllm={"num_engines": 4, "enable_sleep": True})
    plan = estimate_memory(config(world=4, **blocks), H200_GIB)
    assert terms(plan.phases[0])["ref weights"] == pytest.approx(3.2048206329, rel=0, abs=1e-9)
    assert terms(plan.phases[0])["actor weights"] == pytest.approx(3.2048206329 / 4, rel=0, abs=1e-9)
    offloaded = estimate_memory(config(world=4, ref={"num_gpus_per_node": 4, "offload": True}, **blocks), H200_GIB)
    held = {phase.name: terms(phase).get("ref weights") for phase in offloaded.phases}
    assert held == {"rollout": None, "experience": pytest.approx(3.2048206329, rel=0, abs=1e-9), "train": None}
    assert plan.phases[2].total_gib - offloaded.phases[2].total_gib == pytest.approx(3.2048206329, rel=0, abs=1e-9)
    assert ("ref.offload: the reference's weights wait in pinned host memory outside the experience phase "
            "(3.20 GiB of RAM per GPU)") in offloaded.notes


def test_does_not_fit_names_the_largest_term():
    plan = estimate_memory(config(actor={"model_name_or_path": "Qwen/Qwen3-8B"}, ds={"zero_stage": 0},
                                  vllm={"num_engines": 1, "gpu_memory_utilization": 0.5}), H200_GIB)
    assert not plan.fits
    # 8,190,735,360 parameters · 12 bytes = 91.54 GiB of fp32 master weights and Adam moments, more than vLLM's 69.9
    assert plan.largest_term.name == "actor optimizer states"
    assert plan.largest_term.gib == pytest.approx(91.53860092163086, rel=0, abs=1e-9)
    assert fit_summary(plan) == (f"does not fit: needs {plan.peak_gib:.2f} GiB of 139.80 GiB; "
                                 "largest term: actor optimizer states (91.54 GiB)")
    lines = render_memory(plan)
    assert f"peak: {plan.peak_gib:.2f} GiB in phase train" in lines
    assert "  actor optimizer states: 91.54 GiB" in lines


def test_render_lists_every_term_of_every_phase():
    plan = estimate_memory(config(vllm={"num_engines": 1, "enable_sleep": True}, ds={"enable_sleep": True}), H200_GIB)
    lines = render_memory(plan)
    assert lines[0] == f"phase rollout: {plan.phases[0].total_gib:.2f} GiB"
    assert lines[1] == "  vLLM reservation: 132.81 GiB"  # 0.95 · 139.8
    assert sum(line.startswith("  ") for line in lines) == sum(len(p.terms) for p in plan.phases)
    assert f"fits on a 139.80 GiB GPU ({139.8 - plan.peak_gib:.2f} GiB to spare)" in lines
    assert any(line.startswith("note: vLLM sleeps outside the rollout phase (level 1") for line in lines)


def test_unknown_model_names_the_field_and_the_fix():
    with pytest.raises(ValueError) as err:
        model_shape("acme/llm-7b")
    message = str(err.value)
    assert message.startswith("actor.model_name_or_path has no known model shape for the memory plan: "
                              "got 'acme/llm-7b'")
    assert "local HF model directory with a config.json" in message
    assert "Qwen/Qwen3-0.6B, Qwen/Qwen3-1.7B, Qwen/Qwen3-4B" in message
    with pytest.raises(ValueError, match=r"^critic.model_name_or_path .*got None"):
        model_shape(None, "critic.model_name_or_path")


def test_local_config_json_is_read(tmp_path):
    fields = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "vocab_size": 1000, "tie_word_embeddings": False, "model_type": "qwen3"}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    shape = model_shape(str(tmp_path))
    # no num_key_value_heads: as many as the heads; no head_dim: 64 / 4 = 16
    assert shape == ModelShape(64, 128, 2, 4, 4, 16, 1000, False)
    # 2 · 1000·64 + 2 · (4 · 64·64 + 3 · 64·128 + 2·64 + 2·16) + 64 = 128,000 + 2 · 41,120 + 64 = 210,304
    assert shape.num_params == 210_304


def test_config_json_without_decoder_fields_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match="lacks intermediate_size, num_hidden_layers, num_attention_heads"):
        model_shape(str(tmp_path))


def test_the_deepspeed_peak_benchmark_configuration_by_hand():
    from hybrid_core.flags import parse_cli
    from tests.conftest import REPO_ROOT

    cfg = parse_cli(["--config", str(REPO_ROOT / "benchmarks" / "configs" / "h200-memory-ds-peak.yaml"),
                     "--actor.model_name_or_path", "Qwen/Qwen3-1.7B"])
    plan = estimate_memory(cfg, H200_GIB)
    # train phase, 4 × 4096 = 16,384 padded tokens, checkpointed: weights and gradients 3.2048 each, optimizer
    # 19.2289, activations 16,384 · (28 · 4096 + 114,688) bytes = 3.5 GiB, logits of a 4,096-token chunk
    # 4,096 · 151,936 · 10 bytes = 5.7959 GiB and the head's gradient sum 0.5796, the step 12.8193 (a chunk's
    # 0.62e9 logits < 1.72e9 parameters), contexts 3 · 0.5, DeepSpeed buffers 0.8, two 1 GiB sync buffers. The
    # actor's experience forward (a 4,096-token chunk: 5.7959 GiB) left its blocks in the cache, and the train phase
    # reallocates more than that from it, so it adds nothing.
    expected = 3.2048206329 * 2 + 19.2289237976 + 3.5 + 5.7958984375 + HEAD_GRADIENT_SUM + 12.8192825317 + 1.5 \
        + 0.8 + 2.0
    assert plan.phases[2].name == "train"
    assert plan.phases[2].total_gib == pytest.approx(expected, rel=0, abs=1e-8)
    # the rollout phase: vLLM's 0.3 · 139.8 = 41.94 GiB beside the actor's weights and, since 78% of the GPU is free
    # when the sync ends (more than vLLM's 30%), its optimizer states, whose sleep copy runs on: 68.67 GiB, the peak
    rollout = 41.94 + 3.2048206329 + 19.2289237976 + 1.5 + 0.8 + 2.0
    assert plan.peak_phase.name == "rollout"
    assert plan.peak_gib == pytest.approx(rollout, rel=0, abs=1e-8)
