"""RefWorker: the Ray actor holding the frozen reference policy for KL; answers logprob forwards only."""
from __future__ import annotations

from hybrid_core.engines.frozen_model import FrozenModel, load_tokenizer
from hybrid_core.engines.ring_attention import RingSettings
from hybrid_core.engines.sequence_batch import MicroBatching


class RefWorker:
    PRELOAD = ("transformers",)  # imported while the other workers start (placement.deferred)

    def __init__(self, model_path: str, param_dtype: str, batching: MicroBatching, use_liger: bool | None,
                 ring: RingSettings):
        pad_id = load_tokenizer(model_path).pad_token_id
        self.model = FrozenModel(model_path, param_dtype, pad_id, batching.is_packed, use_liger, ring=ring)
        self.batching = batching

    def ready(self) -> bool:
        return True

    def logprobs(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        return self.model.logprobs(prompt_ids, response_ids, self.batching)
