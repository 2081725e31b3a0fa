"""RewardModelWorker: the Ray actor holding the frozen reward model (`reward.model_name_or_path`); answers reward
forwards only, asked by the rollout worker's reward stage (OpenRLHF's RewardModelActor, `trainer/ray/launcher.py`).

Its ranks are alike replicas, each scoring a contiguous share of the step's samples. It knows nothing about Prefect.
"""
from __future__ import annotations

from hybrid_core.engines.reward_model import RewardModel, RewardModelSettings


class RewardModelWorker:
    PRELOAD = ("transformers",)  # imported while the other workers start (placement.deferred)

    def __init__(self, settings: RewardModelSettings):
        self.model = RewardModel(settings)

    def ready(self) -> bool:
        return True

    def rewards(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[tuple[float, float]]:
        """(reward, raw head value) of every sample, in order."""
        return [(score.reward, score.raw) for score in self.model.score(prompt_ids, response_ids)]
