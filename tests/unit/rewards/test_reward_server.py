"""`hybrid serve-reward`: a reward file served on a real uvicorn server on loopback and asked by the client — the
demo's reward file, files that answer badly or raise, malformed requests, concurrency, and the command line."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from reward_servers import LETTERS_REWARD, AppInThread, start_serve_reward, stop

from hybrid_core.rewards.remote_http import RemoteRewardClient
from hybrid_core.rewards.reward_func import RewardFunctionError, load_reward_func, score_samples
from tests.conftest import REPO_ROOT

HEADER = "<|im_start|>assistant\n"
LABELS = ["abc", "xyz", "a", "bcd", "q", "hello", "ab", "z"]
QUERIES = [f"prompt {i}{HEADER}{'abcxyzhelo'[i:] * 2}<|im_end|>" for i in range(len(LABELS))]
PROMPTS = [f"prompt {i}" for i in range(len(LABELS))]


def client(url: str, **kwargs) -> RemoteRewardClient:
    return RemoteRewardClient(urls=url, **(dict(timeout_s=10.0, max_retries=0, batch_size=3, backoff_base_s=0.01)
                                           | kwargs))


def post(url: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def reward_file(tmp_path, name: str, body: str):
    path = tmp_path / f"{name}.py"
    path.write_text(f"import math, time\n\n\ndef reward_func(queries, prompts, labels, **kwargs):\n    {body}\n")
    return path


def test_the_cli_serves_the_demo_reward_file_and_the_client_gets_what_the_file_says():
    """A real `hybrid serve-reward` subprocess: the URL printed, /health, and the rewards, scores and extra logs of
    the file called directly (tensors sent as lists)."""
    proc, url = start_serve_reward(LETTERS_REWARD)
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/get_reward")
        with urllib.request.urlopen(url.replace("/get_reward", "/health"), timeout=10) as response:
            assert response.status == 200 and json.loads(response.read())["status"] == "ok"
        served = client(url).score(QUERIES, PROMPTS, LABELS)
    finally:
        stop(proc)
    direct = score_samples(load_reward_func(str(LETTERS_REWARD)), "file", QUERIES, PROMPTS, LABELS)
    assert served == direct
    assert served.rewards[:3] == [6 / 16, 6 / 16, 0.0]  # "abcxyzhelo"[i:] * 2 against the label's letters


def test_batches_are_answered_concurrently(tmp_path):
    """8 batches to a server whose function sleeps 0.5 s a call: concurrently, well under 8 × 0.5 s."""
    sleepy = reward_file(tmp_path, "sleepy", "time.sleep(0.5)\n    return {'rewards': [len(q) for q in queries]}")
    with AppInThread(sleepy) as server:
        start = time.perf_counter()
        rewards = client(server.url, batch_size=1).score(QUERIES, PROMPTS, LABELS).rewards
        seconds = time.perf_counter() - start
    print(f"8 batches of a 0.5 s reward function: {seconds:.2f} s")
    assert rewards == [float(len(q)) for q in QUERIES]
    assert 0.5 <= seconds < 1.5


BAD_FILES = {
    "wrong length": ("return {'rewards': [1.0]}", RewardFunctionError, r"returned 1 rewards for 3 samples"),
    "NaN": ("return {'rewards': [1.0, math.nan, 0.0][:len(queries)]}", RewardFunctionError,
            r"returned a non-finite reward nan for sample #1"),
    "raising": ("return {'rewards': [1 / 0 for q in queries]}", RuntimeError,
                r"failed 2 times \(reward.max_retries=1.*HTTP 500 Internal Server Error: reward_func of .*raising\.py "
                r"raised ZeroDivisionError: division by zero"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_reward_file_is_a_clear_error_naming_the_server_and_the_batch(tmp_path, case):
    body, error, problem = BAD_FILES[case]
    path = reward_file(tmp_path, case.replace(" ", "_").lower(), body)
    with AppInThread(path) as server:
        with pytest.raises(error, match=problem) as err:
            client(server.url, max_retries=1).score(QUERIES[:5], PROMPTS[:5], LABELS[:5])
    assert server.url in str(err.value) and "the batch of samples 0-2 (of 5)" in str(err.value)


def test_malformed_requests_are_answered_400_with_the_reason():
    with AppInThread(LETTERS_REWARD) as server:
        answers = [post(server.url, body) for body in (
            b"not json", b"[1, 2]", json.dumps({"query": ["a"]}).encode(),
            json.dumps({"query": "a", "prompts": [], "labels": []}).encode(),
            json.dumps({"query": ["a", "b"], "prompts": ["p"], "labels": ["x", "y"]}).encode(),
            json.dumps({"query": [1], "prompts": ["p"], "labels": ["x"]}).encode())]
        good = post(server.url, json.dumps({"query": ["a"], "prompts": ["p"], "labels": ["a"]}).encode())
    assert [status for status, _ in answers] == [400] * 6
    assert answers[0][1].startswith("the body is not JSON: ")
    assert answers[1][1] == ("the body must be a JSON object with 'query', 'prompts' and 'labels': got list")
    assert answers[2][1] == "the body lacks 'prompts', 'labels'; send 'query', 'prompts' and 'labels' lists"
    assert answers[3][1] == "'query' must be a list: got str"
    assert answers[4][1] == ("'query', 'prompts' and 'labels' must have one entry per sample: got lengths "
                             "{'query': 2, 'prompts': 1, 'labels': 2}")
    assert answers[5][1] == "'query' must be a list of strings"
    assert good == (200, json.dumps({"rewards": [0.0625], "scores": [0.0625], "extra_logs": {"full_marks": [0.0]}}))


def hybrid(*args: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_cli_refuses_bad_arguments_clearly(tmp_path):
    rc, out = hybrid("serve-reward", "--port", "0")
    assert rc == 2 and out.startswith("usage: hybrid serve-reward --reward-func FILE.py --port P")
    rc, out = hybrid("serve-reward", "--reward-func", str(tmp_path / "missing.py"), "--port", "0")
    assert rc == 2 and f"hybrid serve-reward cannot start: FileNotFoundError: --reward-func " \
                       f"'{tmp_path / 'missing.py'}': no such file" in out
    rc, out = hybrid("serve-reward", "--reward-func", str(LETTERS_REWARD), "--port", "http")
    assert rc == 2 and "--port must be a port number 0-65535: got 'http'" in out
    assert "Traceback" not in out
