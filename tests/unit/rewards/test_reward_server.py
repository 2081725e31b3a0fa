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

from hybrid_core.rewards.remote_http import RemoteRewardClient, RewardRequestRefused
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


def test_the_cli_answers_a_body_over_its_max_body_mib_413_and_keeps_serving():
    proc, url = start_serve_reward(LETTERS_REWARD, "--max-body-mib", "0.5")
    try:
        over = post(url, json.dumps({"query": ["a" * 2**20], "prompts": ["p"], "labels": ["a"]}).encode())
        wrong = post(url, json.dumps({"query": ["a"], "prompts": ["p"], "labels": [3]}).encode())
        good = post(url, json.dumps({"query": ["a"], "prompts": ["p"], "labels": ["a"]}).encode())
    finally:
        stop(proc)
    assert over[0] == 413 and "over this server's limit of 524288 bytes (--max-body-mib 0.5)" in over[1]
    assert wrong == (400, "'labels' must be a list of strings: entry 0 is int 3; send every entry as a string")
    assert good[0] == 200


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
            json.dumps({"query": [1], "prompts": ["p"], "labels": ["x"]}).encode(),
            json.dumps({"query": ["a", "b"], "prompts": ["p", "q"], "labels": ["x", 7]}).encode(),
            json.dumps({"query": ["a"], "prompts": [None], "labels": ["x"]}).encode(),
            json.dumps({"query": ["a"], "prompts": ["p"], "labels": [{"answer": "x" * 100}]}).encode(),
            b"{\"query\": [\"\x80\"]}")]
        good = post(server.url, json.dumps({"query": ["a"], "prompts": ["p"], "labels": ["a"]}).encode())
    assert [status for status, _ in answers] == [400] * 10
    assert answers[0][1].startswith("the body is not JSON: ")
    assert answers[1][1] == ("the body must be a JSON object with 'query', 'prompts' and 'labels': got list")
    assert answers[2][1] == "the body lacks 'prompts', 'labels'; send 'query', 'prompts' and 'labels' lists"
    assert answers[3][1] == "'query' must be a list: got str"
    assert answers[4][1] == ("'query', 'prompts' and 'labels' must have one entry per sample: got lengths "
                             "{'query': 2, 'prompts': 1, 'labels': 2}")
    fix = "; send every entry as a string"
    assert answers[5][1] == "'query' must be a list of strings: entry 0 is int 1" + fix
    assert answers[6][1] == "'labels' must be a list of strings: entry 1 is int 7" + fix
    assert answers[7][1] == "'prompts' must be a list of strings: entry 0 is NoneType null" + fix
    label = json.dumps({"answer": "x" * 100})[:80]  # the entry is shown cut to 80 characters
    assert answers[8][1] == f"'labels' must be a list of strings: entry 0 is dict {label}" + fix
    assert answers[9][1].startswith("the body is not JSON: 'utf-8' codec can't decode byte 0x80")
    assert good == (200, json.dumps({"rewards": [0.0625], "scores": [0.0625], "extra_logs": {"full_marks": [0.0]}}))


def test_deeply_nested_json_is_answered_400_not_500():
    """The JSON parser recurses once per level; a million levels once escaped as a RecursionError and a bare 500."""
    with AppInThread(LETTERS_REWARD) as server:
        answers = [post(server.url, body) for body in (
            b"[" * 1_000_000, b"[" * 100_000 + b"]" * 100_000,
            b'{"query": ["a"], "prompts": ["p"], "labels": ' + b'{"x": ' * 100_000 + b"1" + b"}" * 100_000 + b"}")]
        nested_but_parsed = post(server.url, json.dumps({"query": [["a"]], "prompts": ["p"], "labels": ["x"]}).encode())
        good = post(server.url, json.dumps({"query": ["a"], "prompts": ["p"], "labels": ["a"]}).encode())
    assert answers == [(400, "the body nests JSON arrays or objects too deeply to parse; send flat lists of "
                             "strings")] * 3
    assert nested_but_parsed == (400, "'query' must be a list of strings: entry 0 is list [\"a\"]; send every entry "
                                      "as a string")
    assert good[0] == 200


def post_chunked(url: str, body: bytes, chunk_bytes: int = 2**16) -> tuple[int, str]:
    """POST `body` with Transfer-Encoding: chunked (no Content-Length), as a streaming client sends it."""
    chunks = (body[i:i + chunk_bytes] for i in range(0, len(body), chunk_bytes))
    request = urllib.request.Request(url, data=chunks, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def body_of(num_bytes: int) -> bytes:
    """A well-formed one-sample request of about `num_bytes` bytes."""
    return json.dumps({"query": ["a" * num_bytes], "prompts": ["p"], "labels": ["a"]}).encode()


def test_a_body_over_the_limit_is_answered_413_by_its_length_or_while_a_chunked_one_is_read():
    mib = 2**20
    with AppInThread(LETTERS_REWARD, max_body_mib=1) as server:
        started = time.perf_counter()
        huge = post(server.url, body_of(108 * mib))  # 108 MB used to be read whole and answered 200
        huge_s = time.perf_counter() - started
        over = post(server.url, body_of(mib))
        chunked_over = post_chunked(server.url, body_of(2 * mib))
        chunked_under = post_chunked(server.url, body_of(mib // 2))
        under = post(server.url, body_of(mib - 100))
        with pytest.raises(RewardRequestRefused) as refused:  # the client does not retry it, and says why
            client(server.url, max_retries=3, batch_size=1).score(["a" * (2 * mib)], ["p"], ["a"])
    print(f"a 108 MB body refused in {huge_s:.2f} s")
    assert huge == (413, f"the body is {len(body_of(108 * mib))} bytes (Content-Length), over this server's limit of "
                         f"{mib} bytes (--max-body-mib 1); send fewer samples a request (--reward.remote_batch_size) "
                         "or start the server with a larger --max-body-mib") and huge_s < 10
    assert over[0] == 413 and over[1].startswith(f"the body is {len(body_of(mib))} bytes (Content-Length)")
    assert chunked_over[0] == 413 and chunked_over[1].startswith(f"the body is over {mib} bytes (sent without a "
                                                                 "Content-Length), over this server's limit")
    assert chunked_under[0] == under[0] == 200
    assert "HTTP 413 Request Entity Too Large: the body is " in str(refused.value)
    assert str(refused.value).startswith(f"reward server {server.url} refused the batch of samples 0-0 (of 1)")


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
    for bad in ("0", "-1", "lots", "nan", "inf"):
        rc, out = hybrid("serve-reward", "--reward-func", str(LETTERS_REWARD), "--port", "0", "--max-body-mib", bad)
        assert rc == 2 and f"--max-body-mib must be a number of MiB > 0: got '{bad}'" in out, out
    assert "Traceback" not in out
