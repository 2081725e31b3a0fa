"""One 74,240-token sample of the Qwen3-4B shape trained on one GPU through the product's update path, against the
memory plan (issue #18 part 1: the vocabulary head in chunks makes it fit).

The configuration is the seed recipe's sample length on one rank: ZeRO-2, bf16, gradient checkpointing, DeepSpeed
sleep (the states wait in pinned host memory between steps, as the actor worker keeps them), packed (varlen flash
attention), one sample an optimizer step. Each step wakes the engine, runs `fit_actor` and sleeps it again.
Figures: seconds and tokens/s of each step (the first warms up), MFU as `bench_train` counts it, the device peak
(nvidia-smi every 50 ms: contexts and NCCL buffers included) against the plan's train phase for the same
configuration, and PyTorch's peak reserved memory against the plan's terms in its pool.
"""
from __future__ import annotations

import time
from pathlib import Path

from bench_common import single_rank_trainer, synchronize

SAMPLE_TOKENS, PROMPT_TOKENS, STEPS = 74240, 256, 2


def plan_config(model_dir: Path):
    """The RunConfig of what this benchmark runs, for `estimate_memory` (the actor alone on its GPU)."""
    from hybrid_core.config import RunConfig

    return RunConfig.model_validate({
        "actor": {"model_name_or_path": str(model_dir), "num_gpus_per_node": 1, "gradient_checkpointing_enable": True},
        "ds": {"zero_stage": 2, "param_dtype": "bf16", "enable_sleep": True, "packing_samples": True},
        "train": {"batch_size": 1, "micro_batch_size": 1, "device": "cuda"},
        "rollout": {"batch_size": 1, "micro_batch_size": 1},
        "algo": {"advantage": {"estimator": "reinforce"}, "kl": {"init_coef": 0.0}},
        "data": {"max_len": SAMPLE_TOKENS}})


def _sample(seed: int):
    import torch

    from hybrid_core.engines.actor_trainer import TrainSamples

    g = torch.Generator().manual_seed(seed)
    response = SAMPLE_TOKENS - PROMPT_TOKENS
    return TrainSamples(prompt_ids=[torch.randint(3, 100, (PROMPT_TOKENS,), generator=g).tolist()],
                        response_ids=[torch.randint(3, 100, (response,), generator=g).tolist()],
                        old_logprobs=[(-torch.rand(response, generator=g) * 5).tolist()], ref_logprobs=None,
                        advantages=[torch.randn(response, generator=g).tolist()])


def _train_steps(trainer, cfg) -> list[dict]:
    """STEPS optimizer steps of one sample each, woken and put to sleep around each, as the actor worker does."""
    import torch

    from hybrid_core.algorithms.experience import ActorLossSettings
    from hybrid_core.engines.actor_trainer import fit_actor
    from hybrid_core.engines.minibatch_updates import BatchPlan
    from hybrid_core.engines.sequence_batch import MicroBatching

    batching = MicroBatching(num_samples=1, is_packed=True, logit_chunk_tokens=cfg.ds.logit_chunk_tokens)
    plan = BatchPlan(batch_size=1, batching=batching, max_epochs=1, seed=0)
    steps = []
    for step in range(STEPS):
        samples = _sample(step)
        trainer.wake_up()
        synchronize()
        start = time.perf_counter()
        stats = fit_actor(trainer, samples, ActorLossSettings(kl_coef=0.0), plan)
        synchronize()
        seconds = time.perf_counter() - start
        trainer.sleep()
        steps.append({"seconds": seconds, "tokens_per_s": SAMPLE_TOKENS / seconds, "policy_loss": stats.get(
            "policy_loss"), "reserved_gib": torch.cuda.max_memory_reserved() / 2**30})
        print(f"[bench] long_context step {step}: {seconds:.1f} s, {SAMPLE_TOKENS / seconds:.0f} tokens/s, "
              f"PyTorch peak reserved {steps[-1]['reserved_gib']:.2f} GiB", flush=True)
    return steps


def bench_long_context(results, model_dir: Path, gpu_total_gib: float, tflops: float) -> None:
    """The `long_context_*` figures (see the module docstring); the plan's are written first and the device peak
    also when training fails (an out-of-memory error then says by how much the plan missed)."""
    import torch

    if model_dir is None:
        raise ValueError("long_context needs --model-4b DIR: a Qwen3-4B stand-in (data/build_tiny_model.py --standin "
                         "Qwen/Qwen3-4B DIR --device cuda)")
    from host_counters import GpuMemorySampler
    from hybrid_core.plan.memory import estimate_memory, model_shape, trainer_bytes

    cfg = plan_config(model_dir)
    train_phase = next(p for p in estimate_memory(cfg, gpu_total_gib, roles=("actor",)).phases if p.name == "train")
    b = trainer_bytes(cfg, model_shape(str(model_dir)), has_logits=True)
    pool_plan = b.weights + b.gradients + b.optimizer + b.activations + b.logits + b.step
    results.figure("long_context_plan_train_gib", train_phase.total_gib,
                   trials={term.name: round(term.gib, 3) for term in train_phase.terms})
    sampler, trainer = GpuMemorySampler(), None
    try:
        ds = cfg.ds.model_dump(include={"zero_stage", "param_dtype", "enable_sleep", "packing_samples"})
        trainer = single_rank_trainer(model_dir, lr=1e-7, ds=ds, total_steps=10, gradient_checkpointing=True,
                                      train={"batch_size": 1, "micro_batch_size": 1, "device": "cuda"},
                                      with_sleep_buffer=True)
        trainer.sleep()
        torch.cuda.reset_peak_memory_stats()
        steps = _train_steps(trainer, cfg)
    finally:
        device_peak, samples = sampler.stop()
        results.figure("long_context_measured_peak_gib", device_peak, note=f"nvidia-smi, {samples} samples at 50 ms")
        results.figure("long_context_plan_vs_measured", train_phase.total_gib / max(device_peak, 1e-9) - 1,
                       note="target within ±15%")
        if trainer is not None:
            trainer.engine.destroy()  # its hooks and buffers would hold the GPU for the sections after it
        torch.cuda.empty_cache()
    _record_speed(results, model_dir, steps, tflops)
    results.figure("long_context_pool_plan_vs_reserved", pool_plan / max(s["reserved_gib"] for s in steps) - 1,
                   note=f"plan's PyTorch-pool terms {pool_plan:.2f} GiB against torch.cuda.max_memory_reserved")


def _record_speed(results, model_dir: Path, steps: list[dict], tflops: float) -> None:
    from bench_train import flops_per_step

    timed = steps[1:] or steps  # the first step warms up (kernels, the allocator, DeepSpeed's first wake)
    seconds = sum(s["seconds"] for s in timed) / len(timed)
    results.figure("long_context_step_s", seconds, trials=steps,
                   note=f"one {SAMPLE_TOKENS}-token sample a step, ZeRO-2 bf16, checkpointing, sleep, packed; "
                        f"mean of steps 2..{STEPS}")
    results.figure("long_context_tokens_per_s", SAMPLE_TOKENS / seconds)
    if tflops:
        results.figure("long_context_mfu", flops_per_step(model_dir, [SAMPLE_TOKENS]) / seconds / (tflops * 1e12),
                       note="bench_train's count: 6·N·tokens + attention, no recompute")
