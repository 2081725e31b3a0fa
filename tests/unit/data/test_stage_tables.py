"""Unit tests for hybrid_core.data.stage_tables: stage schemas, table builders and the step's metrics row."""

import json
import math

import numpy as np
import pyarrow as pa
import pytest

from hybrid_core.data.rollout_store import table_hash
from hybrid_core.data.stage_tables import (ADVANTAGE_SCHEMA, METRIC_COLUMNS, REWARD_SCHEMA, ROLLOUT_SCHEMA,
                                           advantage_table, metrics_table, ragged_column, reward_table, rollout_table,
                                           sample_keys, step_metrics)

KEYS = [(0, 0), (0, 1), (3, 0), (3, 1)]


def _rollout_row(prompt_index: int, sample_index: int, response_ids: list[int]) -> dict:
    return {"prompt_index": prompt_index, "sample_index": sample_index, "prompt_ids": [1, 2],
            "response_ids": response_ids, "prompt_text": "ab", "response_text": "x" * len(response_ids),
            "rollout_logprobs": [-0.5] * len(response_ids), "finish_reason": "stop", "label": "l",
            "policy_version": 2, "data_source": "data/a.jsonl"}


def _rollout(lengths: list[int]) -> pa.Table:
    return rollout_table([_rollout_row(p, s, list(range(n))) for (p, s), n in zip(KEYS, lengths)])


def _advantage(advantages: list[list[float]]) -> pa.Table:
    zeros = [[0.0] * len(a) for a in advantages]
    return advantage_table(KEYS[:len(advantages)], {"old_logprobs": zeros, "ref_logprobs": zeros,
                                                    "values": zeros, "advantages": advantages, "returns": zeros})


def test_schemas():
    assert ROLLOUT_SCHEMA.names == ["prompt_index", "sample_index", "prompt_ids", "response_ids", "prompt_text",
                                    "response_text", "rollout_logprobs", "finish_reason", "label", "policy_version",
                                    "data_source"]
    assert REWARD_SCHEMA.names == ["prompt_index", "sample_index", "reward", "score", "extra_logs"]
    assert ADVANTAGE_SCHEMA.names == ["prompt_index", "sample_index", "old_logprobs", "ref_logprobs", "values",
                                      "advantages", "returns"]
    assert ROLLOUT_SCHEMA.field("response_ids").type == pa.list_(pa.int32())
    assert ROLLOUT_SCHEMA.field("rollout_logprobs").type == pa.list_(pa.float32())
    assert ROLLOUT_SCHEMA.field("data_source").type == pa.string()
    assert REWARD_SCHEMA.field("reward").type == pa.float32()
    assert ADVANTAGE_SCHEMA.field("advantages").type == pa.list_(pa.float32())


def test_rollout_table_follows_the_schema():
    table = _rollout([2, 0, 1, 3])
    assert table.schema == ROLLOUT_SCHEMA and table.num_rows == 4
    assert table.column("response_ids").to_pylist() == [[0, 1], [], [0], [0, 1, 2]]
    with pytest.raises((KeyError, pa.ArrowInvalid, pa.ArrowTypeError)):
        rollout_table([{"prompt_index": 0, "response_ids": ["not an int"]}])


def test_reward_table_and_extra_logs_json():
    extra = [{"z": 1.0, "a": 2}, {}, {"np": np.float32(0.5)}, {"flag": True}]
    table = reward_table(KEYS, [1.0, 0.0, 0.5, 0.25], [2.0, 0.0, 0.5, 0.25], extra)
    assert table.schema == REWARD_SCHEMA
    assert table.column("reward").to_pylist() == [1.0, 0.0, 0.5, 0.25]
    assert table.column("score").to_pylist() == [2.0, 0.0, 0.5, 0.25]
    # keys sorted; numpy scalars fall back to float()
    assert table.column("extra_logs").to_pylist() == ['{"a": 2, "z": 1.0}', "{}", '{"np": 0.5}', '{"flag": true}']
    assert [json.loads(s) for s in table.column("extra_logs").to_pylist()][0] == {"a": 2, "z": 1.0}
    assert sample_keys(table) == KEYS


def test_ragged_column_equals_converting_each_row_to_python_floats():
    """The advantage stage's columns built from the padded arrays: the same list<float32> column, bit for bit, as
    the lists of Python floats it replaced (float64 rounded to float32 as Arrow rounds a Python float)."""
    rng = np.random.default_rng(3)
    lengths = [0, 5, 1, 5, 3]
    for dtype in (np.float32, np.float64):
        padded = (rng.standard_normal((5, 5)) * 1e3).astype(dtype)
        padded[1, 2] = 1 / 3
        expected = pa.array([padded[i, :n].tolist() for i, n in enumerate(lengths)], type=pa.list_(pa.float32()))
        got = ragged_column(padded, lengths)
        assert got.type == expected.type and got.equals(expected), (got, expected)
    table = advantage_table(KEYS[:2], {name: ragged_column(np.ones((2, 3), np.float32), [3, 1])
                                       for name in ADVANTAGE_SCHEMA.names[2:]})
    assert table.column("advantages").to_pylist() == [[1.0, 1.0, 1.0], [1.0]]


def test_advantage_table_columns_and_keys():
    table = _advantage([[1.0, -1.0], [0.5], [], [2.5]])
    assert table.schema == ADVANTAGE_SCHEMA
    assert table.column("advantages").to_pylist() == [[1.0, -1.0], [0.5], [], [2.5]]
    assert sample_keys(table) == KEYS


