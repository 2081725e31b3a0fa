"""Unit tests for hybrid_core.data.prompt_sources with real `datasets` on files written here: every kind of source,
the unreachable hub, mixes by data.prompt_probs (share and order through the run's PromptSampler), the row checks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybrid_core.data.prompt_sources import PromptRow, load_prompt_rows, mix_probabilities
from hybrid_core.data.prompts import PromptSampler
from tests.conftest import REPO_ROOT

QUESTIONS, LABELS = ["q0", "q1", "q2"], ["a0", "a1", "a2"]
EXPECTED = list(zip(QUESTIONS, LABELS))


@pytest.fixture(autouse=True)
def private_datasets_cache(tmp_path, monkeypatch):
    """Keep `datasets`' Arrow cache inside the test's folder instead of ~/.cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def _jsonl(path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _records(questions=QUESTIONS, labels=LABELS) -> list[dict]:
    return [{"question": q, "answer": a} for q, a in zip(questions, labels)]


def _write_source(kind: str, tmp_path) -> str:
    import datasets

    table = pa.table({"question": QUESTIONS, "answer": LABELS})
    if kind == "jsonl":
        return _jsonl(tmp_path / "p.jsonl", _records())
    if kind == "json":  # one JSON array
        (tmp_path / "p.json").write_text(json.dumps(_records()))
        return str(tmp_path / "p.json")
    if kind == "csv":
        (tmp_path / "p.csv").write_text("question,answer\n" + "".join(f"{q},{a}\n" for q, a in EXPECTED))
        return str(tmp_path / "p.csv")
    if kind == "parquet":
        pq.write_table(table, tmp_path / "p.parquet")
        return str(tmp_path / "p.parquet")
    if kind == "arrow":  # an Arrow IPC stream, as datasets writes them
        with pa.ipc.new_stream(str(tmp_path / "p.arrow"), table.schema) as writer:
            writer.write_table(table)
        return str(tmp_path / "p.arrow")
    if kind == "folder":  # a folder of JSONL files, read in name order
        _jsonl(tmp_path / "folder" / "part-0.jsonl", _records(QUESTIONS[:2], LABELS[:2]))
        _jsonl(tmp_path / "folder" / "part-1.jsonl", _records(QUESTIONS[2:], LABELS[2:]))
        return str(tmp_path / "folder")
    ds = datasets.Dataset.from_dict({"question": QUESTIONS, "answer": LABELS})
    if kind == "save_to_disk":
        ds.save_to_disk(str(tmp_path / "saved"))
        return str(tmp_path / "saved")
    other = datasets.Dataset.from_dict({"question": ["t0"], "answer": ["b0"]})
    datasets.DatasetDict({"train": other, "test": ds}).save_to_disk(str(tmp_path / "dict"))  # the split "test"
    return str(tmp_path / "dict")


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet", "arrow", "folder", "save_to_disk",
                                  "dataset_dict"])
def test_every_kind_of_source_loads_its_rows_with_their_source(kind, tmp_path):
    source = _write_source(kind, tmp_path)
    split = "test" if kind == "dataset_dict" else "train"
    rows = load_prompt_rows(source, "question", "answer", split=split)
    assert rows == [PromptRow(q, a, source) for q, a in EXPECTED]


def test_a_dataset_dict_without_the_split_names_its_splits(tmp_path):
    source = _write_source("dataset_dict", tmp_path)
    with pytest.raises(ValueError, match=r"data\.prompt_split 'validation' is not a split of .*\['test', 'train'\]"):
        load_prompt_rows(source, "question", "answer", split="validation")


def test_an_unreachable_hub_fails_fast_naming_the_dataset_and_the_fixes(tmp_path):
    code = ("from hybrid_core.data.prompt_sources import load_prompt_rows\n"
            "load_prompt_rows('some-org/some-dataset', 'question', None)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {"HF_HUB_OFFLINE": "1",
                                                                              "HF_HOME": str(tmp_path / "hf")}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    seconds = time.perf_counter() - started
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("hybrid_core.data.prompt_sources.HubUnreachableError: "), last
    assert "data.prompt_dataset 'some-org/some-dataset' is a Hugging Face hub dataset, but HF_HUB_OFFLINE=1 is set " \
           "and it is not in the local cache" in last
    assert "give a local path instead" in last and seconds < 20  # no network retries


def _mix_files(tmp_path) -> str:
    a = _jsonl(tmp_path / "a.jsonl", [{"question": f"a{i}", "answer": "x"} for i in range(700)])
    b = _jsonl(tmp_path / "b.jsonl", [{"question": f"b{i}", "answer": "y"} for i in range(300)])
    return f"{a},{b}"


