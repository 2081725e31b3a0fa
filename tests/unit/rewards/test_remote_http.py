"""The reward-server client over real HTTP on loopback: batches spread over the URLs and put back in sample order,
back-off and retries, a dead server's share moving to the others, and each bad answer a clear error naming the URL
and the batch; and the reward sources (a server or a file) that the reward stage scores through."""
from __future__ import annotations

import json
import math
import re
import time

import pytest
from reward_servers import LETTERS_REWARD, ScriptedServer, answer_with, dead_url

from hybrid_core.rewards.remote_http import (PROBE_SAMPLE, RemoteRewardClient, RewardAnswerError,
                                             RewardRequestRefused, probe_problem, probe_problems)
from hybrid_core.rewards.reward_func import RewardFunctionError, load_reward_func, score_samples
from hybrid_core.types import PermanentError

HEADER = "<|im_start|>assistant\n"
LABELS = ["abc", "xyz", "a", "bcd", "q", "hello", "ab", "z", "abcxyz", "o"]
QUERIES = [f"prompt {i}{HEADER}{'abcxyzhelo'[i:] * 2}" for i in range(len(LABELS))]
PROMPTS = [f"prompt {i}" for i in range(len(LABELS))]


def lengths_answer(payload: dict, n: int) -> tuple[int, bytes]:
    """Rewards len(query) / 10 and a per-batch scalar extra log."""
    rewards = [len(q) / 10 for q in payload["query"]]
    return 200, json.dumps({"rewards": rewards, "extra_logs": {"batch": len(payload["query"])}}).encode()


def client(urls: str, **kwargs) -> RemoteRewardClient:
    settings = dict(timeout_s=5.0, max_retries=0, batch_size=3, backoff_base_s=0.01) | kwargs
    return RemoteRewardClient(urls=urls, **settings)


def direct_letters_rewards() -> list[float]:
    """The reward file called directly on the whole batch."""
    return score_samples(load_reward_func(str(LETTERS_REWARD)), "file", QUERIES, PROMPTS, LABELS).rewards


def test_batches_spread_over_the_urls_and_come_back_in_sample_order():
    with ScriptedServer(lengths_answer) as a, ScriptedServer(lengths_answer) as b:
        out = client(f"{a.url},{b.url}")(QUERIES, PROMPTS, LABELS)
    # 10 samples in batches of 3: [0-2], [3-5], [6-8], [9]; round-robin: batches 0 and 2 to a, 1 and 3 to b
    assert out["rewards"] == [len(q) / 10 for q in QUERIES] and out["scores"] == out["rewards"]
    assert sorted(len(r["query"]) for r in a.requests) == [3, 3]
    assert sorted(len(r["query"]) for r in b.requests) == [1, 3]
    sent = sorted((r["query"], r["prompts"], r["labels"]) for r in a.requests + b.requests)
    assert sent == sorted((QUERIES[lo:lo + 3], PROMPTS[lo:lo + 3], LABELS[lo:lo + 3]) for lo in (0, 3, 6, 9))
    assert out["extra_logs"] == {"batch": [3] * 9 + [1]}  # a batch's scalar is every one of its samples' value


def test_server_errors_back_off_exponentially_then_succeed():
    answers = lambda payload, n: (503, b"busy") if n <= 2 else lengths_answer(payload, n)  # noqa: E731
    with ScriptedServer(answers) as server:
        start = time.perf_counter()
        rewards = client(server.url, max_retries=3, batch_size=10, backoff_base_s=0.2).score(QUERIES, PROMPTS,
                                                                                            LABELS).rewards
        seconds = time.perf_counter() - start
    assert rewards == [len(q) / 10 for q in QUERIES] and len(server.requests) == 3
    assert 0.6 <= seconds < 1.5  # back-off 0.2 s then 0.4 s


def test_500_forever_fails_after_the_last_retry_naming_url_batch_retries_and_error():
    with ScriptedServer(lambda payload, n: (500, b"model not loaded")) as server:
        with pytest.raises(RuntimeError) as err:
            client(server.url, max_retries=2, batch_size=4).score(QUERIES[:4], PROMPTS[:4], LABELS[:4])
    message = str(err.value)
    assert not isinstance(err.value, PermanentError)  # the reward task may be retried as a whole
    assert (f"the last live URL {server.url} failed 3 times (reward.max_retries=2, reward.retry_budget_s=30.0, "
            f"reward.timeout_s=5.0)") in message
    assert "reward servers failed on the batch of samples" in message
    assert "HTTP 500 Internal Server Error: model not loaded" in message
    # one batch sent 3 times (with two, the first to fail ends the call while the other may still be retrying)
    assert len(server.requests) == 3


