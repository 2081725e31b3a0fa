"""Remote reward servers: `--reward.remote_url http://host:port/get_reward[,http://…]`, OpenRLHF's JSON protocol.

A step's samples are cut into batches of `reward.remote_batch_size`; each batch is POSTed as {"query", "prompts",
"labels"} and answered {"rewards", "scores", "extra_logs"}. Batches go concurrently (a bounded thread pool), spread
round-robin over the URLs that are still live. Every request has a timeout (`reward.timeout_s`). A URL that fails
with a connection error, a timeout, a 5xx or a 429 is dead for the rest of the call and its batches move to the live
URLs at once; on the last live URL a batch is retried with exponential back-off (base, 2 × base, 4 × base …) up to
`reward.max_retries` times and within `reward.retry_budget_s` of its first failure, then the call fails naming the
URLs, the batch, the tries and the last error. A 4xx answer (400, 413, …) is a permanent refusal, with the server's
reason. Each answer is checked with the reward function's checks (`score_samples`: a missing "rewards", wrong
length, NaN/inf, non-numbers), with the URL and the batch's samples named; results are put back in sample order, so
the rewards do not depend on the concurrency or on which server answered. `probe_problems` asks each URL one
well-formed sample before the run starts (`reward.probe_timeout_s`).
It knows nothing of Ray, the store or the configuration.
"""
from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from hybrid_core.rewards.reward_func import RewardBatch, RewardFunctionError, score_samples
from hybrid_core.types import PermanentError

BACKOFF_BASE_S = 1.0
MAX_BACKOFF_S = 60.0
DEFAULT_RETRY_BUDGET_S = 30.0  # reward.retry_budget_s's default
PROBE_BACKOFF_S = 0.25
# the probe's one sample: a math-style prompt, a response and its label, as the run sends them
PROBE_SAMPLE = ("What is 1 + 1?", "What is 1 + 1? The answer is \\boxed{2}.", "2")
MAX_CONCURRENT_REQUESTS = 16  # batches in flight at once, over all the URLs
DEFAULT_BATCH_SIZE = 32
log = logging.getLogger(__name__)


class RewardRequestRefused(PermanentError, RuntimeError):
    """A reward server answered 4xx (not 429): the same request would be refused again."""


class RewardAnswerError(PermanentError, ValueError):
    """A reward server answered 200 with a body that is not JSON: asking again would get the same answer."""


class ServerFailure(Exception):
    """One request failed in a way another request (later, or to another server) may not: connection, timeout, 5xx."""


def parse_urls(urls: str) -> list[str]:
    endpoints = [u.strip() for u in urls.split(",") if u.strip()]
    if not endpoints:
        raise ValueError(f"reward.remote_url names no URL: got {urls!r}; give http://host:port/path[,http://…]")
    return endpoints


def _error_body(err: urllib.error.HTTPError) -> str:
    try:
        return err.read(500).decode(errors="replace").strip()
    except (OSError, http.client.HTTPException):
        return ""


def post_once(url: str, payload: dict, timeout_s: float, where: str = "a request") -> dict | list:
    """One POST of `payload`; returns the parsed JSON answer. Raises ServerFailure (worth another try),
    RewardRequestRefused (4xx) or RewardAnswerError (not JSON)."""
    body = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read()
    except urllib.error.HTTPError as err:
        detail = _error_body(err)
        if err.code < 500 and err.code != 429:
            raise RewardRequestRefused(f"reward server {url} refused {where}: HTTP {err.code} {err.reason}"
                                       f"{': ' + detail if detail else ''}") from err
        raise ServerFailure(f"HTTP {err.code} {err.reason}{': ' + detail if detail else ''}") from err
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", err)
        raise ServerFailure(f"{type(reason).__name__}: {reason}") from err
    try:
        return json.loads(raw)
    except ValueError:
        raise RewardAnswerError(f"reward server {url} answered {where} with a body that is not JSON: "
                                f"{raw[:200]!r}; it must answer {{\"rewards\": [...], \"scores\": [...], "
                                f"\"extra_logs\": {{...}}}}") from None


