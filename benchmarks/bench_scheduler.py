"""The host cost of vLLM's scheduler at the rollout's shape, without a GPU (issue 17: generation waits on vLLM's
host side). vLLM's own `AsyncScheduler` (as the rollout engine runs it: async scheduling, the V2 model runner's
bookkeeping, no prefix caching) holds 256 requests that decode in lock-step to 1,024 new tokens; a stand-in for the
model runner answers each step with one token a request, two steps in flight as vLLM's batch queue keeps them.
Gives `schedule` and `update_from_output` in milliseconds a decode step, by KV block size, so vLLM versions and
options can be weighed on any machine (on the H200's host these two took 4.5 ms of a 9.3 ms step, s35).

    python benchmarks/bench_scheduler.py --out benchmarks/results/cpu-scheduler-DATE.json

Knows vLLM's scheduler interface (configs, `Request`, `ModelRunnerOutput`); nothing of this project.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_all import Results, git_sha  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
PROMPT_TOKENS, NUM_BLOCKS_OF_16 = 48, 25_000


def make_scheduler(model_dir: Path, block_size: int, max_model_len: int):
    """vLLM's AsyncScheduler with the rollout engine's settings; the V2 model runner's bookkeeping on."""
    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"  # the tiny model's config says 512 positions
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"  # the config check wants Triton for V2; the scheduler is told below
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    num_blocks = NUM_BLOCKS_OF_16 * 16 // block_size
    cache = CacheConfig(block_size=block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
                        enable_prefix_caching=False)
    cache.num_gpu_blocks = num_blocks
    config = VllmConfig(device_config=DeviceConfig(device="cpu"), cache_config=cache,
                        model_config=ModelConfig(model=str(model_dir), dtype="float16", seed=0,
                                                 max_model_len=max_model_len),
                        scheduler_config=SchedulerConfig(max_num_seqs=1024, max_num_batched_tokens=16384,
                                                         max_model_len=max_model_len, async_scheduling=True,
                                                         is_encoder_decoder=False))
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    kv_cache = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                             kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    scheduler = AsyncScheduler(vllm_config=config, kv_cache_config=kv_cache, log_stats=False,
                               structured_output_manager=StructuredOutputManager(config), block_size=block_size)
    scheduler.use_v2_model_runner = True
    return scheduler


def decode(scheduler, requests: int, new_tokens: int) -> dict:
    """All requests from prefill to their last token, two steps in flight; ms a step of each scheduler call."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    for i in range(requests):
        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, seed=i, detokenize=False)
        scheduler.add_request(Request(request_id=str(i), prompt_token_ids=list(range(1, PROMPT_TOKENS + 1)),
                                      sampling_params=params, pooling_params=None))
    seconds = {"schedule": 0.0, "update_from_output": 0.0}
    in_flight, steps = [], 0
    while scheduler.has_requests() or in_flight:
        if scheduler.has_requests():
            start = time.perf_counter()
            in_flight.insert(0, scheduler.schedule())
            seconds["schedule"] += time.perf_counter() - start
            if len(in_flight) < 2:
                continue
        scheduled = in_flight.pop()
        ids = list(scheduled.num_scheduled_tokens)
        output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                   sampled_token_ids=[[7] for _ in ids])
        start = time.perf_counter()
        scheduler.update_from_output(scheduled, output)
        seconds["update_from_output"] += time.perf_counter() - start
        steps += 1
    return {"steps": steps} | {f"{name}_ms_a_step": 1e3 * s / steps for name, s in seconds.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model", type=Path, default=REPO_ROOT / "data" / "tiny-qwen3", help="a config.json's dir")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args(argv)
    import vllm

    results = Results(args.out, {"git_sha": git_sha(), "date": str(date.today()),
                                 "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.processor()}",
                                 "vllm": vllm.__version__, "requests": args.requests, "new_tokens": args.new_tokens,
                                 "prompt_tokens": PROMPT_TOKENS})
    for block_size in args.block_sizes:
        trials = [decode(make_scheduler(args.model, block_size, PROMPT_TOKENS + args.new_tokens + 16),
                         args.requests, args.new_tokens) for _ in range(args.trials)]
        median = {key: statistics.median(t[key] for t in trials) for key in trials[0] if key != "steps"}
        results.figure(f"scheduler_block_{block_size}", median | {"steps": trials[0]["steps"]}, trials=trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
