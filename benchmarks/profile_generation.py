"""Where a rollout's generation time goes on the GPU (issue 17: generation at half its decode roofline): the iteration's
shape (32 prompts × n=8, ~100-token prompts, 1,024 new tokens, ignore_eos) through the rollout worker's own adapter,
in-process as the worker runs it, and variants in the same engine: without per-prompt seeds, without the sampled token's
logprob, with the garbage collector off (`_gc_off`). One more generate is split by host call (`host_split.py`:
scheduling, input preparation and launches, the wait for the sampled tokens, output processing, the collector's pauses),
so the host's milliseconds a step stand beside the GPU's; --trace-tokens traces one more under torch's profiler and says
what the host does while the GPU idles (`gpu_gaps.py`). One generate (256 new tokens, or --profiled-tokens; seeded,
without logprobs, as a rollout calls it by default) runs under the CUDA profiler: the kernels' summed time against the
wall says whether the GPU waits on the host (scheduling, output processing) or on its own kernels, and the top kernels
say which. --attention-backend builds the engine with another of vLLM's attention backends (e.g. TRITON_ATTN against
FlashAttention 3's decode at this shape); --fa-max-splits caps FlashAttention 3's split of a sequence's KV cache under
CUDA graphs (vLLM's default 32; 1: no split and no combine kernel); --block-size sets the KV cache's page size;
--rates-only measures the variants' rates alone, so one device command can compare several engine layouts.

    python benchmarks/profile_generation.py --model /tmp/m17 --out $OUT/gen-profile.json

With --engine-core-process the engine core (vLLM's scheduler) runs in its own process, with --executor-backend mp the
model runner alone, with both each in its own: the rates compare the layouts, but the profiler, in this process, then
sees none of the kernels (and --sleep-level 2 cannot load weights of this process into a core apart). With
--sleep-level the engine is built as a run builds it (sleep mode: its weights and KV cache in vLLM's own virtual-memory
pool), measured, put to sleep at that level and woken (level 2: its weights loaded again from the checkpoint, as a sync
does) and measured again: the figures ending `_after_sleep`.

Writes run_all's results file after every figure (a cut-off run keeps what it measured). Knows nothing about Ray,
Prefect or the store.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import timed  # noqa: E402
from bench_vllm import _ids, _roofline  # noqa: E402
from run_all import Results, device_copy_gbps  # noqa: E402

PROMPTS, SAMPLES, PROMPT_TOKENS, NEW_TOKENS, PROFILED_TOKENS = 32, 8, 100, 1024, 256
TOP_KERNELS = 15
# name → (per-prompt seeds, the sampled token's logprob): the rollout's own call, and each cost taken away
VARIANTS = {"seeded_logprobs": (True, True), "engine_seeded_logprobs": (False, True),
            "seeded_no_logprobs": (True, False)}


def generate_tok_s(engine, prompts, new_tokens: int, seeded: bool, logprobs: bool) -> float:
    """Tokens per second of one generate of the whole batch through the rollout worker's own call."""
    from hybrid_core.engines.vllm_rollout import SamplingSettings

    seeds = list(range(len(prompts))) if seeded else None
    sampling = SamplingSettings(n=SAMPLES, max_new_tokens=new_tokens, ignore_eos=True, seed_per_prompt=seeded,
                                logprobs=logprobs)
    seconds, out = timed(lambda: engine.generate(prompts, sampling, seeds))
    return sum(len(c.token_ids) for samples in out for c in samples) / seconds


def gc_off_tok_s(engine, prompts) -> float:
    """The rollout's own call with Python's garbage collector off, as `generate_tok_s` measures it."""
    import gc

    gc.disable()
    try:
        return generate_tok_s(engine, prompts, NEW_TOKENS, seeded=True, logprobs=False)
    finally:
        gc.enable()


