"""Unit tests for hybrid_core.algorithms.kl: the k1/k2/k3 estimators and the KL coefficient controllers."""

import math

import pytest
import torch

from hybrid_core.algorithms.kl import AdaptiveKLController, FixedKLController, kl_penalty


def _close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32), rtol=0, atol=atol)


# x = logprobs − ref_logprobs = [0.5, −1.0, 0.0]
LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5]])
REF_LOGPROBS = torch.tensor([[-1.5, -1.0, -0.5]])


def test_k1_is_the_log_ratio():
    _close(kl_penalty(LOGPROBS, REF_LOGPROBS, "k1"), [[0.5, -1.0, 0.0]])


def test_k2_is_half_the_squared_log_ratio():
    # 0.5²/2 = 0.125; (−1)²/2 = 0.5; 0
    _close(kl_penalty(LOGPROBS, REF_LOGPROBS, "k2"), [[0.125, 0.5, 0.0]])


def test_k3_is_exp_minus_x_minus_one_plus_x():
    # exp(−0.5) − 1 + 0.5 = 0.6065306597 − 0.5 = 0.1065306597; exp(1) − 1 − 1 = 0.7182818285; exp(0) − 1 + 0 = 0
    _close(kl_penalty(LOGPROBS, REF_LOGPROBS, "k3"), [[0.1065306597, 0.7182818285, 0.0]])


def test_results_are_clamped_to_plus_minus_ten():
    # x = [20, −20]: k1 → [10, −10]; k2 = 200 → 10; k3(20) = e^−20 + 19 → 10, k3(−20) = e^20 − 21 → 10
    logprobs, ref = torch.tensor([[20.0, -20.0]]), torch.zeros(1, 2)
    _close(kl_penalty(logprobs, ref, "k1"), [[10.0, -10.0]])
    _close(kl_penalty(logprobs, ref, "k2"), [[10.0, 10.0]])
    _close(kl_penalty(logprobs, ref, "k3"), [[10.0, 10.0]])


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_matches_a_reference_loop_on_random_inputs(estimator):
    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(3, 7, generator=gen) * 3
    ref = -torch.rand(3, 7, generator=gen) * 3
    expected = torch.zeros(3, 7)
    for b in range(3):
        for t in range(7):
            x = logprobs[b, t].item() - ref[b, t].item()
            value = {"k1": x, "k2": x * x / 2, "k3": math.exp(-x) - 1 + x}[estimator]
            expected[b, t] = min(max(value, -10.0), 10.0)
    _close(kl_penalty(logprobs, ref, estimator), expected)


def test_unknown_estimator_is_rejected():
    with pytest.raises(ValueError, match=r"estimator must be one of .*: got 'k4'"):
        kl_penalty(LOGPROBS, REF_LOGPROBS, "k4")


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match=r"ref_logprobs must have the shape of logprobs: got \(1, 2\)"):
        kl_penalty(LOGPROBS, REF_LOGPROBS[:, :2], "k1")


def test_fixed_controller_keeps_its_coef():
    controller = FixedKLController(0.05)
    controller.update(kl=100.0, n_samples=1000)
    assert controller.coef == 0.05


@pytest.mark.parametrize(
    ("kl", "expected"),
    [
        # KL/target − 1 = 9/6 − 1 = 0.5, clipped to 0.2; β = 0.1·(1 + 0.2·1000/10000) = 0.1·1.02 = 0.102
        (9.0, 0.102),
        # 6.6/6 − 1 = 0.1 (inside the clip); β = 0.1·(1 + 0.1·0.1) = 0.101
        (6.6, 0.101),
        # 0/6 − 1 = −1, clipped to −0.2; β = 0.1·(1 − 0.02) = 0.098
        (0.0, 0.098),
        # on target: error 0, β unchanged
        (6.0, 0.1),
    ],
)
def test_adaptive_controller_follows_the_clipped_proportional_rule(kl, expected):
    controller = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10000)
    controller.update(kl=kl, n_samples=1000)
    assert controller.coef == pytest.approx(expected, abs=1e-12)


def test_adaptive_controller_compounds_over_steps():
    # two steps far above target: 0.1·1.02·1.02 = 0.10404
    controller = AdaptiveKLController(init_coef=0.1, target=1.0, horizon=10000)
    controller.update(kl=10.0, n_samples=1000)
    controller.update(kl=10.0, n_samples=1000)
    assert controller.coef == pytest.approx(0.10404, abs=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"init_coef": -0.1, "target": 6.0, "horizon": 10000}, r"init_coef must be >= 0: got -0.1"),
        ({"init_coef": 0.1, "target": 0.0, "horizon": 10000}, r"target must be > 0: got 0.0"),
        ({"init_coef": 0.1, "target": 6.0, "horizon": -5}, r"horizon must be > 0: got -5"),
    ],
)
def test_adaptive_controller_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveKLController(**kwargs)


def test_controllers_reject_bad_values():
    with pytest.raises(ValueError, match=r"init_coef must be >= 0: got -1"):
        FixedKLController(-1)
    controller = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10000)
    with pytest.raises(ValueError, match=r"n_samples must be >= 0: got -3"):
        controller.update(kl=1.0, n_samples=-3)
