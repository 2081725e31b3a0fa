"""Where the GPU idles in an actor update (issue 48: the train stage's GPU is busy 88% of its 8.6 s on the H100):
one update of `bench_train`'s samples through `fit_actor`, after a warm-up one, under torch's profiler with the
update's host calls as `host:NAME` ranges: the update itself, each micro-batch, its tensors' building, its forward
(the policy's logprobs), its loss maths, DeepSpeed's backward and step, and the garbage collector's pauses. The
GPU's idle seconds are then given by the innermost host call open at each moment (`gpu_gaps.py`), beside each
call's host seconds (`host_split.py`).

Benchmarks only; it knows `actor_trainer`'s imported names and DeepSpeed's engine methods, nothing of Ray or the
store.
"""
from __future__ import annotations

import gc
import tempfile
from pathlib import Path

from bench_train import NUM_SAMPLES, TOKEN_BUDGET, _samples, _trainer


def _wrap_update(split, trainer) -> None:
    from hybrid_core.engines import actor_trainer

    split.wrap(actor_trainer, "micro_batch_tensors", "build_micro_batch")
    split.wrap(actor_trainer, "response_token_stats", "policy_forward")
    split.wrap(actor_trainer, "actor_objective", "loss_maths")
    split.wrap(trainer, "train_micro_batch", "micro_batch")
    split.wrap(trainer.engine, "backward", "backward")
    split.wrap(trainer.engine, "step", "ds_step")


def profiled_update(model_dir: Path, trace: Path, param_dtype: str = "bf16") -> dict:
    """One warm-up update, then one under the profiler (its trace written to `trace`); returns the host split."""
    from torch.profiler import ProfilerActivity, profile

    from host_split import HostSplit

    from hybrid_core.algorithms.experience import ActorLossSettings
    from hybrid_core.engines.actor_trainer import fit_actor
    from hybrid_core.engines.minibatch_updates import BatchPlan
    from hybrid_core.engines.sequence_batch import MicroBatching

    on_gpu = param_dtype != "fp32"
    trainer = _trainer(model_dir, packed=True, param_dtype=param_dtype, token_budget=TOKEN_BUDGET, checkpointing=True,
                       liger=None)
    batching = MicroBatching(num_samples=4, max_tokens=TOKEN_BUDGET, is_packed=True)
    plan = BatchPlan(batch_size=NUM_SAMPLES, batching=batching, max_epochs=1, seed=0)
    fit_actor(trainer, _samples(0), ActorLossSettings(kl_coef=0.0), plan)
    split = HostSplit(ranges=True)
    _wrap_update(split, trainer)
    update = split.timed(fit_actor, "fit_actor")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    gc.callbacks.append(split.on_gc)
    try:
        with profile(activities=activities) as prof:
            update(trainer, _samples(1), ActorLossSettings(kl_coef=0.0), plan)
    finally:
        gc.callbacks.remove(split.on_gc)
        split.restore()
    prof.export_chrome_trace(str(trace))
    trainer.engine.destroy()
    return split.figures()


def train_gaps(results, model_dir: Path, trace_dir: Path | None = None, param_dtype: str = "bf16") -> None:
    """The figure `train_gpu_busy_fraction` of one profiled update, its idle milliseconds by host call and by the
    GPU work that ended each gap as trials, with each host call's seconds. (`param_dtype` fp32 runs on the CPU: a
    smoke test of the code path, where no GPU work is traced.)"""
    from gpu_gaps import gap_figures

    folder = Path(trace_dir or tempfile.mkdtemp(prefix="train-gaps-"))
    trace = folder / "train-update-trace.json.gz"  # torch gzips a path ending in .gz
    host = profiled_update(model_dir, trace, param_dtype)
    figures = gap_figures(trace, window="host:fit_actor")
    results.figure("train_gpu_busy_fraction", figures["gpu_busy_fraction"], trials=figures | {"host_calls": host},
                   note=f"one update of {NUM_SAMPLES} samples, packed {TOKEN_BUDGET}-token micro-batches, under "
                        f"torch's profiler; idle ms by the innermost host call open (trace {trace})")
