"""Where the GPU idles in an actor update (issue 48: the train stage's GPU is busy 88% of its 8.6 s on the H100):
the update of an iteration config's shape (`bench_train_memory`'s: one optimizer step of `train.batch_size` samples,
every response `rollout.max_new_tokens` long, the config's loss, batching and checkpointing), after a warm-up one,
under torch's profiler with the update's host calls as `host:NAME` ranges: the update itself, each micro-batch, its
tensors' building, its forward (the policy's logprobs), its loss maths, DeepSpeed's backward and step, and the
garbage collector's pauses. The GPU's idle seconds are then given by the innermost host call open at each moment
(`gpu_gaps.py`), beside each call's host seconds (`host_split.py`).

    python3 benchmarks/run_all.py --model DIR --only train_gaps --out FILE.json [--iteration-config NAME]
            [--iteration-flag=--actor.gradient_checkpointing_layers=20]

Benchmarks only; it knows `actor_trainer`'s imported names and DeepSpeed's engine methods, nothing of Ray or the
store.
"""
from __future__ import annotations

import gc
import tempfile
from pathlib import Path

from bench_train_memory import PROMPT_TOKENS, _trainer, _update, iteration_config


def _wrap_update(split, trainer) -> None:
    from hybrid_core.engines import actor_trainer

    split.wrap(actor_trainer, "micro_batch_tensors", "build_micro_batch")
    split.wrap(actor_trainer, "response_token_stats", "policy_forward")
    split.wrap(actor_trainer, "actor_objective", "loss_maths")
    split.wrap(actor_trainer, "fit_actor", "fit_actor")
    split.wrap(trainer, "train_micro_batch", "micro_batch")
    split.wrap(trainer.engine, "backward", "backward")
    split.wrap(trainer.engine, "step", "ds_step")


def profiled_update(cfg, trace: Path) -> dict:
    """One warm-up update of `cfg`'s shape, then one under the profiler (its trace written to `trace`); returns
    the host split of the profiled one."""
    from torch.profiler import ProfilerActivity, profile

    from host_split import HostSplit

    trainer = _trainer(cfg)
    _update(trainer, cfg, seed=0)
    split = HostSplit(ranges=True)
    _wrap_update(split, trainer)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cfg.train.device == "cuda" else [])
    gc.callbacks.append(split.on_gc)
    try:
        with profile(activities=activities) as prof:
            _update(trainer, cfg, seed=1)
    finally:
        gc.callbacks.remove(split.on_gc)
        split.restore()
    prof.export_chrome_trace(str(trace))
    trainer.engine.destroy()
    return split.figures()


def train_gaps(results, model_dir: Path, config_name: str, flags: list[str], trace_dir: Path | None = None) -> None:
    """The figure `train_gpu_busy_fraction` of one profiled update, its idle milliseconds by host call and by the
    GPU work that ended each gap as trials, with each host call's seconds. (Flags putting the config on the CPU, as
    `--train.device=cpu --ds.param_dtype=fp32`, run it there: a smoke test of the code path, with no GPU work
    traced.)"""
    from gpu_gaps import gap_figures

    cfg = iteration_config(config_name, model_dir, flags)
    folder = Path(trace_dir or tempfile.mkdtemp(prefix="train-gaps-"))
    trace = folder / "train-update-trace.json.gz"  # torch gzips a path ending in .gz
    host = profiled_update(cfg, trace)
    figures = gap_figures(trace, window="host:fit_actor")
    results.figure("train_gpu_busy_fraction", figures["gpu_busy_fraction"], trials=figures | {"host_calls": host},
                   note=f"{config_name} {' '.join(flags)}: one update of {cfg.train.batch_size} samples of "
                        f"{PROMPT_TOKENS} + {cfg.rollout.max_new_tokens} tokens under torch's profiler, the second "
                        f"one; idle ms by the innermost host call open (trace {trace})")
