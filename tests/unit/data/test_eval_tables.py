"""The eval stage's rows and figures: pass@1, pass@k, response length and truncation per data source, computed here
by hand from a small table, and the eval rules of the configuration."""
import json

import pytest
from pydantic import ValidationError

from hybrid_core.config import RunConfig
from hybrid_core.data.eval_tables import (EVAL_SCHEMA, eval_figures, eval_metric_keys, eval_only_row, eval_table,
                                         metric_key_name, source_name)
from hybrid_core.data.stage_tables import reward_table, rollout_table


def _samples(groups: list[tuple[str, int, list[tuple[float, int, str]]]]):
    """Rollout rows and their rewards: (source, prompt index, [(reward, response length, finish reason), …])."""
    rows, keys, rewards = [], [], []
    for source, prompt, samples in groups:
        for j, (reward, length, finish) in enumerate(samples):
            rows.append({"prompt_index": prompt, "sample_index": j, "prompt_ids": [1], "response_ids": [7] * length,
                         "prompt_text": f"p{prompt}", "response_text": "r" * length, "rollout_logprobs": [0.0] * length,
                         "finish_reason": finish, "label": "x", "policy_version": 3,
                         "data_source": f"data/{source}.jsonl"})
            keys.append((prompt, j))
            rewards.append(reward)
    rollout = rollout_table(rows)
    return eval_table(rollout, reward_table(keys, rewards, rewards, [{"ok": 1}] * len(keys)))


def test_pass_at_1_and_pass_at_k_per_data_source():
    table = _samples([
        ("math", 0, [(1.0, 4, "stop"), (0.0, 6, "length"), (0.0, 2, "stop")]),
        ("math", 1, [(0.0, 3, "stop"), (0.0, 3, "stop"), (0.0, 3, "length")]),
        ("gsm", 5, [(0.5, 1, "stop"), (1.0, 2, "stop"), (0.25, 3, "stop")]),
    ])
    figures = eval_figures(table, k=3)
    assert figures == {
        "eval/num_samples": 9.0,
        "eval/gsm_pass1": (0.5 + 1.0 + 0.25) / 3, "eval/gsm_pass3": 1.0,
        "eval/gsm_response_length": 2.0, "eval/gsm_truncated": 0.0,
        "eval/math_pass1": 1 / 6, "eval/math_pass3": (1.0 + 0.0) / 2,
        "eval/math_response_length": (4 + 6 + 2 + 3 * 3) / 6, "eval/math_truncated": 2 / 6,
    }
    assert table.schema == EVAL_SCHEMA
    assert table.column("data_source").to_pylist() == ["math"] * 6 + ["gsm"] * 3
    assert json.loads(table.column("extra_logs")[0].as_py()) == {"ok": 1}
    assert table.column("policy_version").to_pylist() == [3] * 9


def test_one_sample_a_prompt_reports_pass1_only():
    figures = eval_figures(_samples([("d", 0, [(1.0, 2, "stop")]), ("d", 1, [(0.0, 2, "stop")])]), k=1)
    assert sorted(figures) == ["eval/d_pass1", "eval/d_response_length", "eval/d_truncated", "eval/num_samples"]
    assert figures["eval/d_pass1"] == 0.5


@pytest.mark.parametrize("k", [1, 3])
def test_the_keys_known_before_the_run_are_those_the_evaluation_gives(k):
    """The preflight checks ckpt.best_metric_key against eval_metric_keys: they must be eval_figures' keys."""
    table = _samples([("math", 0, [(1.0, 2, "stop")] * k), ("gsm", 1, [(0.0, 2, "stop")] * k)])
    assert eval_metric_keys(["data/math.jsonl", "data/gsm.jsonl"], k) == sorted(eval_figures(table, k))
    assert len(eval_metric_keys(["data/math.jsonl", "data/gsm.jsonl"], k)) == (7 if k == 1 else 9)


def test_openrlhfs_spelling_of_a_metric_key_names_the_row_key():
    assert metric_key_name("eval_math_pass1") == "eval/math_pass1"
    assert metric_key_name("eval/math_pass1") == "eval/math_pass1"


@pytest.mark.parametrize("dataset, name", [("data/math_prompts.jsonl", "math_prompts"), ("/x/aime 2024.parquet",
                         "aime_2024"), ("zhuzilin/dapo-math-17k", "dapo-math-17k"), ("runs/evalset/", "evalset")])
def test_data_source_names_in_metric_keys(dataset, name):
    assert source_name(dataset) == name


def test_the_step_0_row_holds_the_evaluation_only():
    entries = {"eval": {"seconds": 2.5, "metrics": {"eval/d_pass1": 0.25, "timing_s/dispatch_eval": 0.01,
                                                     "rows": 8}}}
    assert eval_only_row(entries) == {"timing_s/eval": 2.5, "eval/d_pass1": 0.25, "timing_s/dispatch_eval": 0.01}


def _problems(**blocks) -> str:
    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate(blocks)
    return str(info.value)


def test_eval_rules_name_the_flags_and_the_fix():
    assert "eval.steps 2 / eval.at_start False need eval.dataset" in _problems(eval={"steps": 2})
    assert "eval.dataset 'e.jsonl' is never evaluated" in _problems(eval={"dataset": "e.jsonl"},
                                                                      reward={"remote_url": "r.py"})
    assert "needs reward.remote_url" in _problems(eval={"dataset": "e.jsonl", "steps": 1})
    assert "ckpt.best_metric_key 'eval/d_pass1' needs evaluations during training" in _problems(
        ckpt={"best_metric_key": "eval/d_pass1"})
    assert "must name an eval metric" in _problems(ckpt={"best_metric_key": "reward/mean"},
                                                   eval={"dataset": "e.jsonl", "steps": 1},
                                                   reward={"remote_url": "r.py"})
    ok = RunConfig.model_validate({"eval": {"dataset": "e.jsonl", "at_start": True}, "reward": {"remote_url": "r.py"}})
    assert ok.eval.at_start and ok.eval.steps == -1