def test_a_url_dead_from_the_start_gives_its_share_to_the_live_one_without_back_off():
    letters = load_reward_func(str(LETTERS_REWARD))
    gone = dead_url()
    with ScriptedServer(answer_with(letters)) as live:
        start = time.perf_counter()
        batch = client(f"{gone},{live.url}", max_retries=3, batch_size=2, backoff_base_s=5.0).score(
            QUERIES, PROMPTS, LABELS)
        seconds = time.perf_counter() - start
    assert batch.rewards == direct_letters_rewards()
    assert len(live.requests) == 5 and seconds < 2.0  # all 5 batches answered by the live URL; no 5 s back-off


def test_a_server_that_dies_after_some_batches_hands_the_rest_to_the_others():
    letters = load_reward_func(str(LETTERS_REWARD))
    answer = answer_with(letters)
    dying_answer = lambda payload, n: answer(payload, n) if n <= 2 else None  # noqa: E731  drops connections after 2
    with ScriptedServer(dying_answer) as dying, ScriptedServer(answer) as other:
        batch = client(f"{dying.url},{other.url}", batch_size=1, max_concurrency=2).score(QUERIES, PROMPTS, LABELS)
    assert batch.rewards == direct_letters_rewards()
    assert batch.extra_logs == [{"full_marks": float(r >= 1.0)} for r in direct_letters_rewards()]
    # it answered 2 batches, dropped its third request (a 4th may have been in flight meanwhile), then was dead
    assert len(dying.requests) in (3, 4) and len(other.requests) == len(QUERIES) - 2


def test_every_url_dead_names_them_all():
    first, second = dead_url(), dead_url()
    with pytest.raises(RuntimeError) as err:
        client(f"{first},{second}", max_retries=1).score(QUERIES[:2], PROMPTS[:2], LABELS[:2])
    message = str(err.value)
    assert "failed 2 times (reward.max_retries=1" in message and "the other URLs were dead: " in message
    assert first in message and second in message and message.count("Connection refused") == 2


def test_a_slow_server_times_out():
    slow = lambda payload, n: time.sleep(2.0) or lengths_answer(payload, n)  # noqa: E731
    with ScriptedServer(slow) as server:
        start = time.perf_counter()
        with pytest.raises(RuntimeError, match=r"reward.timeout_s=0.3\); last error: TimeoutError: timed out;"):
            client(server.url, timeout_s=0.3).score(QUERIES[:1], PROMPTS[:1], LABELS[:1])
        assert time.perf_counter() - start < 1.5


def test_a_refused_request_is_permanent_and_not_retried():
    with ScriptedServer(lambda payload, n: (400, b"labels must be strings")) as server:
        with pytest.raises(RewardRequestRefused) as err:
            client(server.url, max_retries=5).score(QUERIES[:2], PROMPTS[:2], LABELS[:2])
    assert isinstance(err.value, PermanentError) and len(server.requests) == 1
    assert str(err.value) == (f"reward server {server.url} refused the batch of samples 0-1 (of 2): HTTP 400 Bad "
                              f"Request: labels must be strings")


def test_a_body_that_is_not_json_names_the_url_and_the_batch():
    with ScriptedServer(lambda payload, n: (200, b"<html>proxy error</html>")) as server:
        with pytest.raises(RewardAnswerError) as err:
            client(server.url).score(QUERIES[:4], PROMPTS[:4], LABELS[:4])
    assert isinstance(err.value, PermanentError)
    assert str(err.value).startswith(f"reward server {server.url} answered the batch of samples ")
    assert "with a body that is not JSON: b'<html>proxy error</html>'" in str(err.value)


BAD_ANSWERS = {
    "wrong length": ({"rewards": [0.5]}, r"returned 1 rewards for 2 samples"),
    "NaN": ({"rewards": [0.5, math.nan]}, r"returned a non-finite reward nan for sample #1 \(prompt_index, "
                                          r"sample_index\) = \(3, 1\)"),
    "infinity": ({"rewards": [0.5, 1.0], "scores": [math.inf, 0.0]}, r"returned a non-finite score inf for sample #0"),
    "no rewards": ({"scores": [0.5, 1.0]}, r"must return a dict with 'rewards': got dict without rewards"),
    "not a number": ({"rewards": [0.5, "high"]}, r"returned reward 'high' for sample #1"),
    "a list": ([0.5, 1.0], r"must return a dict with 'rewards': got list"),
}


