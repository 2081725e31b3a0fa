"""Unit tests for hybrid_core.rewards.reward_func (loading and checking a user reward_func) and the demo reward."""

import math
from pathlib import Path

import pytest
import torch

from hybrid_core.rewards.reward_func import RewardBatch, RewardFunctionError, load_reward_func, score_samples

LETTERS_REWARD = Path(__file__).resolve().parents[3] / "data" / "letters_reward.py"
SOURCE = "my_reward.py"


def _write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(body)
    return str(path)


def _const(out):
    return lambda queries, prompts, labels, **kwargs: out


def test_load_reward_func_from_a_file(tmp_path):
    path = _write(tmp_path, "def reward_func(queries, prompts, labels, **kwargs):\n"
                            "    return {'rewards': [len(q) for q in queries]}\n")
    func = load_reward_func(path)
    assert func(["ab", "c"], ["", ""], ["", ""]) == {"rewards": [2, 1]}


def test_missing_file_fails_naming_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"reward\.remote_url points to a missing file: got '.*nope\.py'"):
        load_reward_func(str(tmp_path / "nope.py"))


def test_file_without_reward_func_fails(tmp_path):
    path = _write(tmp_path, "reward_func = 3  # not callable\ndef other():\n    pass\n")
    with pytest.raises(ValueError, match=r"defines no reward_func: got '.*my_reward\.py'"):
        load_reward_func(path)


def test_score_samples_with_tensors():
    out = {"rewards": torch.tensor([1.0, 0.5]), "scores": torch.tensor([[2.0], [3.0]]).reshape(-1)}
    batch = score_samples(_const(out), SOURCE, ["q1", "q2"], ["p1", "p2"], ["l1", "l2"])
    assert batch == RewardBatch(rewards=[1.0, 0.5], scores=[2.0, 3.0], extra_logs=[{}, {}])
    assert all(type(v) is float for v in batch.rewards + batch.scores)


def test_score_samples_with_lists_and_default_scores():
    batch = score_samples(_const({"rewards": [1, 0.25, -2]}), SOURCE, ["a", "b", "c"], ["", "", ""], ["", "", ""])
    assert batch.rewards == [1.0, 0.25, -2.0]
    assert batch.scores == batch.rewards  # no "scores": the rewards are the scores
    assert batch.scores is not batch.rewards


def test_score_samples_passes_queries_prompts_labels():
    seen = {}

    def func(queries, prompts, labels, **kwargs):
        seen.update(queries=queries, prompts=prompts, labels=labels)
        return {"rewards": [0.0]}

    score_samples(func, SOURCE, ["pq"], ["p"], ["l"])
    assert seen == {"queries": ["pq"], "prompts": ["p"], "labels": ["l"]}


@pytest.mark.parametrize("bad, name", [(float("nan"), "reward"), (float("inf"), "reward")])
def test_non_finite_reward_fails_naming_the_file(bad, name):
    with pytest.raises(ValueError, match=rf"reward_func in my_reward\.py returned a non-finite {name}"):
        score_samples(_const({"rewards": torch.tensor([0.0, bad])}), SOURCE, ["a", "b"], ["", ""], ["", ""])


def test_nan_score_fails_naming_the_file():
    out = {"rewards": [0.0, 1.0], "scores": [math.nan, 1.0]}
    with pytest.raises(ValueError, match=r"reward_func in my_reward\.py returned a non-finite score"):
        score_samples(_const(out), SOURCE, ["a", "b"], ["", ""], ["", ""])


def test_wrong_length_fails():
    with pytest.raises(ValueError, match=r"my_reward\.py returned 1 rewards for 2 samples"):
        score_samples(_const({"rewards": [1.0]}), SOURCE, ["a", "b"], ["", ""], ["", ""])
    with pytest.raises(ValueError, match=r"my_reward\.py returned 3 scores for 2 samples"):
        score_samples(_const({"rewards": [1.0, 2.0], "scores": [1, 2, 3]}), SOURCE, ["a", "b"], ["", ""], ["", ""])


def test_a_raising_reward_func_fails_naming_the_file():
    # The module docstring promises: "a function that raises, returns the wrong length or a NaN fails with a
    # message naming the file". score_samples calls func(...) unguarded, so today the user's own exception
    # (ZeroDivisionError: division by zero) escapes without the file's name: this test fails until it is wrapped.
    def func(queries, prompts, labels, **kwargs):
        return {"rewards": [1 / 0 for _ in queries]}

    with pytest.raises(Exception) as err:
        score_samples(func, SOURCE, ["a"], [""], [""])
    assert "my_reward.py" in str(err.value), f"message does not name the file: {err.value!r}"


@pytest.mark.parametrize("out", [[1.0, 2.0], {"scores": [1.0, 2.0]}, None])
def test_return_without_rewards_dict_fails(out):
    with pytest.raises(ValueError, match=r"must return a dict with 'rewards'"):
        score_samples(_const(out), SOURCE, ["a", "b"], ["", ""], ["", ""])


