"""Remote reward servers: `--reward.remote_url http://host:port/get_reward[,http://…]`, OpenRLHF's JSON protocol.

A step's samples are cut into batches of `reward.remote_batch_size`; each batch is POSTed as {"query", "prompts",
"labels"} and answered {"rewards", "scores", "extra_logs"}. Batches go concurrently (a bounded thread pool), spread
round-robin over the URLs that are still live. Every request has a timeout (`reward.timeout_s`). A URL that fails
with a connection error, a timeout, a 5xx or a 429 is dead for the rest of the call and its batches move to the live
URLs at once; on the last live URL a batch is retried with exponential back-off (base, 2 × base, 4 × base …) up to
`reward.max_retries` times, then the call fails naming the URLs, the batch, the retries and the last error. A 4xx
answer is a permanent refusal. Each answer is checked with the reward function's checks (`score_samples`: a missing
"rewards", wrong length, NaN/inf, non-numbers), with the URL and the batch's samples named; results are put back in
sample order, so the rewards do not depend on the concurrency or on which server answered.
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
from typing import Callable

from hybrid_core.rewards.reward_func import RewardBatch, score_samples
from hybrid_core.types import PermanentError

BACKOFF_BASE_S = 1.0
MAX_BACKOFF_S = 60.0
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
        raise ServerFailure(f"{type(reason).__name__}: {reason} (reward.timeout_s={timeout_s})") from err
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
                 backoff_base_s: float = BACKOFF_BASE_S, max_concurrency: int = MAX_CONCURRENT_REQUESTS):
        if batch_size <= 0 or max_concurrency <= 0:
            raise ValueError(f"batch_size and max_concurrency must be > 0: got {batch_size}, {max_concurrency}")
        self.urls, self.timeout_s, self.max_retries = parse_urls(urls), timeout_s, max_retries
        self.batch_size, self.backoff_base_s, self.max_concurrency = batch_size, backoff_base_s, max_concurrency

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
        """POST to a live URL; a failing URL is dropped while others live, the last one is retried with back-off."""
        retries = 0
        while True:
            url = live.pick(index)
            try:
                return post_once(url, payload, self.timeout_s, where), url
            except ServerFailure as err:
                if live.mark_dead(url, str(err)):
                    continue
                if retries == self.max_retries:
                    raise RuntimeError(self._give_up_message(live, url, where, err)) from err
                time.sleep(min(self.backoff_base_s * 2**retries, MAX_BACKOFF_S))
                retries += 1

    def _give_up_message(self, live: _LiveUrls, url: str, where: str, err: Exception) -> str:
        dead = [f"{u} ({live.failures[u]})" for u in self.urls if u != url and u in live.failures]
        others = f"; the other URLs were dead: {', '.join(dead)}" if dead else ""
        return (f"reward servers failed on {where}: the last live URL {url} failed {self.max_retries + 1} times "
                f"(reward.max_retries={self.max_retries}, reward.timeout_s={self.timeout_s}){others}; last error: "
                f"{err}; check the reward servers and their logs, then resume the run (committed stages are kept)")

    def __call__(self, queries, prompts, labels, **kwargs) -> dict:
        """The `reward_func(queries, prompts, labels)` interface: {"rewards", "scores", "extra_logs"}."""
        batch = self.score(list(queries), list(prompts), list(labels))
        names = sorted({k for logs in batch.extra_logs for k in logs})
        extra = {k: [logs.get(k) for logs in batch.extra_logs] for k in names}
        return {"rewards": batch.rewards, "scores": batch.scores, "extra_logs": extra}


def remote_reward_func(urls: str, timeout_s: float, max_retries: int, batch_size: int = DEFAULT_BATCH_SIZE) -> Callable:
    """A `reward_func(queries, prompts, labels)` that asks the reward server(s)."""
    return RemoteRewardClient(urls=urls, timeout_s=timeout_s, max_retries=max_retries, batch_size=batch_size)