def host_split_figures(engine, prompts) -> dict:
    """One generate of the rollout's own call, every host call of its decode steps timed (`host_split.py`)."""
    from host_split import host_split

    with host_split(engine.llm) as split:
        rate = generate_tok_s(engine, prompts, NEW_TOKENS, seeded=True, logprobs=False)
    figures = split.figures()
    steps = figures.get("engine_step", {}).get("calls", 0)
    return {"tok_s": rate, "engine_steps": steps, "calls": figures,
            "ms_a_step": {name: 1e3 * f["s"] / max(steps, 1) for name, f in figures.items()}}


def traced_gaps(engine, prompts, new_tokens: int, out_dir: Path) -> dict:
    """One generate of `new_tokens` under torch's profiler (CPU and CUDA) with the host calls as ranges: where the
    GPU idles and what the host does meanwhile (`gpu_gaps.py`); the trace is kept beside the results, gzipped."""
    from torch.profiler import ProfilerActivity, profile

    from gpu_gaps import gap_figures
    from host_split import host_split
    from hybrid_core.engines.vllm_rollout import SamplingSettings

    sampling = SamplingSettings(n=SAMPLES, max_new_tokens=new_tokens, ignore_eos=True, logprobs=False)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with host_split(engine.llm, ranges=True):
            engine.generate(prompts, sampling, list(range(len(prompts))))
    trace = out_dir / "gen-trace.json.gz"
    prof.export_chrome_trace(str(trace))  # torch gzips a path ending in .gz
    return gap_figures(trace)