def test_step_metrics_by_hand():
    rollout = _rollout([2, 4, 3, 3])  # 12 tokens, mean length 3
    reward = reward_table(KEYS, [1.0, 0.0, 0.5, 0.5], [0.0] * 4, [{}] * 4)
    advantage = _advantage([[1.0, -1.0], [0.5], [], [2.5]])
    train = {"experience_kl": 0.25, "policy_loss": -0.5, "clip_ratio": 0.125, "grad_norm": 3.0, "lr": 1e-6,
             "kl_loss": 0.0625, "approx_kl": 0.01, "dual_clip_ratio": 0.0, "not_reported": 9.0}
    timings = {"rollout": 4.0, "reward": 0.5, "train": 2}
    m = step_metrics(rollout, reward, advantage, train, timings)
    expected = {
        # rewards 1, 0, .5, .5: mean .5; deviations .5, −.5, 0, 0 → population var .5/4 = .125, std 0.3535533906
        "reward/mean": 0.5, "reward/std": 0.3535533906,
        # advantage tokens 1, −1, .5, 2.5: mean .75; deviations .25, −1.75, −.25, 1.75 → squares sum 6.25,
        # var 6.25/4 = 1.5625, std 1.25
        "advantage/mean": 0.75, "advantage/std": 1.25,
        "actor/kl": 0.25, "actor/policy_loss": -0.5, "actor/clip_ratio": 0.125,
        "rollout/response_length_mean": 3.0, "rollout/tokens_per_s": 3.0,  # 12 tokens / 4 s
        "actor/kl_loss": 0.0625, "actor/approx_kl": 0.01, "actor/grad_norm": 3.0, "actor/lr": 1e-6,
        "actor/dual_clip_ratio": 0.0,
        "timing_s/rollout": 4.0, "timing_s/reward": 0.5, "timing_s/train": 2.0,
    }
    assert set(m) == set(expected)  # "not_reported" is not a metric
    for key, value in expected.items():
        assert math.isclose(m[key], value, rel_tol=0, abs_tol=1e-6), (key, m[key], value)
    assert type(m["timing_s/train"]) is float


def test_the_row_needs_only_its_columns_and_matches_exact_statistics():
    """The actor reads only METRIC_COLUMNS of the committed tables; the float64 moments agree with Python's exactly
    rounded `statistics` within 1e-12 on a step-sized sample."""
    import statistics

    rng = np.random.default_rng(7)
    advantages = [rng.standard_normal(n).astype(np.float32).tolist() for n in (300, 1, 0, 777)]
    rewards = rng.random(4).astype(np.float32).tolist()
    tables = {"rollout": _rollout([300, 1, 0, 777]), "reward": reward_table(KEYS, rewards, rewards, [{}] * 4),
              "advantage": _advantage(advantages)}
    full = step_metrics(tables["rollout"], tables["reward"], tables["advantage"], {}, {"rollout": 2.0})
    narrow = step_metrics(*(tables[s].select(METRIC_COLUMNS[s]) for s in ("rollout", "reward", "advantage")), {},
                          {"rollout": 2.0})
    assert narrow == full
    tokens = [a for row in advantages for a in row]
    assert math.isclose(full["advantage/mean"], statistics.fmean(tokens), rel_tol=1e-12)
    assert math.isclose(full["advantage/std"], statistics.pstdev(tokens), rel_tol=1e-12)
    assert math.isclose(full["reward/std"], statistics.pstdev(rewards), rel_tol=1e-12)
    assert full["rollout/response_length_mean"] == 1078 / 4 and full["rollout/tokens_per_s"] == 1078 / 2.0


def test_step_metrics_defaults():
    m = step_metrics(_rollout([5]), reward_table(KEYS[:1], [0.75], [0.75], [{}]), _advantage([[]]), {}, {})
    # one reward: std 0; no advantage tokens: 0, 0; no rollout timing: 0 tokens/s; missing train stats: 0
    assert m == {"reward/mean": 0.75, "reward/std": 0.0, "advantage/mean": 0.0, "advantage/std": 0.0,
                 "actor/kl": 0.0, "actor/policy_loss": 0.0, "actor/clip_ratio": 0.0,
                 "rollout/response_length_mean": 5.0, "rollout/tokens_per_s": 0.0}


def test_step_metrics_of_empty_tables():
    m = step_metrics(_rollout([]), reward_table([], [], [], []), _advantage([]), {}, {"rollout": 0.0})
    assert m["reward/mean"] == m["reward/std"] == m["rollout/response_length_mean"] == 0.0
    assert m["rollout/tokens_per_s"] == 0.0 and m["timing_s/rollout"] == 0.0


def test_metrics_table_puts_the_step_first():
    table = metrics_table(7, {"reward/mean": 0.5, "timing_s/train": 2.0})
    assert table.column_names == ["step", "reward/mean", "timing_s/train"]
    assert table.to_pylist() == [{"step": 7, "reward/mean": 0.5, "timing_s/train": 2.0}]


def test_metrics_table_bytes_do_not_depend_on_the_figures_order():
    listed = {"timing_s/train": 2.0, "actor/kl": 0.25, "reward/mean": 0.5}
    relisted = {"reward/mean": 0.5, "timing_s/train": 2.0, "actor/kl": 0.25}
    table, again = metrics_table(3, listed), metrics_table(3, relisted)
    assert table.column_names == ["step", "actor/kl", "reward/mean", "timing_s/train"]
    assert table.equals(again) and table_hash(table) == table_hash(again)
