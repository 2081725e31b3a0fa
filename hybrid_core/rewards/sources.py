"""Where a step's rewards come from: the reward stage asks one `RewardSource` to score the committed samples.

A source is a Python file's `reward_func` or HTTP reward servers (`--reward.remote_url`), both answering through the
seed's interface and checked the same way (`score_samples`), or the reward model (`--reward.model_name_or_path`),
whose ranks the stage asks through `RewardModelSource`. As in OpenRLHF 0.11 a run has one of them: with a remote URL
(or an agent) `train_ppo_ray.py` creates no RewardModelActor and the samples arrive with their rewards, so nothing
combines a model's reward with a function's (the `reward_fn` that summed several reward models went in #972).
It knows nothing of Ray, the store or generation.
"""
from __future__ import annotations

import json
import math
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
    """`reward.remote_url` (None: the reward model scores) and the settings of its calls."""

    remote_url: str | None
    timeout_s: float
    max_retries: int
    retry_budget_s: float
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


Rows = list[list[int]]


class RewardModelSource:
    """The reward model's ranks, bound to one step's samples: a reward model scores the generated token ids (never
    a re-tokenised text), so the source holds them. `forward(prompt_ids, response_ids)` returns one (reward, raw
    head value) pair per sample; the raw value is logged as `reward_model_raw` when the rewards are normalised."""

    name = "reward model"

    def __init__(self, prompt_ids: Rows, response_ids: Rows, forward: Callable[[Rows, Rows], list],
                 is_normalized: bool):
        self.prompt_ids, self.response_ids, self.forward = prompt_ids, response_ids, forward
        self.is_normalized = is_normalized

    def score(self, queries: list[str], prompts: list[str], labels: list[str], keys: list) -> RewardBatch:
        assert len(keys) == len(self.prompt_ids), (len(keys), len(self.prompt_ids))
        pairs = self.forward(self.prompt_ids, self.response_ids)
        rewards = [float(reward) for reward, _ in pairs]
        if bad := [i for i, reward in enumerate(rewards) if not math.isfinite(reward)]:
            raise RuntimeError(f"the reward model scored sample {keys[bad[0]]} (prompt_index, sample_index) "
                               f"{rewards[bad[0]]} ({len(bad)} of {len(rewards)} samples not finite); check "
                               "reward.model_name_or_path and ds.param_dtype (fp32 if bf16 overflows)")
        extra = [{"reward_model_raw": float(raw)} if self.is_normalized else {} for _, raw in pairs]
        return RewardBatch(rewards=rewards, scores=list(rewards), extra_logs=extra)


class EpisodeRewardSource:
    """An agent's episodes, bound to one step's rollout: each sample's reward is the sum of its turns' rewards and
    its score the last turn's, as the rollout committed them; its extra logs are the last turn's and the turn
    count. Nothing is called again: a resumed run scores committed episodes without their environments."""

    name = "agent episodes"

    def __init__(self, rewards: list[float], scores: list[float], turns: list[str]):
        self.rewards, self.scores, self.turns = rewards, scores, turns

    def score(self, queries: list[str], prompts: list[str], labels: list[str], keys: list) -> RewardBatch:
        assert len(keys) == len(self.rewards), (len(keys), len(self.rewards))
        extra = []
        for turns_json in self.turns:
            turns = json.loads(turns_json)
            extra.append({**(turns[-1]["extra_logs"] if turns else {}), "num_turns": float(len(turns))})
        return RewardBatch(rewards=list(self.rewards), scores=list(self.scores), extra_logs=extra)


def open_reward_source(spec: RewardSourceSpec) -> RewardSource | None:
    """The source `reward.remote_url` names: http(s) URLs (comma-separated) or a `.py` file defining reward_func;
    None without one (the reward model's source is bound to each step's samples: `RewardModelSource`)."""
    url = spec.remote_url
    if url is None:
        return None
    if url.startswith(("http://", "https://")):
        client = RemoteRewardClient(urls=url, timeout_s=spec.timeout_s, max_retries=spec.max_retries,
                                    retry_budget_s=spec.retry_budget_s, batch_size=spec.remote_batch_size)
        return RemoteRewardSource(url, client)
    return FunctionRewardSource(url, load_reward_func(url))
