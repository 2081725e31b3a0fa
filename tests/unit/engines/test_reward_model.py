"""Unit tests for hybrid_core.engines.reward_model: rewards at the last token equal transformers' own sequence
classifier run on each sample alone, in both layouts and whatever the padding; normalisation with the config's
mean/std; the value head found by name (the config's prefix first) or a clear error."""

import json
import runpy
import shutil
from pathlib import Path

import pytest
import torch

from hybrid_core.engines.reward_model import RewardModel, RewardModelSettings, head_prefix_of, read_head_weight
from hybrid_core.engines.sequence_batch import MicroBatching

REPO_ROOT = Path(__file__).resolve().parents[3]
# lengths 3+4, 1+6, 5+0 (no response: the prompt's last token), 2+2; no id 0 (the pad), so transformers' own
# pooling (the last token that is not the pad id) finds the last token of each unpadded row
PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [40, 41]]
RESPONSES = [[20, 21, 22, 2], [30, 31, 32, 33, 34, 2], [], [50, 51]]


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rm") / "tiny-qwen3-rm"
    runpy.run_path(str(REPO_ROOT / "data" / "build_tiny_model.py"))["build_reward_model"](out)
    return out


def settings(path: Path, **changes) -> RewardModelSettings:
    fields = dict(model_path=str(path), param_dtype="fp32", value_head_prefix="score", is_normalized=False,
                  is_offloaded=False, batching=MicroBatching(num_samples=2))
    return RewardModelSettings(**(fields | changes))


@pytest.fixture(scope="module")
def expected(reward_dir) -> list[float]:
    """transformers' Qwen3ForSequenceClassification on each sample alone (batch of one, no padding)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(reward_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(input_ids=torch.tensor([p + r])).logits[0, 0].item() for p, r in zip(PROMPTS, RESPONSES)]


@pytest.mark.parametrize("batching", [MicroBatching(num_samples=2), MicroBatching(num_samples=4),
                                      MicroBatching(num_samples=4, is_packed=True),
                                      MicroBatching(num_samples=1, max_tokens=12)])
def test_rewards_equal_transformers_sequence_classifier(reward_dir, expected, batching):
    scores = RewardModel(settings(reward_dir, batching=batching)).score(PROMPTS, RESPONSES)
    torch.testing.assert_close([s.raw for s in scores], expected, rtol=0, atol=1e-6)
    assert [s.reward for s in scores] == [s.raw for s in scores]  # no normalisation by default
    assert len(set(round(x, 4) for x in expected)) == 4  # the samples do get different rewards


def test_left_padding_gives_the_same_rewards(reward_dir, expected):
    """One left-padded batch through transformers (its mask, its pooling) matches the right-padded engine."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(reward_dir, dtype=torch.float32).eval()
    rows = [p + r for p, r in zip(PROMPTS, RESPONSES)]
    L = max(len(row) for row in rows)
    input_ids = torch.tensor([[0] * (L - len(row)) + row for row in rows])
    attention_mask = (input_ids != 0).long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[:, 0]
    torch.testing.assert_close(logits.tolist(), expected, rtol=0, atol=1e-6)


def test_normalisation_uses_the_config_mean_and_std(reward_dir, expected):
    config = json.loads((reward_dir / "config.json").read_text())
    assert (config["mean"], config["std"]) == (0.05, 0.2)
    scores = RewardModel(settings(reward_dir, is_normalized=True)).score(PROMPTS, RESPONSES)
    torch.testing.assert_close([s.raw for s in scores], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close([s.reward for s in scores], [(x - 0.05) / 0.2 for x in expected], rtol=0, atol=5e-6)


def test_offloaded_weights_stay_in_host_memory(reward_dir, expected):
    model = RewardModel(settings(reward_dir, is_offloaded=True))
    torch.testing.assert_close([s.raw for s in model.score(PROMPTS, RESPONSES)], expected, rtol=0, atol=1e-6)
    assert next(model.model.parameters()).device.type == "cpu"


def test_without_statistics_normalising_changes_nothing(reward_dir, tmp_path, expected):
    plain = tmp_path / "plain"
    shutil.copytree(reward_dir, plain)
    config = json.loads((plain / "config.json").read_text())
    (plain / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in ("mean", "std")}))
    scores = RewardModel(settings(plain, is_normalized=True)).score(PROMPTS[:1], RESPONSES[:1])
    torch.testing.assert_close([scores[0].reward], expected[:1], rtol=0, atol=1e-6)


def test_the_config_names_the_head_before_the_flag(reward_dir, tmp_path):
    assert head_prefix_of(str(reward_dir), "value_head") == "score"  # OpenRLHF: getattr(config, "value_head_prefix")
    renamed = tmp_path / "renamed"
    shutil.copytree(reward_dir, renamed)
    config = json.loads((renamed / "config.json").read_text())
    (renamed / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "value_head_prefix"}))
    assert head_prefix_of(str(renamed), "value_head") == "value_head"
    with pytest.raises(ValueError, match=r"holds no value head 'value_head.weight' \(ds.value_head_prefix "
                                         r"'value_head'\); pass --ds.value_head_prefix"):
        read_head_weight(str(renamed), "value_head")
    assert read_head_weight(str(renamed), "score").shape == (1, 128)
