"""Remote reward servers over real HTTP on loopback: protocol, splitting across URLs, back-off and failures; and
the reward sources (a server or a file) that the reward stage scores through."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybrid_core.rewards import remote_http
from hybrid_core.rewards.remote_http import post_json, remote_reward_func


class RewardServer:
    """Answers len(query) / 10 per sample; the first `fail_first` requests get HTTP 503."""

    def __init__(self, fail_first: int = 0, status: int = 503):
        self.requests, self.fail_first, self.status = [], fail_first, status
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["content-length"])))
                server.requests.append(payload)
                if len(server.requests) <= server.fail_first:
                    self.send_response(server.status)
                    self.end_headers()
                    return
                body = json.dumps({"rewards": [len(q) / 10 for q in payload["query"]],
                                   "extra_logs": {"n": len(payload["query"])}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/get_reward"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def no_sleep(monkeypatch):
    waits = []
    monkeypatch.setattr(remote_http.time, "sleep", waits.append)
    return waits


def test_protocol_and_split_across_urls(no_sleep):
    a, b = RewardServer(), RewardServer()
    try:
        func = remote_reward_func(f"{a.url},{b.url}", timeout_s=5, max_retries=0)
        out = func(["ab", "abcd", "abcdef"], ["p1", "p2", "p3"], ["x", "y", "z"])
    finally:
        a.close(), b.close()
    # 3 samples over 2 URLs: ceil(3/2) = 2 to the first, 1 to the second; rewards len/10
    assert out["rewards"] == [0.2, 0.4, 0.6] and out["scores"] == out["rewards"]
    assert a.requests == [{"query": ["ab", "abcd"], "prompts": ["p1", "p2"], "labels": ["x", "y"]}]
    assert b.requests[0]["query"] == ["abcdef"]
    assert out["extra_logs"] == {"n": [2, 2, 1]}


def test_server_errors_back_off_exponentially_then_succeed(no_sleep):
    server = RewardServer(fail_first=2)
    try:
        out = post_json(server.url, {"query": ["abc"], "prompts": [""], "labels": [""]}, 5, max_retries=3)
    finally:
        server.close()
    assert out["rewards"] == [0.3] and len(server.requests) == 3
    assert no_sleep == [1.0, 2.0]  # 1 s then 2 s


def test_giving_up_names_the_url_and_the_retry_budget(no_sleep):
    server = RewardServer(fail_first=10)
    try:
        with pytest.raises(RuntimeError, match=r"failed 3 times \(reward.max_retries=2"):
            post_json(server.url, {"query": ["a"], "prompts": [""], "labels": [""]}, 5, max_retries=2)
    finally:
        server.close()
    assert no_sleep == [1.0, 2.0]


def test_client_errors_are_not_retried(no_sleep):
    server = RewardServer(fail_first=10, status=400)
    try:
        with pytest.raises(RuntimeError, match="refused the request: HTTP 400"):
            post_json(server.url, {"query": ["a"], "prompts": [""], "labels": [""]}, 5, max_retries=5)
    finally:
        server.close()
    assert len(server.requests) == 1 and no_sleep == []


def test_both_kinds_of_reward_source_score_through_the_same_checks(tmp_path):
    """`reward.remote_url` names the source: a reward server or a file; the reward stage cannot tell them apart."""
    from hybrid_core.rewards.reward_func import RewardFunctionError
    from hybrid_core.rewards.sources import RewardSourceSpec, open_reward_source

    server = RewardServer()
    file = tmp_path / "lengths.py"
    file.write_text("def reward_func(queries, prompts, labels, **kwargs):\n"
                    "    return {'rewards': [len(q) / 10 for q in queries]}\n")
    try:
        for url in (server.url, str(file)):
            source = open_reward_source(RewardSourceSpec(remote_url=url, timeout_s=5.0, max_retries=0))
            batch = source.score(["ab", "abcd"], ["", ""], ["", ""], [(0, 0), (0, 1)])
            assert source.name == url and batch.rewards == [0.2, 0.4] and batch.scores == [0.2, 0.4]
    finally:
        server.close()
    file.write_text("def reward_func(queries, prompts, labels, **kwargs):\n    return {'rewards': 'xxxx'}\n")
    source = open_reward_source(RewardSourceSpec(remote_url=str(file), timeout_s=5.0, max_retries=0))
    with pytest.raises(RewardFunctionError, match=r"reward_func in .*lengths\.py returned 4 rewards for 2 samples"):
        source.score(["ab", "abcd"], ["", ""], ["", ""], [(0, 0), (0, 1)])


def test_a_refused_request_is_permanent_and_a_dead_server_is_not(no_sleep):
    from hybrid_core.rewards.remote_http import RewardRequestRefused
    from hybrid_core.types import PermanentError

    server = RewardServer(fail_first=1, status=400)
    try:
        with pytest.raises(RewardRequestRefused) as err:
            post_json(server.url, {"query": ["a"]}, timeout_s=5.0, max_retries=3)
        assert isinstance(err.value, PermanentError) and no_sleep == []  # not retried here, nor by Prefect
    finally:
        server.close()
    with pytest.raises(RuntimeError, match="failed 2 times") as err:
        post_json("http://127.0.0.1:9/get_reward", {"query": ["a"]}, timeout_s=1.0, max_retries=1)
    assert not isinstance(err.value, PermanentError)
