"""vLLM on the GPU through the project's adapter: rollout generation vs a decode roofline, sleep/wake at levels 1
and 2, and weight sync from another process (this one) by CUDA IPC buckets vs one transfer per tensor.

The engine runs multiprocess (vLLM's EngineCore in its own process), so weight buckets cross a process boundary
exactly as they do between the actor and rollout workers.
"""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from bench_common import timed

PROMPTS, SAMPLES, PROMPT_TOKENS, NEW_TOKENS = 64, 8, 64, 1024
GPU_MEMORY_UTILIZATION = 0.7  # the hybrid's rollout phase: DeepSpeed asleep, vLLM holds most of the GPU
SLEEP_TRIALS, SYNC_TRIALS, PER_PARAM_TRIALS = 3, 5, 2


def _ids(count: int, length: int, seed: int) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 100, (count, length), generator=generator).tolist()


def bench_vllm(results, model_dir: Path, copy_gbps: float, gen_trials: int, parts: str = "gen,sleep,sync",
               enforce_eager: bool = False, tag: str = "1p7b", engine_options: dict | None = None) -> None:
    """`tag` names the model in the sync figures (`sync_<tag>_s`, …); `engine_options` overrides EngineSettings
    fields (gpu_memory_utilization, max_num_seqs, block_size, kv_cache_dtype) to try generation variants."""
    import torch

    from hybrid_core.engines.vllm_rollout import EngineSettings, VllmRolloutEngine

    free_before = torch.cuda.mem_get_info()[0]
    settings = EngineSettings(model_path=str(model_dir), param_dtype="bf16", seed=0,
                              gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
                              enforce_eager=enforce_eager, enable_sleep=True, sleep_level=1, max_model_len=2048,
                              max_num_seqs=PROMPTS * SAMPLES, engine_core_process=True)
    settings = dataclasses.replace(settings, **(engine_options or {}))
    results.data["meta"]["engine_settings"] = dataclasses.asdict(settings)
    start_s, engine = timed(lambda: VllmRolloutEngine(settings))
    results.figure("vllm_start_s", start_s, note="LLM(...) with CUDA graphs and torch.compile, multiprocess")
    results.figure("vllm_engine_gib", (free_before - torch.cuda.mem_get_info()[0]) / 2**30)
    if "gen" in parts:
        _generation(results, engine, model_dir, copy_gbps, gen_trials, settings.kv_cache_dtype)
    sender = _perturbed_policy(model_dir)
    probe = (_ids(1, 32, 5)[0], _ids(1, 256, 6)[0])
    results.figure("sync_check_before_mean_abs_dlogprob", _mean_abs_dlogprob(engine, sender, probe))
    for level in (1, 2) if "sleep" in parts else ():
        _sleep_level(results, engine, level)
    if "sync" not in parts:
        return
    _sync(results, engine, sender, tag)
    results.figure("sync_check_after_mean_abs_dlogprob", _mean_abs_dlogprob(engine, sender, probe),
                   note="vLLM prompt logprobs vs the sender's HF forward, bf16, 256 tokens")


KV_ELEMENT_BYTES = {"auto": 2, "fp8": 1}  # vllm.kv_cache_dtype → bytes a key or value element takes (bf16 runs)


def _roofline(model_dir: Path, copy_gbps: float, concurrency: int,
              mean_context: float = PROMPT_TOKENS + NEW_TOKENS / 2, kv_cache_dtype: str = "auto") -> tuple[float, dict]:
    """Decode roofline: every step reads the weights and the KV cache at the mean context (read + write bytes
    of a device copy measured here set the rate), its elements of `kv_cache_dtype` (vllm.kv_cache_dtype)."""
    import json

    shape = json.loads((model_dir / "config.json").read_text())
    weight_bytes = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    kv_per_token = shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * shape["head_dim"] \
        * KV_ELEMENT_BYTES[kv_cache_dtype]
    step_bytes = weight_bytes + concurrency * mean_context * kv_per_token
    terms = {"weight_bytes": weight_bytes, "kv_bytes_per_token": kv_per_token, "mean_context": mean_context,
             "concurrency": concurrency, "copy_gbps": copy_gbps}
    return concurrency / (step_bytes / (copy_gbps * 1e9)), terms


