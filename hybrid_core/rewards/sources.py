"""Where a step's rewards come from: the reward stage asks one `RewardSource` to score the committed samples.

Today a source is a Python file's `reward_func` or HTTP reward servers (`--reward.remote_url`); both answer through
the seed's interface and are checked the same way (`score_samples`). A reward model becomes one more source (and its
worker), with no change to the stage. It knows nothing of Ray, the store or generation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from hybrid_core.rewards.remote_http import DEFAULT_BATCH_SIZE, RemoteRewardClient
from hybrid_core.rewards.reward_func import RewardBatch, load_reward_func, score_samples


class RewardSource(Protocol):
    """Scores samples: `queries` are prompt + response, `keys` the samples' (prompt_index, sample_index)."""

    name: str

    def score(self, queries: list[str], prompts: list[str], labels: list[str], keys: list) -> RewardBatch: ...


@dataclass(frozen=True, kw_only=True)
class RewardSourceSpec:
    """`reward.remote_url` and the settings of its calls."""

    remote_url: str
    timeout_s: float
    max_retries: int
    remote_batch_size: int = DEFAULT_BATCH_SIZE


class FunctionRewardSource:
    """A callable with the `reward_func(queries, prompts, labels)` signature: a file's function."""

    def __init__(self, name: str, func: Callable):
        self.name, self.func = name, func

    def score(self, queries: list[str], prompts: list[str], labels: list[str], keys: list) -> RewardBatch:
        return score_samples(self.func, self.name, queries, prompts, labels, keys=keys)


class RemoteRewardSource:
    """Reward servers: the client checks every batch's answer with `score_samples`, naming the URL and the batch."""

    def __init__(self, name: str, client: RemoteRewardClient):
        self.name, self.client = name, client

    def score(self, queries: list[str], prompts: list[str], labels: list[str], keys: list) -> RewardBatch:
        return self.client.score(queries, prompts, labels, keys=keys)


def open_reward_source(spec: RewardSourceSpec) -> RewardSource:
    """The source `reward.remote_url` names: http(s) URLs (comma-separated) or a `.py` file defining reward_func."""
    url = spec.remote_url
    if url.startswith(("http://", "https://")):
        return RemoteRewardSource(url, RemoteRewardClient(urls=url, timeout_s=spec.timeout_s,
                                                          max_retries=spec.max_retries,
                                                          batch_size=spec.remote_batch_size))
    return FunctionRewardSource(url, load_reward_func(url))
