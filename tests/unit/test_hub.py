"""Unit tests for hybrid_core.data.hub: hub ids told from local paths, and a hub model under HF_HUB_OFFLINE checked against
a real huggingface_hub cache layout written here (no network)."""
from __future__ import annotations

import time

import pytest

from hybrid_core.data.hub import (dataset_hub_problems, dataset_in_cache, hub_dataset_error, hub_offline, is_hub_name,
                             model_hub_problems, model_in_cache)


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


class HubStandIn:
    """A loopback HTTP server answering every request with `status` and the hub's error header: the hub's own
    answer to a dataset that does not exist, without the network."""

    def __init__(self, status: int, error_code: str):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Answer(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(status)
                self.send_header("X-Error-Code", error_code)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"error": "Repository not found"}')

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def online(hub_cache, tmp_path, monkeypatch):
    """Online, with empty hub and datasets caches of the test's own."""
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))


def _endpoint(monkeypatch, url: str) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", url)


def test_a_hub_dataset_offline_must_be_in_either_cache(online, hub_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (problem,) = dataset_hub_problems("data.prompt_dataset", "acme/math")
    assert problem == ("data.prompt_dataset 'acme/math' is a Hugging Face hub dataset that is not in the local cache, "
                       "and HF_HUB_OFFLINE=1 forbids downloading it: give a local path (a JSONL/Parquet file or a "
                       "save_to_disk folder), or download it where the hub can be reached (`hf download --repo-type "
                       "dataset acme/math`) and run with HF_HUB_OFFLINE=1")
    (hub_cache / "datasets--acme--math").mkdir(parents=True)  # the hub's layout for a downloaded dataset
    assert dataset_in_cache("acme/math") and dataset_hub_problems("data.prompt_dataset", "acme/math") == []
    (tmp_path / "datasets" / "acme___eval").mkdir(parents=True)  # `datasets`' prepared Arrow files
    assert dataset_in_cache("acme/eval") and dataset_hub_problems("eval.dataset", "acme/eval") == []
    assert dataset_hub_problems("eval.dataset", "data/missing.jsonl") == []  # a local path: checked elsewhere


def test_an_unreachable_hub_is_found_at_once(online, monkeypatch):
    from tests.unit.rewards.reward_servers import dead_url

    _endpoint(monkeypatch, dead_url().removesuffix("/get_reward"))  # connections refused
    started = time.perf_counter()
    (problem,) = dataset_hub_problems("eval.dataset", "acme/math")
    assert time.perf_counter() - started < 5
    assert problem.startswith("eval.dataset 'acme/math' is a Hugging Face hub dataset that is not in the local cache, "
                              "and the hub cannot be reached (ConnectError: "), problem


def test_a_dataset_the_hub_does_not_have_is_named(online, monkeypatch):
    hub = HubStandIn(404, "RepoNotFound")
    try:
        _endpoint(monkeypatch, hub.url)
        assert hub_dataset_error("acme/nothing") == "the hub has no such dataset (or it is private and no token is set)"
        gated = HubStandIn(401, "GatedRepo")
        _endpoint(monkeypatch, gated.url)
        assert hub_dataset_error("acme/gated") is None  # it exists: the loader reads it with the user's token
        gated.close()
    finally:
        hub.close()
