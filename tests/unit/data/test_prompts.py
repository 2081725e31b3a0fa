"""Unit tests for hybrid_core.data.prompts: loading local prompt files, templating and the step sampler (every other
kind of source, mixes and the hub: test_prompt_sources.py)."""

import hashlib
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybrid_core.data.prompts import Prompt, PromptSampler, format_prompt, load_prompt_rows

TINY_MODEL = Path(__file__).resolve().parents[3] / "data" / "tiny-qwen3"
RECORDS = [{"question": "ab", "answer": "x"}, {"question": "cd", "answer": 7}, {"question": "ef", "answer": None}]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_MODEL)


@pytest.fixture(autouse=True)
def private_datasets_cache(tmp_path, monkeypatch):
    """Keep `datasets`' Arrow cache inside the test's folder instead of ~/.cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


@pytest.fixture(params=["jsonl", "parquet"])
def prompt_file(request, tmp_path):
    path = tmp_path / f"prompts.{request.param}"
    if request.param == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    else:
        # one type a column in Parquet: labels as strings, the last one null
        pq.write_table(pa.table({"question": ["ab", "cd", "ef"], "answer": ["x", "7", None]}), path)
    return str(path)


def test_load_rows_returns_input_label_pairs(prompt_file):
    # a label of 7 becomes "7"; a null label becomes ""
    rows = load_prompt_rows(prompt_file, "question", "answer")
    assert rows == [("ab", "x", prompt_file), ("cd", "7", prompt_file), ("ef", "", prompt_file)]
    assert rows[1].text == "cd" and rows[1].label == "7" and rows[1].source == prompt_file


def test_load_rows_without_label_key_gives_empty_labels(prompt_file):
    assert [row[:2] for row in load_prompt_rows(prompt_file, "question", None)] == [("ab", ""), ("cd", ""), ("ef", "")]


def test_max_samples_keeps_the_first_rows(prompt_file):
    assert [r[:2] for r in load_prompt_rows(prompt_file, "question", "answer", max_samples=2)] == [("ab", "x"),
                                                                                                  ("cd", "7")]
    assert len(load_prompt_rows(prompt_file, "question", "answer", max_samples=10)) == 3  # capped at the data


def test_missing_input_key_names_the_flag_and_the_columns(prompt_file):
    with pytest.raises(ValueError, match=r"data\.input_key 'prompt' is not a column") as err:
        load_prompt_rows(prompt_file, "prompt", "answer")
    assert "['question', 'answer']" in str(err.value)


def test_missing_label_key_names_the_flag(prompt_file):
    with pytest.raises(ValueError, match=r"data\.label_key 'label' is not a column"):
        load_prompt_rows(prompt_file, "question", "label")


def test_missing_local_file_fails_naming_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data\.prompt_dataset '.*absent\.jsonl' does not exist"):
        load_prompt_rows(str(tmp_path / "absent.jsonl"), "question", None)
    with pytest.raises(FileNotFoundError, match=r"does not exist and is not a hub dataset name"):
        load_prompt_rows(str(tmp_path / "no" / "such" / "folder"), "question", None)


def _rows(n: int) -> list[tuple[str, str]]:
    return [(f"q{i}", f"a{i}") for i in range(n)]


@pytest.mark.parametrize("rows, batch, episodes, max_steps, expected", [
    (10, 3, 2, None, 6),  # 2 × floor(10/3) = 2 × 3
    (10, 3, 2, 4, 4),     # capped by max_steps
    (10, 3, 2, 50, 6),    # a cap above the total changes nothing
    (9, 3, 1, None, 3),   # 1 × 9/3
    (5, 5, 3, None, 3),   # one step an episode
])
def test_num_steps(rows, batch, episodes, max_steps, expected):
    sampler = PromptSampler(_rows(rows), batch, episodes, seed=0, max_steps=max_steps)
    assert sampler.num_steps == expected


def test_for_step_is_deterministic_and_returns_prompts():
    a = PromptSampler(_rows(10), 3, 2, seed=5)
    b = PromptSampler(_rows(10), 3, 2, seed=5)
    for step in range(1, 7):
        assert a.for_step(step) == b.for_step(step)
        assert all(p == Prompt(p.index, f"q{p.index}", f"a{p.index}") for p in a.for_step(step))
        assert len(a.for_step(step)) == 3


def test_each_episode_covers_distinct_prompts():
    sampler = PromptSampler(_rows(10), 3, 3, seed=1)  # 3 steps an episode, 9 of the 10 rows used
    for episode in range(3):
        steps = range(3 * episode + 1, 3 * episode + 4)
        indices = [p.index for s in steps for p in sampler.for_step(s)]
        assert len(set(indices)) == 9 and set(indices) <= set(range(10))


def test_episodes_and_seeds_reshuffle():
    sampler = PromptSampler(_rows(20), 20, 2, seed=0)  # one step an episode: the whole permutation
    first, second = ([p.index for p in sampler.for_step(s)] for s in (1, 2))
    assert sorted(first) == sorted(second) == list(range(20))
    assert first != second  # episode 2 has its own shuffle (a 1 / 20! chance of equality)
    # episode e of seed s is shuffled by Random(derive_seed(s, "episode", e)): computed here independently
    expected = list(range(20))
    digest = hashlib.sha256(b"0/episode/1").digest()
    random.Random(int.from_bytes(digest[:4], "little") & 0x7FFFFFFF).shuffle(expected)
    assert second == expected
    other = [p.index for p in PromptSampler(_rows(20), 20, 2, seed=1).for_step(1)]
    assert other != second  # seeds no longer alias episodes (seed + e did: seed 1 episode 0 = seed 0 episode 1)


@pytest.mark.parametrize("step", [0, 7, -1])
def test_out_of_range_step_fails(step):
    sampler = PromptSampler(_rows(10), 3, 2, seed=0)  # 6 steps
    with pytest.raises(ValueError, match=rf"step must be in 1\.\.6: got {step}"):
        sampler.for_step(step)


def test_batch_bigger_than_the_data_fails():
    with pytest.raises(ValueError, match=r"rollout\.batch_size exceeds the prompt dataset: got 4 .* and 3 rows"):
        PromptSampler(_rows(3), 4, 1, seed=0)


def test_format_prompt_plain_and_template(tokenizer):
    assert format_prompt("hi", tokenizer, False, None) == "hi"
    assert format_prompt("hi", tokenizer, False, "Q: {}\nA:") == "Q: hi\nA:"


def test_format_prompt_with_the_chat_template(tokenizer):
    # data/build_tiny_model.py: <|im_start|>{role}\n{content}<|im_end|>\n, then the generation header
    expected = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert format_prompt("hi", tokenizer, True, None) == expected
    assert format_prompt("hi", tokenizer, True, "ignored {}") == expected  # the chat template takes precedence
