"""LoRA policies on the tiny model (PEFT, CPU): what trains, what a sync sends, the reference forward, the merged
export, the memory plan's adapter count and the engine's LoRA options."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import REPO_ROOT

TINY = REPO_ROOT / "data" / "tiny-qwen3"
# the tiny model: hidden 128, q 2×64=128, k/v 1×64, MLP 256, 2 layers; rank 8 on all seven linears of a layer:
# 8 × ((128+128) + 2·(128+64) + (128+128) + 2·(128+256) + (256+128)) = 8 × 2048 = 16384 per layer, 32768 in all
TINY_RANK8_ADAPTER_PARAMS = 32768


def tiny_policy(rank: int = 8, targets: tuple[str, ...] = ("all-linear",)):
    from transformers import AutoModelForCausalLM

    from hybrid_core.engines.lora_policy import LoraSettings, with_adapters

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    policy = with_adapters(model, LoraSettings(rank=rank, alpha=16, target_modules=targets), is_checkpointed=False)
    with torch.no_grad():  # B starts at zero (the base exactly): move it so the adapters change the outputs
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return policy.eval()


def logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(ids).logits.float(), dim=-1)


IDS = torch.tensor([[1, 60, 20, 30, 2, 1, 40, 50, 17, 18]])


def test_only_the_adapters_train_and_a_sync_sends_only_them_by_their_peft_names():
    from hybrid_core.engines.lora_policy import adapter_parameters
    from hybrid_core.engines.weight_sync import iter_buckets, synced_parameters

    policy = tiny_policy()
    trained = [name for name, p in policy.named_parameters() if p.requires_grad]
    assert trained and all(".lora_A." in name or ".lora_B." in name for name in trained)
    assert sum(p.numel() for name, p in policy.named_parameters() if p.requires_grad) == TINY_RANK8_ADAPTER_PARAMS
    names = [name for name, _ in adapter_parameters(policy)]
    assert names[0] == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert [name for name, _ in synced_parameters(policy)] == names and len(names) == 2 * 7 * 2
    buckets = list(iter_buckets(policy, 1 << 20))
    assert sum(b.num_bytes for b in buckets) == TINY_RANK8_ADAPTER_PARAMS * 4  # fp32: 131072 bytes


def test_the_reference_forward_is_the_base_model_exactly():
    from transformers import AutoModelForCausalLM

    from hybrid_core.engines.lora_policy import reference_forward

    policy = tiny_policy()
    base = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    assert (logprobs(policy, IDS) - logprobs(base, IDS)).abs().max() > 1e-2  # the adapters matter
    with reference_forward(policy):
        assert torch.equal(logprobs(policy, IDS), logprobs(base, IDS))
    assert (logprobs(policy, IDS) - logprobs(base, IDS)).abs().max() > 1e-2  # back on after the context


def test_the_merged_weights_compute_the_adapted_policy_and_leave_it_as_it_was():
    from transformers import AutoModelForCausalLM

    from hybrid_core.engines.lora_policy import merged_state_dict

    policy = tiny_policy()
    adapted = logprobs(policy, IDS)
    merged = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    state = merged_state_dict(policy)
    assert set(state) == set(merged.state_dict())
    merged.load_state_dict(state)
    torch.testing.assert_close(logprobs(merged, IDS), adapted, rtol=0, atol=1e-5)
    assert torch.equal(logprobs(policy, IDS), adapted)


def test_the_memory_plans_adapter_count_matches_peft():
    from hybrid_core.plan.model_shapes import model_shape

    shape = model_shape(str(TINY))
    assert shape.adapter_params(8, ["all-linear"]) == TINY_RANK8_ADAPTER_PARAMS
    policy = tiny_policy(rank=4, targets=("q_proj", "down_proj", "lm_head"))
    peft_count = sum(p.numel() for _, p in policy.named_parameters() if p.requires_grad)
    # two layers' q_proj (128 → 128) and down_proj (256 → 128), and the head (128 → 128) once
    expected = 2 * 4 * ((128 + 128) + (256 + 128)) + 4 * (128 + 128)
    assert shape.adapter_params(4, ["q_proj", "down_proj", "lm_head"]) == peft_count == expected


def test_the_engine_asks_vllm_for_the_smallest_rank_that_holds_the_adapter():
    from hybrid_core.engines.lora_policy import LoraSettings
    from hybrid_core.engines.lora_rollout import lora_options, peft_config

    options = lora_options(LoraSettings(rank=12, alpha=16, target_modules=("all-linear",)))
    assert options == {"enable_lora": True, "max_lora_rank": 16, "max_loras": 1}
    with pytest.raises(ValueError, match="ds.lora.rank 600 is above vLLM's largest LoRA rank 512"):
        lora_options(LoraSettings(rank=600, alpha=16, target_modules=("all-linear",)))
    names = ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
             "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    config = peft_config(LoraSettings(rank=8, alpha=16, target_modules=("all-linear",)), names)
    assert config["target_modules"] == ["down_proj", "q_proj"] and (config["r"], config["lora_alpha"]) == (8, 16)
