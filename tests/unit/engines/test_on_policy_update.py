"""Unit tests of the on-policy update: when one optimizer step over one epoch trains the step's samples, the old
logprobs are the update's own forward (detached) instead of a separate no-grad forward of the same weights, and the
result is the same: bit for bit on CPU in the padded layout (a row's logprobs do not depend on the other rows of its
micro-batch; the vocabulary head's chunks run over a fixed row count on CPU, `vocab_head._head_rows`), to fp32
rounding when packed (the forward's and the update's packed rows hold other samples, so the attention sums run over
other lengths: one unit in the last place at most on these weights — 1.2e-7 on the norm weights near 1.0, on the
2-core CI machine of 2026-12-02; 4e-8 before — whose step moves them by 1e-3 to 6e-2).

The engine is `TorchTrainEngine` (DeepSpeedTrainEngine's train surface in plain torch); the separate forward is the
advantage stage's own (`batched_logprobs`, with its own micro-batches).
"""
import pytest
import torch

from hybrid_core.algorithms.experience import ActorLossSettings
from hybrid_core.engines.actor_trainer import ISCorrection, TrainSamples, fit_actor
from hybrid_core.engines.experience_maker import kl_figures
from hybrid_core.engines.frozen_model import batched_logprobs
from hybrid_core.engines.minibatch_updates import BatchPlan
from hybrid_core.engines.sequence_batch import MicroBatching
from tests.unit.engines.test_minibatch_updates import TorchTrainEngine, _policy, _samples

FP32_EPS = 2.0**-23  # one rounding step of fp32, relative
SETTINGS = ActorLossSettings(kl_coef=0.1, kl_estimator="k2", kl_use_loss=True, entropy_coef=0.01)


def _step(samples: TrainSamples, batching: MicroBatching, correction: ISCorrection | None):
    """(parameters after one optimizer step over the 8 samples, the fit's statistics)."""
    engine = TorchTrainEngine(_policy())
    plan = BatchPlan(batch_size=8, batching=batching, max_epochs=1, seed=11)
    stats = fit_actor(engine, samples, SETTINGS, plan, correction)
    return {name: p.detach().clone() for name, p in engine.module.named_parameters()}, stats


@pytest.mark.parametrize("is_packed", [False, True])
def test_the_update_forward_serves_as_old_logprobs_bit_for_bit(is_packed):
    prompts, responses, advantages = _samples()
    _, _, noise = _samples(seed=1)
    rollout = [[-2.0 + 0.1 * x for x in row] for row in noise]  # the engine's logprobs, for the IS weights
    model = _policy()
    forward = MicroBatching(num_samples=3, is_packed=is_packed)  # the advantage stage cuts its own micro-batches
    old = batched_logprobs(model, prompts, responses, 0, forward)
    ref = [[lp - 0.3 * x for lp, x in zip(row, noise_row)] for row, noise_row in zip(old, noise)]
    correction = ISCorrection(kind="tis", low=0.5, high=5.0)
    batching = MicroBatching(num_samples=2, max_tokens=30 if is_packed else None, is_packed=is_packed)
    separate = TrainSamples(prompts, responses, old, ref, advantages, rollout)
    weights, stats = _step(separate, batching, correction)
    own_weights, own_stats = _step(TrainSamples(prompts, responses, None, ref, advantages, rollout), batching,
                                   correction)
    moved = [name for name, w in weights.items() if not torch.equal(w, _policy().state_dict()[name])]
    assert moved, "the step moved no weight: the comparison would prove nothing"
    for name, w in weights.items():
        if is_packed:
            torch.testing.assert_close(own_weights[name], w, rtol=FP32_EPS, atol=1e-7, msg=name)
        else:
            assert torch.equal(own_weights[name], w), name
    for key, value in stats.items():
        assert own_stats[key] == (pytest.approx(value, rel=1e-5, abs=1e-7) if is_packed else value), key
    expected = kl_figures(old, ref, "k2")
    assert expected["experience_kl"] > 0
    for key, value in expected.items():
        assert own_stats[key] == (pytest.approx(value, rel=1e-5) if is_packed else value), key
    assert "experience_kl" not in stats  # with old logprobs given, the advantage stage reports the KL


def test_own_forward_needs_one_optimizer_step_of_one_epoch():
    prompts, responses, advantages = _samples()
    samples = TrainSamples(prompts, responses, None, None, advantages)
    engine = TorchTrainEngine(_policy())
    for batch_size, epochs in ((4, 1), (8, 2)):
        plan = BatchPlan(batch_size=batch_size, batching=MicroBatching(num_samples=2), max_epochs=epochs, seed=0)
        with pytest.raises(ValueError, match=f"8 samples, train.batch_size {batch_size}, train.max_epochs {epochs}"):
            fit_actor(engine, samples, SETTINGS, plan)
