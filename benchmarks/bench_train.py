"""Training throughput on the GPU through the product's update path (`fit_actor`: PPO loss, dynamic batching,
packing): model FLOPs utilisation, packed vs padded.

MFU = (6 × non-embedding parameters × tokens + attention FLOPs) ÷ (seconds × the bf16 matmul rate measured in the
same run); attention FLOPs follow PaLM's count, 12 × layers × attention width × Σ sequence length² (forward +
backward, no causal discount); activation recomputation is not counted. Samples: prompt 256 tokens, responses of
uniformly drawn lengths in [256, 3840], 64 samples (one optimizer step), ZeRO-2 bf16, gradient checkpointing.
"""
from __future__ import annotations

import gc
import json
import os
import statistics
from pathlib import Path

from bench_common import single_rank_trainer, timed

NUM_SAMPLES, PROMPT_TOKENS, RESPONSE_RANGE, TOKEN_BUDGET, TIMED_STEPS = 64, 256, (256, 3840), 16384, 3


def flops_per_step(model_dir: Path, lengths: list[int]) -> float:
    shape = json.loads((model_dir / "config.json").read_text())
    h, layers, vocab = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    q_width, kv_width = shape["num_attention_heads"] * shape["head_dim"], shape["num_key_value_heads"] * shape["head_dim"]
    per_layer = h * (q_width + 2 * kv_width) + q_width * h + 3 * h * shape["intermediate_size"]
    non_embedding = layers * per_layer + vocab * h  # the output projection is a matmul per token, the lookup is not
    tokens = sum(lengths)
    return 6 * non_embedding * tokens + 12 * layers * q_width * sum(n * n for n in lengths)


def _samples(seed: int):
    import torch

    from hybrid_core.engines.actor_trainer import TrainSamples

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(RESPONSE_RANGE[0], RESPONSE_RANGE[1] + 1, (NUM_SAMPLES,), generator=g).tolist()
    prompts = [torch.randint(3, 100, (PROMPT_TOKENS,), generator=g).tolist() for _ in lengths]
    responses = [torch.randint(3, 100, (n,), generator=g).tolist() for n in lengths]
    old = [(-torch.rand(n, generator=g) * 5).tolist() for n in lengths]
    adv = [torch.randn(n, generator=g).tolist() for n in lengths]
    return TrainSamples(prompts, responses, old, None, adv)


def _trainer(model_dir: Path, packed: bool, param_dtype: str, token_budget: int, checkpointing: bool,
             liger: bool | None):
    ds = {"zero_stage": 2, "param_dtype": param_dtype, "packing_samples": packed, "use_liger_kernel": liger}
    train = {"batch_size": NUM_SAMPLES, "micro_batch_size": 4, "device": "cuda" if param_dtype != "fp32" else "cpu",
             "dynamic_batch_enable": packed, "max_tokens_per_gpu": token_budget}
    return single_rank_trainer(model_dir, lr=1e-7, ds=ds, train=train, total_steps=100,
                               gradient_checkpointing=checkpointing)


def bench_train_mfu(results, model_dir: Path, name: str, tflops: float, packed: bool = True,
                    param_dtype: str = "bf16", token_budget: int = TOKEN_BUDGET, checkpointing: bool = True,
                    profile: bool = False, liger: bool | None = None, head_kernel: str | None = None) -> None:
    """One figure: `train_mfu_<name>` (packed, micro-batches of `token_budget` tokens; the default path, Liger's
    kernels on CUDA where installed) or `..._padded` (4 samples a row), `..._no_ckpt` without gradient checkpointing
    (nothing recomputed: more activation memory), `..._liger` with `ds.use_liger_kernel` required.
    (`param_dtype` fp32 runs it on CPU: a smoke test of the code path, not a measurement.) `profile`: one more
    step, untimed, under torch.profiler; its busiest operators are printed (where the time beyond the matmuls goes).
    `head_kernel`: `HYBRID_LOGPROB_KERNEL` for this run (`torch`: the head's maths in PyTorch ops, `..._torch_head`)."""
    from unittest import mock

    from hybrid_core.switches import SWITCHES

    chosen = {SWITCHES["logprob_kernel"].env: head_kernel} if head_kernel else {}
    with mock.patch.dict(os.environ, chosen):
        _bench_train_mfu(results, model_dir, name, tflops, packed, param_dtype, token_budget, checkpointing, profile,
                         liger, suffix="_torch_head" if head_kernel == "torch" else "")


def _bench_train_mfu(results, model_dir: Path, name: str, tflops: float, packed: bool, param_dtype: str,
                     token_budget: int, checkpointing: bool, profile: bool, liger: bool | None, suffix: str) -> None:
    import torch

    from hybrid_core.algorithms.experience import ActorLossSettings
    from hybrid_core.engines.actor_trainer import fit_actor
    from hybrid_core.engines.minibatch_updates import BatchPlan
    from hybrid_core.engines.sequence_batch import MicroBatching

    trainer = _trainer(model_dir, packed, param_dtype, token_budget, checkpointing, liger)
    batching = MicroBatching(num_samples=4, max_tokens=token_budget if packed else None, is_packed=packed)
    plan = BatchPlan(batch_size=NUM_SAMPLES, batching=batching, max_epochs=1, seed=0)
    seconds, mfu, tokens = [], [], []
    for step in range(TIMED_STEPS + 1):  # the first step warms up (kernels, allocator; flex_attention compiles)
        samples = _samples(step)
        seconds.append(timed(lambda: fit_actor(trainer, samples, ActorLossSettings(kl_coef=0.0), plan))[0])
        lengths = [PROMPT_TOKENS + len(r) for r in samples.response_ids]
        mfu.append(flops_per_step(model_dir, lengths) / seconds[-1] / (tflops * 1e12))
        tokens.append(sum(lengths))
        print(f"[bench] train {name} {'packed' if packed else 'padded'}{'' if checkpointing else ' no-ckpt'}"
              f"{' liger' if liger else ''} step "
              f"{step}: {seconds[-1]:.2f} s, {tokens[-1]} tokens, MFU {mfu[-1]:.1%}", flush=True)
    figure = f"train_mfu_{name}" + ("" if packed else "_padded") + ("" if checkpointing else "_no_ckpt") \
        + ("_liger" if liger else "") + suffix
    results.figure(figure, statistics.median(mfu[1:]), trials={"seconds": seconds, "tokens": tokens, "mfu": mfu},
                   note=f"{NUM_SAMPLES} samples a step (each step its own lengths), "
                        f"{f'{token_budget} tokens' if packed else '4 padded samples'} a micro-batch, attention "
                        f"{trainer.module.config._attn_implementation}, median MFU of steps 2..{TIMED_STEPS + 1}")
    if profile:
        print_profile(lambda: fit_actor(trainer, _samples(TIMED_STEPS + 1), ActorLossSettings(kl_coef=0.0), plan))
    trainer.engine.destroy()  # DeepSpeed's hooks and buffers hold the states otherwise (a later 4B ran out of memory)
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def print_profile(step, rows: int = 30) -> None:
    """Run `step` once under torch.profiler and print the operators with the most GPU time, then the most CPU time
    (a step far above its matmul time spends it in one of those tables)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        step()
    averages = prof.key_averages()
    if torch.cuda.is_available():
        print("[bench] profile by GPU time\n" + averages.table(sort_by="self_cuda_time_total", row_limit=rows))
    print("[bench] profile by CPU time\n" + averages.table(sort_by="self_cpu_time_total", row_limit=rows), flush=True)
