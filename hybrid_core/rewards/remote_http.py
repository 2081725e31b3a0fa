"""Remote reward servers: `--reward.remote_url http://host:port/get_reward[,http://…]`, OpenRLHF's JSON protocol.

POSTs {"query": [...], "prompts": [...], "labels": [...]} (the batch split evenly across the comma-separated URLs)
and expects {"rewards": [...], "scores": [...], "extra_logs": {...}}. Each call has a timeout; failures are retried
with exponential back-off (1, 2, 4 … s) up to `max_retries`, then fail naming the URL and the last error.
Returns a callable with the `reward_func` signature, so callers cannot tell the two kinds apart.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Callable

from hybrid_core.types import PermanentError

BACKOFF_BASE_S = 1.0


class RewardRequestRefused(PermanentError, RuntimeError):
    """A reward server answered 4xx (not 429): the same request would be refused again."""


def post_json(url: str, payload: dict, timeout_s: float, max_retries: int) -> dict:
    """POST `payload`; retry on connection errors, timeouts and 5xx/429 answers with exponential back-off."""
    body = json.dumps(payload).encode()
    last_error: Exception | None = None
    for attempt in range(max_retries + 1):
        try:
            request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            if err.code < 500 and err.code != 429:
                raise RewardRequestRefused(f"reward server {url} refused the request: HTTP {err.code} "
                                           f"{err.reason}") from err
            last_error = err
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            last_error = err
        if attempt < max_retries:
            time.sleep(BACKOFF_BASE_S * 2**attempt)
    raise RuntimeError(f"reward server {url} failed {max_retries + 1} times (reward.max_retries={max_retries}, "
                       f"reward.timeout_s={timeout_s}): {last_error!r}")


def remote_reward_func(urls: str, timeout_s: float, max_retries: int) -> Callable:
    """A `reward_func(queries, prompts, labels)` that asks the reward server(s)."""
    endpoints = [u.strip() for u in urls.split(",") if u.strip()]

    def reward_func(queries, prompts, labels, **kwargs):
        size = -(-len(queries) // len(endpoints))
        rewards, scores, extra = [], [], {}
        for i, url in enumerate(endpoints):
            part = slice(i * size, (i + 1) * size)
            if not queries[part]:
                continue
            out = post_json(url, {"query": queries[part], "prompts": prompts[part], "labels": labels[part]},
                            timeout_s, max_retries)
            rewards += list(out["rewards"])
            scores += list(out.get("scores", out["rewards"]))
            for key, values in (out.get("extra_logs") or {}).items():
                extra.setdefault(key, []).extend(values if isinstance(values, list) else [values] * len(out["rewards"]))
        return {"rewards": rewards, "scores": scores, "extra_logs": extra}

    return reward_func
