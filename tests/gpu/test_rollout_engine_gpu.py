"""vLLM sleep mode on the GPU: sleep frees the engine's memory, and waking up (level 1) or reloading the weights
(level 2) gives back exactly the greedy outputs of before."""
from __future__ import annotations

import pytest
from gpu_helpers import fixed_sequence

pytestmark = pytest.mark.gpu

GREEDY_PROMPTS = [fixed_sequence(24, seed) for seed in range(4)]


def greedy(engine) -> list[list[int]]:
    from hybrid_core.engines.vllm_rollout import SamplingSettings

    out = engine.generate(GREEDY_PROMPTS, SamplingSettings(n=1, max_new_tokens=32, temperature=0.0),
                          seeds=range(len(GREEDY_PROMPTS)))
    return [samples[0].token_ids for samples in out]


def free_after(torch, action) -> int:
    torch.cuda.synchronize()
    before = torch.cuda.mem_get_info()[0]
    action()
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0] - before


def test_level1_sleep_frees_the_engine_and_wake_restores_outputs(rollout_engine, cuda):
    engine, engine_bytes = rollout_engine
    expected = greedy(engine)
    freed = free_after(cuda, lambda: engine.sleep(level=1))
    assert freed >= 0.9 * engine_bytes, (freed / 2**30, engine_bytes / 2**30)
    engine.wake_up(["weights"])
    engine.wake_up(["kv_cache"])
    assert greedy(engine) == expected


def test_level2_sleep_frees_the_engine_and_a_weight_reload_restores_outputs(rollout_engine, standin, cuda):
    from safetensors.torch import load_file

    from hybrid_core.engines.vllm_rollout import EngineAsleepError

    engine, engine_bytes = rollout_engine
    expected = greedy(engine)
    freed = free_after(cuda, lambda: engine.sleep(level=2))
    assert freed >= 0.9 * engine_bytes, (freed / 2**30, engine_bytes / 2**30)
    engine.wake_up(["weights"])
    engine.wake_up(["kv_cache"])
    with pytest.raises(EngineAsleepError, match="discarded the weights"):
        greedy(engine)
    weights = {}
    for shard in sorted(standin.glob("*.safetensors")):
        weights |= load_file(str(shard), device="cuda")
    engine.load_weights(list(weights.items()))
    engine.finish_weight_update()
    assert greedy(engine) == expected