def kernel_profile(engine, prompts, new_tokens: int) -> dict:
    """One generate of `new_tokens` under the CUDA profiler: wall, summed kernel time and the top kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from hybrid_core.engines.vllm_rollout import SamplingSettings

    sampling = SamplingSettings(n=SAMPLES, max_new_tokens=new_tokens, ignore_eos=True, logprobs=False)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        wall, _ = timed(lambda: engine.generate(prompts, sampling, list(range(len(prompts)))))
    kernels = [e for e in prof.key_averages() if e.device_time_total > 0]
    total_us = sum(e.device_time_total for e in kernels)
    top = sorted(kernels, key=lambda e: e.device_time_total, reverse=True)[:TOP_KERNELS]
    torch.cuda.synchronize()
    return {"wall_s": wall, "kernel_s": total_us / 1e6, "gpu_busy_fraction": total_us / 1e6 / wall,
            "steps": new_tokens,
            "top_kernels": [{"name": e.key[:120], "calls": e.count, "total_ms": e.device_time_total / 1e3,
                             "share": e.device_time_total / total_us} for e in top]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.6)  # the iteration config's
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=sorted(VARIANTS))
    parser.add_argument("--sleep-level", type=int, choices=(1, 2), help="sleep mode on; measure again after a sleep")
    parser.add_argument("--profiled-tokens", type=int, default=PROFILED_TOKENS, help="new tokens of the profiled run")
    parser.add_argument("--attention-backend", help="vLLM's attention backend by name (default: vLLM's choice)")
    parser.add_argument("--trace-tokens", type=int, default=0, help="new tokens of a traced run (0: none)")
    parser.add_argument("--executor-backend", choices=("uni", "mp"), help="vLLM's executor of the engine's worker "
                        "(mp: the model runner in a child process beside the scheduler; the host split then times "
                        "the calls into it)")
    parser.add_argument("--fa-max-splits", type=int, help="FlashAttention 3's most KV splits under CUDA graphs")
    parser.add_argument("--engine-core-process", action="store_true", help="vLLM's engine core (its scheduler) in a "
                        "process of its own, as --vllm.engine_core_process runs it")
    parser.add_argument("--block-size", type=int, help="the KV cache's page size in tokens (default: vLLM's, 16)")
    parser.add_argument("--rates-only", action="store_true", help="the variants' rates alone (no host split, "
                        "collector-off run or kernel profile): several engine layouts in one device call")
    args = parser.parse_args(argv)
    from hybrid_core.engines.vllm_rollout import EngineSettings, SamplingSettings, VllmRolloutEngine

    results = Results(args.out, {"model": str(args.model), "shape": [PROMPTS, SAMPLES, PROMPT_TOKENS, NEW_TOKENS],
                                 "engine_core_process": args.engine_core_process,
                                 "attention_backend": args.attention_backend, "fa_max_splits": args.fa_max_splits,
                                 "executor_backend": args.executor_backend, "block_size": args.block_size})
    if args.fa_max_splits:
        cap_attention_splits(args.fa_max_splits)
    gbps = device_copy_gbps()
    roofline, terms = _roofline(args.model, gbps, PROMPTS * SAMPLES, mean_context=PROMPT_TOKENS + NEW_TOKENS / 2)
    results.figure("roofline_tok_s", {"tok_s": roofline, "terms": terms})
    start = time.perf_counter()
    engine = VllmRolloutEngine(EngineSettings(model_path=str(args.model), seed=0, max_model_len=1152,
                                              gpu_memory_utilization=args.gpu_memory_utilization,
                                              enable_sleep=args.sleep_level is not None,
                                              sleep_level=args.sleep_level or 1,
                                              attention_backend=args.attention_backend,
                                              executor_backend=args.executor_backend,
                                              block_size=args.block_size,
                                              engine_core_process=args.engine_core_process))
    results.figure("engine_start_s", time.perf_counter() - start)
    prompts = _ids(PROMPTS, PROMPT_TOKENS, 1)
    engine.generate(prompts, SamplingSettings(n=SAMPLES, max_new_tokens=32, ignore_eos=True), list(range(PROMPTS)))
    measure_variants(engine, prompts, args, roofline, results, suffix="")
    if args.rates_only:
        return 0
    results.figure("host_split", host_split_figures(engine, prompts))
    results.figure("gen_tok_s_seeded_no_logprobs_gc_off",
                   rate_figure([gc_off_tok_s(engine, prompts) for _ in range(args.trials)], roofline))
    if args.sleep_level is not None:
        results.figure("sleep_cycle_s", timed(lambda: sleep_and_wake(engine, args.model))[0])
        measure_variants(engine, prompts, args, roofline, results, suffix="_after_sleep")
    if args.trace_tokens:
        results.figure("gpu_gaps", traced_gaps(engine, prompts, args.trace_tokens, args.out.parent))
    results.figure("profile", kernel_profile(engine, prompts, args.profiled_tokens))
    return 0


def cap_attention_splits(max_splits: int) -> None:
    """Engines built after this pass vLLM `attention_config.flash_attn_max_num_splits_for_cuda_graph`."""
    from hybrid_core.engines import vllm_rollout

    options_of = vllm_rollout.engine_options

    def with_cap(settings, platform):
        options = options_of(settings, platform)
        options["attention_config"] = options.get("attention_config", {}) | {
            "flash_attn_max_num_splits_for_cuda_graph": max_splits}
        return options

    vllm_rollout.engine_options = with_cap


def measure_variants(engine, prompts, args, roofline: float, results, suffix: str) -> None:
    for name in args.variants:
        seeded, logprobs = VARIANTS[name]
        rates = [generate_tok_s(engine, prompts, NEW_TOKENS, seeded, logprobs) for _ in range(args.trials)]
        results.figure(f"gen_tok_s_{name}{suffix}", rate_figure(rates, roofline))


def rate_figure(rates: list[float], roofline: float) -> dict:
    return {"median": statistics.median(rates), "trials": rates,
            "fraction_of_roofline": statistics.median(rates) / roofline}


def sleep_and_wake(engine, model_dir: Path) -> None:
    """A rollout's sleep and the next step's wake: weights first (level 2: loaded again, as a sync loads them),
    then the KV cache."""
    from safetensors.torch import load_file

    engine.sleep()
    engine.wake_up(["weights"])
    if engine.weights_discarded:
        for shard in sorted(model_dir.glob("*.safetensors")):
            engine.load_weights(list(load_file(str(shard), device="cuda").items()))
        engine.finish_weight_update()
    engine.wake_up(["kv_cache"])


if __name__ == "__main__":
    sys.exit(main())