def test_a_two_file_mix_at_0_7_0_3_is_kept_by_the_sampler_and_reproducible(tmp_path):
    dataset = _mix_files(tmp_path)
    a, b = dataset.split(",")
    rows = load_prompt_rows(dataset, "question", "answer", probs="0.7,0.3", seed=42)
    assert all(row.text.startswith("a") == (row.source == a) for row in rows)  # each row names its own file
    assert {row.text for row in rows} == {f"a{i}" for i in range(700)} | {f"b{i}" for i in range(300)}
    sampler = PromptSampler(rows, batch_size=50, num_episodes=2, seed=42)
    prompts = [p for step in range(1, sampler.num_steps + 1) for p in sampler.for_step(step)]
    shares = Counter(p.source for p in prompts)
    share_a = shares[a] / len(prompts)
    assert len(prompts) >= 1000 and set(shares) == {a, b}
    assert abs(share_a - 0.7) <= 0.05, (share_a, len(prompts))
    print(f"observed share of {a}: {share_a:.4f} over {len(prompts)} prompts")
    again = load_prompt_rows(dataset, "question", "answer", probs="0.7,0.3", seed=42)
    assert again == rows  # the same seed, the same mix
    other = load_prompt_rows(dataset, "question", "answer", probs="0.7,0.3", seed=43)
    assert [r.text for r in other] != [r.text for r in rows]


def test_without_probs_a_comma_list_is_concatenated_in_order_and_max_samples_caps_after_the_mix(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", _records())
    b = _jsonl(tmp_path / "b.jsonl", _records(["r0", "r1"], ["b0", "b1"]))
    rows = load_prompt_rows(f"{a}, {b}", "question", "answer")
    assert [(r.text, r.source) for r in rows] == [("q0", a), ("q1", a), ("q2", a), ("r0", b), ("r1", b)]
    capped = load_prompt_rows(f"{a},{b}", "question", "answer", max_samples=2)  # each source, then the whole
    assert [(r.text, r.source) for r in capped] == [("q0", a), ("q1", a)]


@pytest.mark.parametrize("probs, problem", [
    ("0.7,0.2,0.1", "data.prompt_probs has 3 values ('0.7,0.2,0.1') but data.prompt_dataset names 2 ('a,b'): give "
                    "one probability per dataset"),
    ("0.7", "data.prompt_probs has 1 values ('0.7') but data.prompt_dataset names 2 ('a,b')"),
    ("1.2,-0.2", "data.prompt_probs must be non-negative and sum to 1: got '1.2,-0.2' (sum 1)"),
    ("0.5,0.4", "data.prompt_probs must be non-negative and sum to 1: got '0.5,0.4' (sum 0.9)"),
    ("0.5,half", "data.prompt_probs must be comma-separated numbers: got '0.5,half'"),
])
def test_bad_prompt_probs_name_both_flags_and_values(probs, problem):
    from pydantic import ValidationError

    from hybrid_core.config import RunConfig

    with pytest.raises(ValueError) as err:
        mix_probabilities(probs, ["a", "b"])
    assert str(err.value).startswith(problem), err.value
    with pytest.raises(ValidationError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        RunConfig.model_validate({"data": {"prompt_dataset": "a,b", "prompt_probs": probs}})  # refused by the plan
    assert mix_probabilities("0.7,0.3", ["a", "b"]) == [0.7, 0.3] and mix_probabilities(None, ["a", "b"]) is None


def test_a_jsonl_row_without_the_input_key_names_the_file_the_line_and_its_keys(tmp_path):
    path = tmp_path / "holes.jsonl"
    lines = [json.dumps({"question": "q0", "answer": "a"}), "", json.dumps({"question": "q1", "answer": "b"}),
             json.dumps({"prompt": "p", "answer": "c"})]  # line 2 is blank: the bad row is line 4
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as err:
        load_prompt_rows(str(path), "question", "answer")
    assert str(err.value).startswith(f"{path} line 4 has no 'question' (data.input_key): its keys are ['answer', "
                                     f"'prompt'] (1 of the 3 rows of '{path}' lack one)"), err.value


def test_a_parquet_row_with_an_empty_input_names_the_row(tmp_path):
    pq.write_table(pa.table({"question": ["q0", " ", "q2"], "answer": ["a", "b", "c"]}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"p\.parquet row 2 has an empty 'question' \(data\.input_key\): its keys "
                                         r"are \['answer', 'question'\]"):
        load_prompt_rows(str(tmp_path / "p.parquet"), "question", "answer")


def test_a_mix_names_the_file_whose_row_is_bad(tmp_path):
    good = _jsonl(tmp_path / "good.jsonl", _records())
    bad = _jsonl(tmp_path / "bad.jsonl", _records() + [{"answer": "z"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl line 4 has no 'question' \(data\.input_key\): its keys are "
                                         r"\['answer'\]"):
        load_prompt_rows(f"{good},{bad}", "question", "answer", probs="0.5,0.5")


def test_an_input_template_without_a_placeholder_is_refused():
    from hybrid_core.data.prompts import format_prompt

    with pytest.raises(ValueError, match=r"data\.input_template must contain '\{\}' where the prompt goes: got "
                                         r"'Question:'"):
        format_prompt("hi", None, False, "Question:")
    assert format_prompt("hi", None, False, "Question: {}\nAnswer:") == "Question: hi\nAnswer:"
