"""Unit tests for hybrid_core.algorithms.correction: tis, icepop and seq-mask-tis importance weights."""

import math

import pytest
import torch

from hybrid_core.algorithms.correction import is_weights


def _close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32), rtol=0, atol=atol)


# old_logprobs 0 and rollout_logprobs −ln w give w = exp(old − rollout):
#   row 0: w = [0.25, 1, 2, 8], all unmasked
#   row 1: w = [8, 8, 8, 0.25], last token masked
OLD_LOGPROBS = torch.zeros(2, 4)
ROLLOUT_LOGPROBS = -torch.tensor([[math.log(w) for w in row] for row in [[0.25, 1, 2, 8], [8, 8, 8, 0.25]]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])


def test_tis_clamps_the_weights():
    # clamp to [0.5, 5]: [0.5, 1, 2, 5] and [5, 5, 5, 0 (masked)]
    weights = is_weights(OLD_LOGPROBS, ROLLOUT_LOGPROBS, MASK, kind="tis")
    _close(weights, [[0.5, 1.0, 2.0, 5.0], [5.0, 5.0, 5.0, 0.0]])


def test_icepop_zeroes_the_weights_outside_the_range():
    # keep w in [0.5, 5]: [0, 1, 2, 0] and [0, 0, 0, 0]
    weights = is_weights(OLD_LOGPROBS, ROLLOUT_LOGPROBS, MASK, kind="icepop")
    _close(weights, [[0.0, 1.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_icepop_bounds_are_inclusive():
    # w = [0.5, 5] sit exactly on the bounds and are kept
    rollout = -torch.tensor([[math.log(0.5), math.log(5.0)]])
    # atol 1e-5: float32 exp(ln 5) is 5 ± 5e-7 and the bound test must still accept it
    _close(is_weights(torch.zeros(1, 2), rollout, torch.ones(1, 2), kind="icepop"), [[0.5, 5.0]], atol=1e-5)


def test_seq_mask_tis_keeps_or_drops_whole_sequences():
    # row 0: mean log w = (ln 0.25 + 0 + ln 2 + ln 8)/4 = ln 4/4 → exp = √2 ≈ 1.41 ∈ [0.5, 5]: unclamped w kept
    # row 1: mean over the 3 unmasked tokens = ln 8 → 8 > 5: the whole sequence gets 0
    weights = is_weights(OLD_LOGPROBS, ROLLOUT_LOGPROBS, MASK, kind="seq-mask-tis")
    _close(weights, [[0.25, 1.0, 2.0, 8.0], [0.0, 0.0, 0.0, 0.0]])


def test_custom_bounds():
    # tis in [0.1, 10]: row 0 unchanged, row 1 [8, 8, 8, 0]
    weights = is_weights(OLD_LOGPROBS, ROLLOUT_LOGPROBS, MASK, kind="tis", low=0.1, high=10.0)
    _close(weights, [[0.25, 1.0, 2.0, 8.0], [8.0, 8.0, 8.0, 0.0]])


@pytest.mark.parametrize("kind", ["tis", "icepop", "seq-mask-tis"])
def test_weights_are_detached(kind):
    old_logprobs = OLD_LOGPROBS.clone().requires_grad_()
    assert not is_weights(old_logprobs, ROLLOUT_LOGPROBS, MASK, kind=kind).requires_grad


@pytest.mark.parametrize("kind", ["tis", "icepop", "seq-mask-tis"])
def test_matches_a_reference_loop(kind):
    gen = torch.Generator().manual_seed(3)
    old_logprobs, rollout_logprobs = -torch.rand(6, 7, generator=gen) * 3, -torch.rand(6, 7, generator=gen) * 3
    mask = (torch.arange(7).unsqueeze(0) < torch.tensor([[7], [2], [5], [0], [4], [6]])).float()
    low, high = 0.5, 5.0
    expected = torch.zeros(6, 7)
    for b in range(6):
        tokens = [t for t in range(7) if mask[b, t] > 0]
        log_ws = {t: old_logprobs[b, t].item() - rollout_logprobs[b, t].item() for t in tokens}
        seq_w = math.exp(sum(log_ws.values()) / len(tokens)) if tokens else 1.0
        for t in tokens:
            w = math.exp(log_ws[t])
            if kind == "tis":
                expected[b, t] = min(max(w, low), high)
            elif kind == "icepop":
                expected[b, t] = w if low <= w <= high else 0.0
            else:
                expected[b, t] = w if low <= seq_w <= high else 0.0
    # weights reach ~20 (log w up to 3): float32 exp is exact to ~2e-6 there, hence atol 1e-5
    _close(is_weights(old_logprobs, rollout_logprobs, mask, kind=kind, low=low, high=high), expected, atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "ppo"}, r"kind must be one of \['icepop', 'seq-mask-tis', 'tis'\]: got 'ppo'"),
        ({"kind": "tis", "low": 5.0, "high": 5.0}, r"low and high must satisfy 0 <= low < high: got 5.0 and 5.0"),
        ({"kind": "tis", "low": 2.0, "high": 1.0}, r"low and high .*: got 2.0 and 1.0"),
        ({"kind": "tis", "low": -1.0}, r"low and high .*: got -1.0 and 5.0"),
    ],
)
def test_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        is_weights(OLD_LOGPROBS, ROLLOUT_LOGPROBS, MASK, **kwargs)


def test_rejects_shape_mismatch():
    with pytest.raises(ValueError, match=r"rollout_logprobs must be \(B, T\) like old_logprobs: got \(2, 3\)"):
        is_weights(OLD_LOGPROBS, ROLLOUT_LOGPROBS[:, :3], MASK, kind="tis")
    with pytest.raises(ValueError, match=r"mask must be \(B, T\) like old_logprobs: got \(1, 4\) and \(2, 4\)"):
        is_weights(OLD_LOGPROBS, ROLLOUT_LOGPROBS, MASK[:1], kind="tis")
