"""Partial rollout on the vLLM CPU build: weights reloaded under paused in-flight requests (the same weights change
nothing; other weights change only the tokens sampled after the pause, each tagged with the version that sampled it),
and an async run with train.partial_rollout_enable that learns the demo with every token's version stored, within
the versions its step may consume, and its staleness taken from the oldest. Its responses are 256 tokens long, so
a batch is still generating when the step before it pushes weights and some samples span two versions (which ones
depends on the timing: on the 2-core machine 454 of 1,280; at the demo's 16 tokens none did)."""
from __future__ import annotations

import pyarrow.dataset as pds
import pytest
import ray

from tests.conftest import REPO_ROOT
from tests.integration.conftest import read_metrics

pytestmark = pytest.mark.integration
PROMPTS = [[1, 5, 9, 64, 65, 66], [2, 7, 120, 121], [3, 97]]
SEEDS = [11, 12, 13]
N, NEW_TOKENS, PAUSE_AT = 2, 12, 5


@pytest.fixture(scope="module")
def pausing_engine(tiny_model, ray_session):
    @ray.remote(num_cpus=0)
    class PausingEngine:
        def __init__(self, model_path: str):
            import torch
            from transformers import AutoModelForCausalLM

            from hybrid_core.engines.vllm_rollout import EngineSettings, VllmRolloutEngine

            self.engine = VllmRolloutEngine(EngineSettings(model_path=model_path, param_dtype="fp32",
                                                           gpu_memory_utilization=0.1, seed=0, enforce_eager=True,
                                                           max_model_len=64))
            model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
            self.weights = {name: t.detach().clone() for name, t in model.state_dict().items()}

        def _load(self, scale: float) -> None:
            import torch

            generator = torch.Generator().manual_seed(7)
            named = [(name, t + scale * torch.randn(t.shape, generator=generator)) for name, t in self.weights.items()]
            self.engine.wake_up(["weights"])
            self.engine.load_weights(named)
            self.engine.finish_weight_update()

        def baseline(self) -> list[list[tuple[list[int], list[float]]]]:
            from hybrid_core.engines.vllm_rollout import SamplingSettings

            out = self.engine.generate(PROMPTS, SamplingSettings(n=N, max_new_tokens=NEW_TOKENS), SEEDS)
            return [[(c.token_ids, c.logprobs) for c in samples] for samples in out]

        def paused(self, scale: float):
            """Generate with a weight reload (original weights + `scale` × noise) at the PAUSE_AT-th pause point,
            then put the original weights back."""
            from hybrid_core.engines.partial_generation import generate_partial
            from hybrid_core.engines.vllm_rollout import SamplingSettings

            state = {"calls": 0, "version": 0}

            def pause_point() -> int:
                state["calls"] += 1
                if state["calls"] == PAUSE_AT:
                    self._load(scale)
                    state["version"] = 1
                return state["version"]

            try:
                result = generate_partial(self.engine, PROMPTS, SamplingSettings(n=N, max_new_tokens=NEW_TOKENS),
                                          SEEDS, pause_point)
            finally:
                self._load(0.0)
            samples = [[(c.token_ids, c.logprobs) for c in row] for row in result.completions]
            return samples, result.token_versions, result.num_pauses

    actor = PausingEngine.remote(str(tiny_model))
    yield actor
    ray.kill(actor)


def test_the_same_weights_reloaded_under_paused_requests_change_nothing(pausing_engine):
    baseline = ray.get(pausing_engine.baseline.remote())
    samples, versions, pauses = ray.get(pausing_engine.paused.remote(0.0))
    assert pauses == 1
    assert [[ids for ids, _ in row] for row in samples] == [[ids for ids, _ in row] for row in baseline]
    for row, base in zip(samples, baseline):
        for (_, logprobs), (_, expected) in zip(row, base):
            assert logprobs == pytest.approx(expected, abs=1e-5)
    # the first pause point comes before the first engine step: PAUSE_AT - 1 steps sampled one token each with
    # version 0 (the prefill's step samples the first), the rest version 1
    for row, base in zip(versions, baseline):
        for sample_versions, (ids, _) in zip(row, base):
            old = min(PAUSE_AT - 1, len(ids))
            assert sample_versions == [0] * old + [1] * (len(ids) - old)


def test_other_weights_loaded_mid_batch_change_only_the_later_tokens(pausing_engine):
    baseline = ray.get(pausing_engine.baseline.remote())
    samples, versions, pauses = ray.get(pausing_engine.paused.remote(0.5))
    assert pauses == 1
    changed = 0
    for row, base, row_versions in zip(samples, baseline, versions):
        for (ids, _), (expected, _), sample_versions in zip(row, base, row_versions):
            old = sample_versions.count(0)
            assert sample_versions == [0] * old + [1] * (len(ids) - old)
            assert ids[:old] == expected[:old]  # sampled before the reload: the old weights' tokens
            changed += ids != expected
    assert changed >= 1  # after it, the new weights sample other tokens
    assert ray.get(pausing_engine.baseline.remote()) == baseline  # the original weights are back


def test_a_partial_rollout_run_learns_and_stores_every_tokens_version(tmp_path, tiny_model, ray_session,
                                                                      prefect_server):
    from flows.rl_train import rl_train
    from hybrid_core.flags import parse_cli

    cfg = parse_cli(["--config", str(REPO_ROOT / "data" / "demo.yaml"), "--store.root", str(tmp_path),
                     "--vllm.enable_sleep=false", "--train.async_enable", "--train.partial_rollout_enable",
                     "--train.async_queue_size", "1", "--train.max_steps", "20", "--rollout.max_new_tokens", "256",
                     "--algo.advantage.is_correction_enable", "--algo.advantage.is_correction_type", "icepop"])
    result = rl_train(cfg, run_id="partial")
    rows = [read_metrics(result.run_dir, k) for k in range(1, 21)]
    rewards = [row["reward/mean"] for row in rows]
    assert sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5 >= 0.2, rewards
    spanning, old_token_shares = 0, []
    for k, row in enumerate(rows, start=1):
        table = pds.dataset(f"{result.run_dir}/steps/{k}/rollout", format="parquet").to_table().to_pylist()
        oldest = min(r["policy_version"] for r in table)
        for r in table:
            versions = r["token_policy_version"]
            assert len(versions) == len(r["response_ids"]) and versions == sorted(versions)
            assert r["policy_version"] == min(versions, default=r["policy_version"])
            assert max(0, k - 2) <= min(versions, default=k - 2) and max(versions, default=0) <= k - 1
        assert row["rollout/staleness"] == (k - 1) - oldest <= 1
        assert 0.0 <= row["rollout/old_version_token_share"] <= 1.0
        assert row["rollout/staleness_token_mean"] <= row["rollout/staleness"]
        spanning += sum(len(set(r["token_policy_version"])) > 1 for r in table)
        old_token_shares.append(row["rollout/old_version_token_share"])
    assert spanning >= 1  # a push landed under generating requests: their later tokens carry the newer version
    assert max(old_token_shares) > 0.0