class _LiveUrls:
    """The URLs still live in one call; shared by its batches' threads."""

    def __init__(self, urls: list[str]):
        self.urls, self.live, self.lock = list(urls), list(urls), threading.Lock()
        self.failures: dict[str, str] = {}

    def pick(self, batch_index: int) -> str:
        with self.lock:
            return self.live[batch_index % len(self.live)]

    def mark_dead(self, url: str, error: str) -> bool:
        """Drop `url` unless it is the last live one; True when the batch should move to another URL."""
        with self.lock:
            self.failures[url] = error
            if url not in self.live:
                return True  # another batch found it dead meanwhile
            if len(self.live) == 1:
                return False
            self.live.remove(url)
        log.warning("reward server %s is dead for this call (%s); its batches move to the others", url, error)
        return True


class RemoteRewardClient:
    """Scores samples on reward servers (comma-separated `urls`), in batches of `batch_size`, concurrently."""

    def __init__(self, *, urls: str, timeout_s: float, max_retries: int, batch_size: int = DEFAULT_BATCH_SIZE,
                 retry_budget_s: float = DEFAULT_RETRY_BUDGET_S, backoff_base_s: float = BACKOFF_BASE_S,
                 max_concurrency: int = MAX_CONCURRENT_REQUESTS):
        if batch_size <= 0 or max_concurrency <= 0:
            raise ValueError(f"batch_size and max_concurrency must be > 0: got {batch_size}, {max_concurrency}")
        self.urls, self.timeout_s, self.max_retries = parse_urls(urls), timeout_s, max_retries
        self.batch_size, self.backoff_base_s, self.max_concurrency = batch_size, backoff_base_s, max_concurrency
        self.retry_budget_s = retry_budget_s

    def score(self, queries: list[str], prompts: list[str], labels: list[str], keys: list | None = None) -> RewardBatch:
        """Every sample's reward, in sample order; `keys` (one per sample) name samples in errors."""
        n = len(queries)
        ranges = [(lo, min(lo + self.batch_size, n)) for lo in range(0, n, self.batch_size)]
        if not ranges:
            return RewardBatch([], [], [])
        live = _LiveUrls(self.urls)
        pool = ThreadPoolExecutor(max_workers=min(len(ranges), self.max_concurrency), thread_name_prefix="reward")
        futures: list[Future] = []
        try:
            for index, (lo, hi) in enumerate(ranges):
                part = slice(lo, hi)
                futures.append(pool.submit(self._score_batch, live, index, (lo, hi, n), queries[part], prompts[part],
                                           labels[part], None if keys is None else keys[part]))
            batches = [future.result() for future in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # after a failure, batches not yet sent are not sent
        return RewardBatch(rewards=[r for b in batches for r in b.rewards],
                           scores=[s for b in batches for s in b.scores],
                           extra_logs=[e for b in batches for e in b.extra_logs])

    def _score_batch(self, live: _LiveUrls, index: int, span: tuple[int, int, int], queries: list[str],
                     prompts: list[str], labels: list[str], keys: list | None) -> RewardBatch:
        lo, hi, n = span
        where = f"the batch of samples {lo}-{hi - 1} (of {n})"
        payload = {"query": queries, "prompts": prompts, "labels": labels}
        answer, url = self._send(live, index, payload, where)
        return score_samples(lambda *_: answer, f"reward server {url} (answering {where})", queries, prompts,
                             labels, keys=keys)

    def _send(self, live: _LiveUrls, index: int, payload: dict, where: str) -> tuple[dict | list, str]:
        """POST to a live URL; a failing URL is dropped while others live, the last one is retried with back-off
        while tries and budget last (a try started within the budget runs to its timeout)."""
        retries, deadline = 0, None
        while True:
            url = live.pick(index)
            try:
                return post_once(url, payload, self.timeout_s, where), url
            except ServerFailure as err:
                if live.mark_dead(url, str(err)):
                    continue
                deadline = deadline or time.monotonic() + self.retry_budget_s
                left = deadline - time.monotonic()
                if retries == self.max_retries or left <= 0:
                    raise RuntimeError(self._give_up_message(live, url, where, err, retries + 1)) from err
                time.sleep(min(self.backoff_base_s * 2**retries, MAX_BACKOFF_S, left))
                retries += 1

    def _give_up_message(self, live: _LiveUrls, url: str, where: str, err: Exception, tries: int) -> str:
        dead = [f"{u} ({live.failures[u]})" for u in self.urls if u != url and u in live.failures]
        others = f"; the other URLs were dead: {', '.join(dead)}" if dead else ""
        return (f"reward servers failed on {where}: the last live URL {url} failed {tries} times "
                f"(reward.max_retries={self.max_retries}, reward.retry_budget_s={self.retry_budget_s}, "
                f"reward.timeout_s={self.timeout_s}){others}; last error: {err}; check the reward servers and their "
                f"logs, then resume the run (committed stages are kept)")

    def __call__(self, queries, prompts, labels, **kwargs) -> dict:
        """The `reward_func(queries, prompts, labels)` interface: {"rewards", "scores", "extra_logs"}."""
        batch = self.score(list(queries), list(prompts), list(labels))
        names = sorted({k for logs in batch.extra_logs for k in logs})
        extra = {k: [logs.get(k) for logs in batch.extra_logs] for k in names}
        return {"rewards": batch.rewards, "scores": batch.scores, "extra_logs": extra}


def probe_problem(url: str, timeout_s: float, window_s: float) -> str | None:
    """Why `url` cannot score (None when it can); see `probe_outcome`."""
    return probe_outcome(url, timeout_s, window_s)[0]


def probe_outcome(url: str, timeout_s: float, window_s: float) -> tuple[str | None, bool]:
    """(why `url` cannot score or None, whether it refused): one well-formed sample POSTed, connection errors,
    timeouts and 5xx tried again for `window_s` (a server started with the run may still be binding its port), and
    the answer checked as the run's answers are. A refusal (4xx, a malformed answer) is the server's contract broken;
    an unanswered probe is what the client drops mid-run. A server that accepts but never answers fails after about
    twice `window_s`."""
    prompt, query, label = PROBE_SAMPLE
    try_timeout_s = min(timeout_s, window_s)
    # the window, not a count, bounds the tries
    client = RemoteRewardClient(urls=url, timeout_s=try_timeout_s, max_retries=10**6, batch_size=1,
                                retry_budget_s=window_s, backoff_base_s=PROBE_BACKOFF_S, max_concurrency=1)
    started = time.monotonic()
    try:
        client.score([query], [prompt], [label])
    except (RewardRequestRefused, RewardAnswerError, RewardFunctionError) as err:
        return f"reward.remote_url {url} failed the start-up probe (one sample POSTed): {err}; fix the server", True
    except RuntimeError as err:
        last = err.__cause__ if isinstance(err.__cause__, ServerFailure) else err
        fix = ("the server is up but fails a well-formed sample: check its log" if str(last).startswith("HTTP ")
               else "start the server (hybrid serve-reward --reward-func FILE.py --port P) or fix the URL")
        return (f"reward.remote_url {url} does not answer: a one-sample probe failed for "
                f"{time.monotonic() - started:.1f} s (reward.probe_timeout_s={window_s}, each try waiting up to "
                f"{try_timeout_s} s): {last}; {fix}; --reward.probe_timeout_s S waits longer for a server still "
                "starting, 0 skips the probe"), False
    return None, False


def probe_problems(urls: str, timeout_s: float, window_s: float) -> list[str]:
    """`probe_outcome` of every URL in `urls` (comma-separated), concurrently. A refusing URL is a problem; a URL that
    does not answer is one only when none answers, since the client scores on the URLs that answer and drops the
    others, as it does mid-run (a resumed run whose second server is gone goes on with a warning)."""
    endpoints = parse_urls(urls)
    with ThreadPoolExecutor(max_workers=len(endpoints), thread_name_prefix="reward-probe") as pool:
        outcomes = list(pool.map(lambda url: probe_outcome(url, timeout_s, window_s), endpoints))
    answered = sum(problem is None for problem, _ in outcomes)
    problems = []
    for problem, refused in outcomes:
        if problem and (refused or not answered):
            problems.append(problem)
        elif problem:
            log.warning("%s; the run scores on the other %d reward URL(s)", problem, answered)
    return problems
