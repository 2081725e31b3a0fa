"""Unit tests for hybrid_core.hub: hub ids told from local paths, and a hub model under HF_HUB_OFFLINE checked against
a real huggingface_hub cache layout written here (no network)."""
from __future__ import annotations

import pytest

from hybrid_core.hub import hub_offline, is_hub_name, model_hub_problems, model_in_cache


@pytest.mark.parametrize("value, expected", [
    ("Qwen/Qwen3-4B", True), ("zhuzilin/dapo-math-17k", True), ("gpt2", True), ("Qwen/Qwen2.5-7B-Instruct", True),
    ("data/no-such-model", False),  # `data` is a folder here: a missing local path, not a hub id
    ("data/no_such.jsonl", False), ("./model", False), ("/abs/model", False), ("~/model", False),
    ("a/b/c", False), ("bad name/x", False), ("", False), (None, False),
    ("data/tiny-qwen3", False),  # exists: local
])
def test_hub_names_are_told_from_local_paths(value, expected, monkeypatch):
    from tests.conftest import REPO_ROOT

    monkeypatch.chdir(REPO_ROOT)
    assert is_hub_name(value) is expected


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty hub cache of the test's own, as huggingface_hub lays it out."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def _cache_model(cache, repo_id: str) -> None:
    commit = "0" * 40
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")


def test_a_hub_model_offline_must_be_in_the_cache(hub_cache, monkeypatch):
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert not hub_offline() and model_hub_problems("actor.model_name_or_path", "acme/llm-7b") == []  # online
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_offline()
    (problem,) = model_hub_problems("actor.model_name_or_path", "acme/llm-7b")
    assert problem == ("actor.model_name_or_path 'acme/llm-7b' is a Hugging Face hub id that is not in the local "
                       "cache, and HF_HUB_OFFLINE=1 forbids downloading it: download it first (`hf download "
                       "acme/llm-7b` where the hub can be reached, into this machine's HF_HOME), unset "
                       "HF_HUB_OFFLINE, or pass --actor.model_name_or_path a local model directory")
    _cache_model(hub_cache, "acme/llm-7b")
    assert model_in_cache("acme/llm-7b") and model_hub_problems("actor.model_name_or_path", "acme/llm-7b") == []
    assert model_hub_problems("critic.model_name_or_path", "acme/other")[0].startswith(
        "critic.model_name_or_path 'acme/other' is a Hugging Face hub id")