def test_extra_logs_per_sample_and_scalar():
    out = {"rewards": [0.0, 1.0, 0.5], "extra_logs": {
        "tensor": torch.tensor([1.0, 2.0, 3.0]), "list": ["x", "y", "z"], "scalar_tensor": torch.tensor(7.5),
        "scalar": 4, "column": torch.tensor([[10], [20], [30]]),
    }}
    batch = score_samples(_const(out), SOURCE, ["a", "b", "c"], ["", "", ""], ["", "", ""])
    assert batch.extra_logs == [
        {"tensor": 1.0, "list": "x", "scalar_tensor": 7.5, "scalar": 4, "column": 10},
        {"tensor": 2.0, "list": "y", "scalar_tensor": 7.5, "scalar": 4, "column": 20},
        {"tensor": 3.0, "list": "z", "scalar_tensor": 7.5, "scalar": 4, "column": 30},
    ]


@pytest.mark.parametrize("value, length", [(["x", "y"], 2), (torch.tensor([1.0, 2.0]), 2), ((1, 2, 3, 4), 4),
                                           ([], 0)])
def test_extra_logs_of_another_length_fail_at_once_naming_the_key(value, length):
    """A short list once raised IndexError deep in the split, which was retried as transient."""
    out = {"rewards": [0.0, 1.0, 0.5], "extra_logs": {"ok": [1, 2, 3], "acc": value}}
    with pytest.raises(RewardFunctionError) as raised:
        score_samples(_const(out), SOURCE, ["a", "b", "c"], ["", "", ""], ["", "", ""])
    assert str(raised.value) == (f"reward_func in {SOURCE} returned extra_logs['acc'] with {length} values for 3 "
                                 "samples; return one value per sample, or one number for the batch")


def test_extra_logs_that_are_not_a_dict_fail_naming_their_type():
    out = {"rewards": [0.0, 1.0], "extra_logs": [{"acc": 1}, {"acc": 0}]}
    with pytest.raises(RewardFunctionError, match=r"returned extra_logs of type list; return a dict"):
        score_samples(_const(out), SOURCE, ["a", "b"], ["", ""], ["", ""])


@pytest.fixture(scope="module")
def letters():
    return load_reward_func(str(LETTERS_REWARD))


def _query(prompt: str, response: str) -> str:
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n{response}"


def test_letters_reward_by_hand(letters):
    queries = [
        _query("use a or e", "aaxx<|im_end|>"),  # a, a in "ae" → 2/16 = 0.125 (prompt letters do not count)
        _query("abc", "cab" * 6),                 # 18 hits capped at 16 → 16/16 = 1.0
        _query("q", "zzz"),                       # 0 hits → 0.0
        "no header at all: bb",                   # no header: the whole query is the response; b, b → 2/16
        _query("x", "ee<|endoftext|>"),           # special tokens stripped: e, e → 2/16 = 0.125
    ]
    labels = ["ae", "abc", "a", "b", "e"]
    batch = score_samples(letters, str(LETTERS_REWARD), queries, [""] * 5, labels)
    assert batch.rewards == [0.125, 1.0, 0.0, 0.125, 0.125]
    assert batch.scores == batch.rewards
    assert [e["full_marks"] for e in batch.extra_logs] == [0.0, 1.0, 0.0, 0.0, 0.0]


def test_letters_reward_counts_only_the_last_assistant_turn(letters):
    # "a" appears 3 times in the first assistant turn and once in the last → 1/16 = 0.0625
    query = _query("hi", "aaa<|im_end|>\n") + "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\na"
    batch = score_samples(letters, str(LETTERS_REWARD), [query], [""], ["a"])
    assert batch.rewards == [0.0625]


def test_errors_name_the_failing_sample():
    from hybrid_core.rewards.reward_func import score_samples

    keys = [(7, 0), (7, 1), (9, 0)]

    def nan_on_second(queries, prompts, labels, **kwargs):
        return {"rewards": [1.0, float("nan"), 0.0][:len(queries)]}

    with pytest.raises(ValueError, match=r"sample #1 \(prompt_index, sample_index\) = \(7, 1\)"):
        score_samples(nan_on_second, "nan.py", ["a", "b", "c"], ["", "", ""], ["", "", ""], keys=keys)

    def raises_on_label_z(queries, prompts, labels, **kwargs):
        if "z" in labels:
            raise KeyError("no grader for z")
        return {"rewards": [0.0] * len(queries)}

    with pytest.raises(RewardFunctionError, match=r"KeyError: 'no grader for z' on sample #2 .* = \(9, 0\)"):
        score_samples(raises_on_label_z, "z.py", ["a", "b", "c"], ["", "", ""], ["x", "y", "z"], keys=keys)


def test_bad_output_and_repeated_raises_are_permanent_and_a_one_off_raise_is_not():
    from hybrid_core.types import PermanentError

    for out in ({"rewards": "xxxx"}, {"rewards": [1.0, "high"]}, {"rewards": [1.0]}, {"rewards": [float("nan"), 0]}):
        with pytest.raises(RewardFunctionError, match=r"reward_func in f\.py returned") as err:
            score_samples(_const(out), "f.py", ["a", "b"], ["", ""], ["", ""])
        assert isinstance(err.value, PermanentError), out  # calling again returns the same: not retried
    calls = []

    def fails_once(queries, prompts, labels, **kwargs):  # e.g. a grader's service that timed out once
        calls.append(len(queries))
        if len(calls) == 1:
            raise TimeoutError("grader busy")
        return {"rewards": [0.0] * len(queries)}

    with pytest.raises(RuntimeError, match="TimeoutError: grader busy on a batch of 2 samples") as err:
        score_samples(fails_once, "f.py", ["a", "b"], ["", ""], ["", ""])
    assert not isinstance(err.value, PermanentError) and calls == [2, 1, 1]  # each sample alone passed
