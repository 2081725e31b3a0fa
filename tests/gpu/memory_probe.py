"""Run in a fresh process by test_memory_plan_gpu: one DeepSpeed ZeRO-2 bf16 policy update of one sample per token
count, printing PyTorch's peak reserved memory of each as JSON.

Usage: python tests/gpu/memory_probe.py MODEL_DIR TOKENS [TOKENS ...]
The counts run in the order given; between them the cache is emptied and the peak reset, so each peak is the
trainer's resident states plus what that update needed.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "benchmarks")]  # the benchmarks' single-rank trainer builder


def one_update(trainer, tokens: int) -> None:
    import torch

    from hybrid_core.algorithms.experience import ActorLossSettings
    from hybrid_core.engines.actor_trainer import TrainSamples, fit_actor
    from hybrid_core.engines.minibatch_updates import BatchPlan
    from hybrid_core.engines.sequence_batch import MicroBatching

    generator = torch.Generator().manual_seed(tokens)
    prompt, response = 16, tokens - 16
    samples = TrainSamples(prompt_ids=[torch.randint(3, 100, (prompt,), generator=generator).tolist()],
                           response_ids=[torch.randint(3, 100, (response,), generator=generator).tolist()],
                           old_logprobs=[(-torch.rand(response, generator=generator) * 5).tolist()],
                           ref_logprobs=None, advantages=[torch.randn(response, generator=generator).tolist()])
    plan = BatchPlan(batch_size=1, batching=MicroBatching(num_samples=1), max_epochs=1, seed=0)
    fit_actor(trainer, samples, ActorLossSettings(kl_coef=0.0), plan)


def main(model_dir: str, token_counts: list[int]) -> dict[int, float]:
    import torch

    from bench_common import single_rank_trainer

    trainer = single_rank_trainer(Path(model_dir), lr=1e-6, ds={"zero_stage": 2, "param_dtype": "bf16"},
                                  train={"batch_size": 1, "micro_batch_size": 1, "device": "cuda"}, total_steps=10)
    peaks = {}
    for tokens in token_counts:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        one_update(trainer, tokens)
        torch.cuda.synchronize()
        peaks[tokens] = torch.cuda.max_memory_reserved() / 2**30
    return peaks


if __name__ == "__main__":
    print("PEAKS " + json.dumps(main(sys.argv[1], [int(n) for n in sys.argv[2:]])), flush=True)
