"""Unit tests of an agent's action mask in the actor's update: the environment's tokens (mask 0) carry no loss, KL
or IS weight, so what their positions hold (advantages, old, reference and rollout logprobs) does not reach the
gradient, and the step's token mean counts the generated tokens only. The engine is `TorchTrainEngine`
(DeepSpeedTrainEngine's train surface in plain torch) over the tiny Qwen3."""
import pytest
import torch

from hybrid_core.algorithms.experience import ActorLossSettings
from hybrid_core.engines.actor_trainer import ISCorrection, TrainSamples, fit_actor
from hybrid_core.engines.minibatch_updates import BatchPlan
from hybrid_core.engines.sequence_batch import MicroBatching
from tests.unit.engines.test_minibatch_updates import RESPONSE_LENGTHS, TorchTrainEngine, _policy, _samples

SETTINGS = ActorLossSettings(kl_coef=0.1, kl_estimator="k3", kl_use_loss=True)
PLAN = BatchPlan(batch_size=len(RESPONSE_LENGTHS), batching=MicroBatching(num_samples=3), max_epochs=1, seed=5)


def _masks() -> list[list[int]]:
    """Turns of 2 generated tokens, then 1 environment token, repeated (the last token always generated)."""
    return [[0 if i % 3 == 2 and i < n - 1 else 1 for i in range(n)] for n in RESPONSE_LENGTHS]


def _scrambled(rows: list[list[float]], masks: list[list[int]], shift: float) -> list[list[float]]:
    """The same rows with every environment position changed."""
    return [[x if m else x + shift * (1 + i) for i, (x, m) in enumerate(zip(row, mask))]
            for row, mask in zip(rows, masks)]


def _gradients(samples: TrainSamples, correction: ISCorrection | None = None):
    engine = TorchTrainEngine(_policy())
    stats = fit_actor(engine, samples, SETTINGS, PLAN, correction)
    return engine.step_gradients, stats


def _inputs():
    prompts, responses, advantages = _samples()
    _, _, noise = _samples(seed=1)
    old = [[-4.0 + x for x in row] for row in noise]
    ref = [[-4.5 + 0.5 * x for x in row] for row in noise]
    rollout = [[-4.1 + x for x in row] for row in noise]
    return prompts, responses, advantages, old, ref, rollout


def test_the_environment_tokens_get_zero_gradient():
    prompts, responses, advantages, old, ref, rollout = _inputs()
    masks = _masks()
    assert sum(map(sum, masks)) < sum(RESPONSE_LENGTHS)  # some tokens are the environment's
    correction = ISCorrection(kind="tis", low=0.5, high=2.0)
    masked, stats = _gradients(TrainSamples(prompts, responses, old, ref, advantages, rollout, masks), correction)
    scrambled = TrainSamples(prompts, responses, _scrambled(old, masks, 0.7), _scrambled(ref, masks, -1.3),
                             _scrambled(advantages, masks, 5.0), _scrambled(rollout, masks, 0.9), masks)
    other, other_stats = _gradients(scrambled, correction)
    unmasked, _ = _gradients(TrainSamples(prompts, responses, old, ref, advantages, rollout), correction)
    assert masked.keys() == other.keys() and masked
    for name, gradient in masked.items():
        assert torch.equal(gradient, other[name]), name
    assert any(not torch.equal(gradient, unmasked[name]) for name, gradient in masked.items())
    assert stats == other_stats


def test_the_step_s_token_mean_counts_the_generated_tokens_only():
    """With old logprobs equal to the policy's own (ratio 1, exactly on-policy) and no KL, PPO's loss is
    −Σ A·m / Σ m over the step: computed here from the rows alone."""
    prompts, responses, advantages, _, _, _ = _inputs()
    masks = _masks()
    settings = ActorLossSettings(kl_coef=0.0)
    engine = TorchTrainEngine(_policy())
    stats = fit_actor(engine, TrainSamples(prompts, responses, None, None, advantages, None, masks), settings, PLAN)
    generated = sum(map(sum, masks))
    expected = -sum(a * m for row, mask in zip(advantages, masks) for a, m in zip(row, mask)) / generated
    assert stats["policy_loss"] == pytest.approx(expected, rel=1e-5)
    everything = -sum(map(sum, advantages)) / sum(RESPONSE_LENGTHS)
    assert abs(expected - everything) > 1e-3  # the two means differ: the test tells them apart