@pytest.mark.parametrize("case", BAD_ANSWERS)
def test_a_bad_answer_names_the_url_the_batch_and_what_was_wrong(case):
    answer, problem = BAD_ANSWERS[case]
    bad_for_samples_2_and_3 = lambda payload, n: (  # noqa: E731
        (200, json.dumps(answer).encode()) if payload["query"] == QUERIES[2:4] else lengths_answer(payload, n))
    keys = [(p, s) for p in range(2) for s in range(2)]
    with ScriptedServer(lengths_answer) as good, ScriptedServer(bad_for_samples_2_and_3) as bad:
        with pytest.raises(RewardFunctionError) as err:
            client(f"{good.url},{bad.url}", batch_size=2).score(QUERIES[:4], PROMPTS[:4], LABELS[:4],
                                                                keys=[(k[0] + 2, k[1]) for k in keys])
    assert str(err.value).startswith(f"reward_func in reward server {bad.url} (answering the batch of samples 2-3 "
                                     f"(of 4)) ")
    assert re.search(problem, str(err.value)), str(err.value)


def test_both_kinds_of_reward_source_score_through_the_same_checks(tmp_path):
    """`reward.remote_url` names the source: reward servers or a file; the reward stage cannot tell them apart."""
    from hybrid_core.rewards.sources import RewardSourceSpec, open_reward_source

    file = tmp_path / "lengths.py"
    file.write_text("def reward_func(queries, prompts, labels, **kwargs):\n"
                    "    return {'rewards': [len(q) / 10 for q in queries]}\n")
    with ScriptedServer(lengths_answer) as a, ScriptedServer(lengths_answer) as b:
        for url in (f"{a.url},{b.url}", str(file)):
            spec = RewardSourceSpec(remote_url=url, timeout_s=5.0, max_retries=0, retry_budget_s=1.0,
                                    remote_batch_size=1)
            source = open_reward_source(spec)
            batch = source.score(["ab", "abcd"], ["", ""], ["", ""], [(0, 0), (0, 1)])
            assert source.name == url and batch.rewards == [0.2, 0.4] and batch.scores == [0.2, 0.4]
        assert len(a.requests) == len(b.requests) == 1  # remote_batch_size 1: one sample to each URL
    file.write_text("def reward_func(queries, prompts, labels, **kwargs):\n    return {'rewards': 'xxxx'}\n")
    source = open_reward_source(RewardSourceSpec(remote_url=str(file), timeout_s=5.0, max_retries=0,
                                                 retry_budget_s=1.0))
    with pytest.raises(RewardFunctionError, match=r"reward_func in .*lengths\.py returned 4 rewards for 2 samples"):
        source.score(["ab", "abcd"], ["", ""], ["", ""], [(0, 0), (0, 1)])


def test_a_500_server_is_retried_only_within_the_retry_budget():
    """Many retries allowed, a 1 s budget: back-off 0.1, 0.2, 0.4 s, then the 0.3 s left, then it gives up."""
    with ScriptedServer(lambda payload, n: (500, b"model not loaded")) as server:
        start = time.perf_counter()
        with pytest.raises(RuntimeError) as err:
            client(server.url, max_retries=100, retry_budget_s=1.0, backoff_base_s=0.1).score(
                QUERIES[:2], PROMPTS[:2], LABELS[:2])
        seconds = time.perf_counter() - start
    assert 1.0 <= seconds < 1.8, seconds
    assert f"failed {len(server.requests)} times (reward.max_retries=100, reward.retry_budget_s=1.0" in str(err.value)
    assert 4 <= len(server.requests) <= 6 and "HTTP 500 Internal Server Error: model not loaded" in str(err.value)


def test_a_dead_url_fails_within_the_retry_budget():
    gone = dead_url()
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"failed \d+ times .*reward.retry_budget_s=0.5.*Connection refused"):
        client(gone, max_retries=100, retry_budget_s=0.5, backoff_base_s=0.1).score(QUERIES[:1], PROMPTS[:1],
                                                                                    LABELS[:1])
    assert 0.5 <= time.perf_counter() - start < 1.2


