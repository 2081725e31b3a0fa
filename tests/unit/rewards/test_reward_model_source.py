"""hybrid_core.rewards.sources' reward-model source: it scores the step's token ids through the ranks' forward,
passes rewards (and the raw value when normalised) into the reward stage's columns, refuses non-finite rewards
naming the sample, and stands alone (no source is opened from a remote URL that is not set)."""
import pytest

from hybrid_core.rewards.sources import RewardModelSource, RewardSourceSpec, open_reward_source

PROMPTS, RESPONSES = [[1, 2], [3], [4, 5, 6]], [[7], [8, 9], []]
KEYS = [(0, 0), (0, 1), (1, 0)]


def forward(prompt_ids, response_ids):
    """A stand-in for the ranks: reward = raw / 2, raw = the sample's last token id."""
    return [((p + r)[-1] / 2, float((p + r)[-1])) for p, r in zip(prompt_ids, response_ids)]


def test_rewards_come_from_the_token_ids_not_the_text():
    calls = []
    source = RewardModelSource(prompt_ids=PROMPTS, response_ids=RESPONSES, is_normalized=True,
                               forward=lambda p, r: calls.append((p, r)) or forward(p, r))
    batch = source.score(["ignored"] * 3, ["ignored"] * 3, [""] * 3, KEYS)
    assert calls == [(PROMPTS, RESPONSES)]
    assert (batch.rewards, batch.scores) == ([3.5, 4.5, 3.0], [3.5, 4.5, 3.0])
    assert batch.extra_logs == [{"reward_model_raw": 7.0}, {"reward_model_raw": 9.0}, {"reward_model_raw": 6.0}]
    plain = RewardModelSource(prompt_ids=PROMPTS, response_ids=RESPONSES, is_normalized=False, forward=forward)
    assert plain.score([""] * 3, [""] * 3, [""] * 3, KEYS).extra_logs == [{}, {}, {}]


def test_a_non_finite_reward_names_the_sample():
    nan_forward = lambda p, r: [(1.0, 1.0), (float("nan"), 0.0), (float("inf"), 0.0)]  # noqa: E731
    source = RewardModelSource(prompt_ids=PROMPTS, response_ids=RESPONSES, is_normalized=False, forward=nan_forward)
    with pytest.raises(RuntimeError, match=r"scored sample \(0, 1\) \(prompt_index, sample_index\) nan \(2 of 3 "
                                           r"samples not finite\)"):
        source.score([""] * 3, [""] * 3, [""] * 3, KEYS)


def test_without_a_remote_url_no_function_source_is_opened():
    spec = RewardSourceSpec(remote_url=None, timeout_s=1.0, max_retries=0, retry_budget_s=1.0)
    assert open_reward_source(spec) is None
