"""RefWorker: the Ray actor holding the frozen reference policy for KL; answers logprob forwards only."""
from __future__ import annotations

from hybrid_core.engines.frozen_model import FrozenModel, FrozenModelSettings, load_tokenizer


class RefWorker:
    PRELOAD = ("transformers",)  # imported while the other workers start (placement.deferred)

    def __init__(self, settings: FrozenModelSettings):
        self.model = FrozenModel(settings, load_tokenizer(settings.model_path).pad_token_id)

    def ready(self) -> bool:
        return True

    def logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        return self.model.logprobs(prompt_ids, response_ids)