def test_a_blip_shorter_than_the_budget_is_retried_through():
    """A server answering 503 for its first 0.8 s (a restart mid-run): the batch is answered, not failed."""
    up_at = time.monotonic() + 0.8

    def blip(payload: dict, n: int) -> tuple[int, bytes]:
        return (503, b"restarting") if time.monotonic() < up_at else lengths_answer(payload, n)

    with ScriptedServer(blip) as server:
        rewards = client(server.url, max_retries=100, retry_budget_s=5.0, backoff_base_s=0.1).score(
            QUERIES[:3], PROMPTS[:3], LABELS[:3]).rewards
    assert rewards == [len(q) / 10 for q in QUERIES[:3]] and len(server.requests) >= 3


def test_the_probe_sends_one_well_formed_sample_and_passes_a_server_that_answers():
    letters = load_reward_func(str(LETTERS_REWARD))
    with ScriptedServer(answer_with(letters)) as server:
        assert probe_problem(server.url, timeout_s=5.0, window_s=2.0) is None
    prompt, query, label = PROBE_SAMPLE
    assert server.requests == [{"query": [query], "prompts": [prompt], "labels": [label]}]


def test_the_probe_names_a_dead_url_a_500_server_and_a_refusal_with_the_fix():
    gone = dead_url()
    start = time.perf_counter()
    [problem] = probe_problems(gone, timeout_s=5.0, window_s=1.0)
    assert 1.0 <= time.perf_counter() - start < 2.0
    assert problem.startswith(f"reward.remote_url {gone} does not answer: a one-sample probe failed for 1.0 s "
                              f"(reward.probe_timeout_s=1.0, each try waiting up to 1.0 s): ConnectionRefusedError: "
                              f"[Errno 111] Connection refused; start the server (hybrid serve-reward --reward-func "
                              f"FILE.py --port P) or fix the URL")
    assert "--reward.probe_timeout_s S waits longer for a server still starting, 0 skips the probe" in problem
    with ScriptedServer(lambda payload, n: (500, b"model not loaded")) as failing, \
            ScriptedServer(lambda payload, n: (404, b"no route")) as wrong_path:
        problems = probe_problems(f"{failing.url},{wrong_path.url}", timeout_s=5.0, window_s=1.0)
    assert len(problems) == 2 and len(wrong_path.requests) == 1  # a refusal is not asked again
    assert f"reward.remote_url {failing.url} does not answer" in problems[0]
    assert "HTTP 500 Internal Server Error: model not loaded; the server is up but fails a well-formed sample: " \
           "check its log; --reward.probe_timeout_s S" in problems[0]
    assert problems[1] == (f"reward.remote_url {wrong_path.url} failed the start-up probe (one sample POSTed): "
                           f"reward server {wrong_path.url} refused the batch of samples 0-0 (of 1): HTTP 404 Not "
                           f"Found: no route; fix the server")


def test_a_dead_url_beside_a_live_one_is_a_warning_and_a_refusal_beside_one_is_a_problem(caplog):
    """The client drops a URL that does not answer and scores on the others (as mid-run, e.g. a resumed run whose
    second server is gone); a URL that refuses a well-formed sample is refused whatever else answers."""
    letters = load_reward_func(str(LETTERS_REWARD))
    gone = dead_url()
    with ScriptedServer(answer_with(letters)) as live, \
            ScriptedServer(lambda payload, n: (404, b"no route")) as wrong_path:
        with caplog.at_level("WARNING", logger="hybrid_core.rewards.remote_http"):
            assert probe_problems(f"{live.url},{gone}", timeout_s=5.0, window_s=1.0) == []
        [problem] = probe_problems(f"{live.url},{wrong_path.url}", timeout_s=5.0, window_s=1.0)
    [warning] = [r.getMessage() for r in caplog.records if gone in r.getMessage()]
    assert warning.startswith(f"reward.remote_url {gone} does not answer: a one-sample probe failed for 1.0 s")
    assert warning.endswith("; the run scores on the other 1 reward URL(s)")
    assert problem.startswith(f"reward.remote_url {wrong_path.url} failed the start-up probe (one sample POSTed)")


def test_the_probe_waits_for_a_server_that_binds_its_port_late():
    """`hybrid serve-reward … & hybrid train …`: the server may come up a moment after the run starts."""
    import threading

    letters = load_reward_func(str(LETTERS_REWARD))
    servers = []
    gone = dead_url()
    port = int(gone.rsplit(":", 1)[1].split("/")[0])
    late = threading.Timer(0.5, lambda: servers.append(ScriptedServer(answer_with(letters), port=port)))
    late.start()
    try:
        assert probe_problem(gone, timeout_s=5.0, window_s=5.0) is None
    finally:
        late.join()
        for server in servers:
            server.__exit__()
    assert len(servers[0].requests) == 1