def _generation(results, engine, model_dir: Path, copy_gbps: float, trials: int, kv_cache_dtype: str) -> None:
    """`gen_tok_s` with per-prompt seeds (the default, `rollout.seed_per_prompt`) and `gen_tok_s_engine_seeded`
    without them (vLLM then draws the whole batch's sampling noise at once instead of one seeded request at a time)."""
    from hybrid_core.engines.vllm_rollout import SamplingSettings

    prompts = _ids(PROMPTS, PROMPT_TOKENS, 1)
    engine.generate(prompts[:8], SamplingSettings(n=SAMPLES, max_new_tokens=64, ignore_eos=True), seeds=range(8))  # warm-up
    roofline, terms = _roofline(model_dir, copy_gbps, PROMPTS * SAMPLES, kv_cache_dtype=kv_cache_dtype)
    for seed_per_prompt, suffix in ((True, ""), (False, "_engine_seeded")):
        sampling = SamplingSettings(n=SAMPLES, max_new_tokens=NEW_TOKENS, temperature=1.0, ignore_eos=True,
                                    seed_per_prompt=seed_per_prompt)
        rates = []
        for trial in range(trials):
            seeds = range(trial * 1000, trial * 1000 + PROMPTS) if seed_per_prompt else None
            seconds, out = timed(lambda: engine.generate(prompts, sampling, seeds=seeds))
            tokens = sum(len(c.token_ids) for samples in out for c in samples)
            rates.append(tokens / seconds)
            print(f"[bench] generate{suffix} trial {trial}: {tokens} tokens in {seconds:.2f} s", flush=True)
        results.figure("gen_tok_s" + suffix, statistics.median(rates), trials=rates,
                       note=f"{PROMPTS} prompts x n={SAMPLES}, {PROMPT_TOKENS}->{NEW_TOKENS} tokens, ignore_eos, "
                            "sampled-token logprobs, text decoded once at the end, CUDA graphs, "
                            + ("a seed per prompt" if seed_per_prompt else "the engine's generator"))
        results.figure("gen_fraction_of_roofline" + suffix, statistics.median(rates) / roofline)
    results.figure("gen_roofline_tok_s", roofline, trials=terms)


def _sleep_level(results, engine, level: int) -> None:
    import torch

    sleeps, wakes, freed = [], [], []
    for _ in range(SLEEP_TRIALS):
        free = torch.cuda.mem_get_info()[0]
        sleeps.append(timed(lambda: engine.sleep(level=level))[0])
        freed.append((torch.cuda.mem_get_info()[0] - free) / 2**30)
        wakes.append(timed(lambda: (engine.wake_up(["weights"]), engine.wake_up(["kv_cache"])))[0])
    suffix = f"_l{level}"
    results.figure("vllm_sleep_s" + suffix, statistics.median(sleeps), trials=sleeps)
    results.figure("vllm_wake_s" + suffix, statistics.median(wakes), trials=wakes)
    results.figure("vllm_freed_gib" + suffix, statistics.median(freed), trials=freed)


def _perturbed_policy(model_dir: Path):
    """The sender: the stand-in on this process's GPU with every weight moved a little (a trained policy)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).cuda().eval()
    generator = torch.Generator(device="cuda").manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator, device="cuda", dtype=p.dtype) * 0.01)
    return model


def _mean_abs_dlogprob(engine, model, probe) -> float:
    import torch

    from hybrid_core.engines.sequence_batch import make_sequence_batch
    from hybrid_core.engines.vocab_head import response_logprobs

    prompt, response = probe
    engine.wake_up(["weights", "kv_cache"])
    served = engine.score([prompt], [response])[0]
    with torch.no_grad():
        batch = make_sequence_batch([prompt], [response], 0).to("cuda")
        trained = response_logprobs(model, batch)[0].tolist()
    return sum(abs(a - b) for a, b in zip(served, trained)) / len(served)


def _sync(results, engine, model, tag: str) -> None:
    """Bucketed IPC sync (persistent buffers, 256 and 1024 MiB buckets) vs one IPC transfer + load per tensor."""
    import torch

    from hybrid_core.engines.weight_sync import BucketBuffers, iter_buckets, largest_bucket_bytes, share_bucket

    engine.wake_up(["weights"])
    for bucket_mb in (256, 1024):
        budget = bucket_mb * 2**20
        buffers = BucketBuffers(largest_bucket_bytes(model, budget), torch.device("cuda"))

        def bucketed():
            for bucket in iter_buckets(model, budget, buffers=buffers):
                torch.cuda.synchronize()
                engine.load_shared_bucket(share_bucket(bucket))
            engine.finish_weight_update()
        times = [timed(bucketed)[0] for _ in range(SYNC_TRIALS)]
        name = f"sync_{tag}_s" if bucket_mb == 1024 else f"sync_{tag}_s_{bucket_mb}mb"
        results.figure(name, statistics.median(times[1:]), trials=times,
                       note=f"{bucket_mb} MiB buckets, median of calls 2..{SYNC_TRIALS} (call 1 opens the handles)")
        del buffers
    times = [timed(lambda: _per_param_sync(engine, model))[0] for _ in range(PER_PARAM_TRIALS)]
    results.figure(f"sync_{tag}_per_param_s", statistics.median(times), trials=times)
    results.figure(f"sync_{tag}_vs_per_param", results.data["figures"][f"sync_{tag}_s"] / statistics.median(times))


def _per_param_sync(engine, model) -> None:
    """The baseline: one CUDA IPC handle and one engine load call per tensor."""
    from torch.multiprocessing.reductions import reduce_tensor

    from hybrid_core.engines.weight_sync import BucketEntry, SharedBucket, gpu_uuid

    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        engine.load_shared_bucket(SharedBucket((BucketEntry(name, tuple(p.shape), 0),),
                                               {gpu_uuid(flat.device): reduce_tensor(flat)},
                                               flat.numel() * flat.element_size()))
    engine.finish_weight_update()
