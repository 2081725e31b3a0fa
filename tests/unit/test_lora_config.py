"""LoRA and EMA in the configuration: the refusals (each naming the flag, the value and the fix), the roles a LoRA
run starts, the engine executor it needs, the memory plan's adapter-only trained state, and the preflight's check of
target_modules against the model."""
from __future__ import annotations

import pytest

from hybrid_core.config import RunConfig
from tests.conftest import REPO_ROOT

LORA = {"lora": {"rank": 8}}
CRITIC_FREE = {"advantage": {"estimator": "reinforce"}}


def problems(**blocks) -> str:
    with pytest.raises(ValueError) as err:
        RunConfig(**blocks)
    return str(err.value)


def test_what_a_lora_policy_does_not_support_is_refused_with_the_reason():
    assert "ds.zero_stage 3 with ds.lora.rank 8" in problems(ds={**LORA, "zero_stage": 3}, algo=CRITIC_FREE)
    assert "ds.ring_attn_size 2 with ds.lora.rank 8" in problems(ds={**LORA, "ring_attn_size": 2}, algo=CRITIC_FREE)
    assert "algo.advantage.estimator 'gae' with ds.lora.rank 8" in problems(ds=LORA)
    assert "vllm.sleep_level 2 with ds.lora.rank 8: level 2 drops the base weights" in problems(
        ds=LORA, algo=CRITIC_FREE, vllm={"sleep_level": 2})
    assert "vllm.tensor_parallel_size 2" in problems(ds=LORA, algo=CRITIC_FREE, vllm={"tensor_parallel_size": 2})
    assert "train.enable_ema with ds.zero_stage 3" in problems(ds={"zero_stage": 3}, train={"enable_ema": True})


def test_a_lora_run_starts_no_reference_worker_and_loads_adapters_in_the_rollout_workers_process():
    cfg = RunConfig(ds=LORA, algo=CRITIC_FREE, train={"colocate_all": True})
    assert cfg.roles == ("actor", "rollout") and cfg.has_reference and not cfg.uses_ref
    assert cfg.engine_executor == "uni"  # a colocated GPU engine without LoRA runs its model runner in a child
    assert RunConfig(algo=CRITIC_FREE, train={"colocate_all": True}).engine_executor == "mp"
    assert RunConfig(algo=CRITIC_FREE).roles == ("actor", "rollout", "ref")


def test_the_memory_plan_counts_gradients_and_optimizer_states_of_the_adapters_alone():
    from hybrid_core.plan.memory import GIB, trainer_bytes
    from hybrid_core.plan.model_shapes import model_shape

    path = str(REPO_ROOT / "data" / "tiny-qwen3")
    full = RunConfig(actor={"model_name_or_path": path, "num_gpus_per_node": 1}, algo=CRITIC_FREE)
    lora = RunConfig(actor={"model_name_or_path": path, "num_gpus_per_node": 1}, algo=CRITIC_FREE,
                     ds=LORA, train={"enable_ema": True})
    shape = model_shape(path)
    adapter = 2 * 8 * 2048  # see test_lora_policy: the tiny model's rank-8 all-linear adapter
    full_bytes, lora_bytes = trainer_bytes(full, shape, True), trainer_bytes(lora, shape, True)
    assert lora_bytes.weights == full_bytes.weights  # the base is held whole
    assert lora_bytes.gradients == pytest.approx(adapter * 2 / GIB, rel=1e-12)  # bf16 gradients
    assert lora_bytes.optimizer == pytest.approx(adapter * 12 / GIB, rel=1e-12)  # fp32 master + two Adam moments
    from hybrid_core.plan.adapter_memory import adapter_notes

    notes = adapter_notes(lora, shape)
    assert notes[0].startswith("ds.lora.rank 8: only the adapters train (0.0M parameters")
    assert "EMA of the trained parameters in rank 0's host memory" in notes[1]


def test_the_preflight_names_a_target_module_the_model_lacks():
    from hybrid_core.plan.preflight import lora_target_problems

    path = str(REPO_ROOT / "data" / "tiny-qwen3")
    cfg = RunConfig(actor={"model_name_or_path": path}, algo=CRITIC_FREE,
                    ds={"lora": {"rank": 8, "target_modules": ["q_proj", "qkv_proj"]}})
    [problem] = lora_target_problems(cfg)
    assert problem.startswith("ds.lora.target_modules names ['qkv_proj'] that actor.model_name_or_path")
    assert "'q_proj'" in problem and problem.endswith("or use --ds.lora.target_modules all-linear")
    ok = RunConfig(actor={"model_name_or_path": path}, algo=CRITIC_FREE,
                   ds={"lora": {"rank": 8, "target_modules": ["q_proj", "lm_head"]}})
    assert lora_target_problems(ok) == []
