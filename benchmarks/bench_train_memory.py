"""Where the actor's train-phase memory goes (issue 48: the memory plan's train phase reads 10–20 GiB under the GPU's
peak, unexplained). One rank updates the policy at an iteration config's shape (`benchmarks/configs/NAME.yaml`: its
ds/train/actor fields, one optimizer step of `train.batch_size` samples of `rollout.max_new_tokens` new tokens,
every response at full length as the random-weight stand-ins generate them) under PyTorch's allocation history.
After a warm-up update it records a second one and replays the trace: the bytes live at the peak, by the code that
allocated them, beside the plan's terms for the same config and GPU.

    python3 benchmarks/run_all.py --model DIR --only train_memory --out FILE.json
            [--iteration-config NAME] [--iteration-flag=--actor.gradient_checkpointing_enable=false]

Figures: `train_memory_resident_gib` (allocated between updates: weights, gradients, optimizer states),
`train_memory_peak_allocated_gib` and `..._reserved_gib` (the recorded update, PyTorch's counters),
`train_memory_at_peak_gib` ({allocation site: GiB} live at the replayed peak, the largest first; the blocks that were
resident before the update as one entry) and `train_memory_plan_gib` (the plan's train-phase terms of the actor).
Knows the product's trainer builders and memory plan; the replay knows only the snapshot's dict layout.
"""
from __future__ import annotations

import gc
from pathlib import Path

PROMPT_TOKENS = 48  # the demo prompts under the chat template: 560 mean context at 1,024 new tokens
TOP_SITES = 25
RESIDENT = "resident before the update (weights, gradients, optimizer states)"
NO_PYTHON_FRAME = "no Python frame (autograd's backward or C++)"
GIB = 2**30


def allocation_site(frames: list[dict]) -> str:
    """The innermost frame outside PyTorch's own package, as `path:line function` (the path from its package
    directory on): the code that asked for the block."""
    for frame in frames:
        filename = frame.get("filename", "")
        if "/torch/" in filename or filename.startswith("??"):
            continue
        short = filename.split("site-packages/")[-1].split("/work/")[-1]
        return f"{short}:{frame.get('line', 0)} {frame.get('name', '?')}"
    return NO_PYTHON_FRAME


def live_at_peak(trace: list[dict], resident_bytes: int) -> tuple[int, dict[str, int]]:
    """(peak bytes, {site: bytes live at the peak}) of one device's allocation trace (PyTorch's snapshot
    `device_traces[i]`: `alloc` adds a block, `free_completed` removes it). `resident_bytes` were allocated before
    the trace began; a free of a block the trace never allocated comes out of them."""
    live: dict[int, tuple[int, str]] = {}
    resident, total = resident_bytes, resident_bytes
    peak, peak_live, peak_resident = total, {}, resident
    for event in trace:
        action, addr, size = event.get("action"), event.get("addr"), event.get("size", 0)
        if action == "alloc":
            live[addr] = (size, allocation_site(event.get("frames", [])))
            total += size
        elif action == "free_completed":
            if addr in live:
                total -= live.pop(addr)[0]
            else:
                resident -= size
                total -= size
        if total > peak:
            peak, peak_live, peak_resident = total, dict(live), resident
    return peak, _by_site(peak_live, peak_resident)


def _by_site(live: dict[int, tuple[int, str]], resident: int) -> dict[str, int]:
    sites: dict[str, int] = {RESIDENT: resident} if resident else {}
    for size, site in live.values():
        sites[site] = sites.get(site, 0) + size
    return dict(sorted(sites.items(), key=lambda item: -item[1]))


def top_sites_gib(sites: dict[str, int], top: int = TOP_SITES) -> dict[str, float]:
    """The `top` largest sites in GiB, the rest summed as `other sites (N)`."""
    items = list(sites.items())
    shown = {site: size / GIB for site, size in items[:top]}
    rest = items[top:]
    if rest:
        shown[f"other sites ({len(rest)})"] = sum(size for _, size in rest) / GIB
    return shown


def iteration_config(name: str, model_dir: Path, flags: list[str]):
    from bench_common import bench_config

    return bench_config(Path(__file__).resolve().parent / "configs" / f"{name}.yaml", model_dir, flags)


def update_samples(cfg, seed: int):
    """One optimizer step's samples at the config's shape: every response `max_new_tokens` long."""
    import torch

    from hybrid_core.engines.actor_trainer import TrainSamples

    g = torch.Generator().manual_seed(seed)
    count, new_tokens = cfg.train.batch_size, cfg.rollout.max_new_tokens
    prompts = [torch.randint(3, 100, (PROMPT_TOKENS,), generator=g).tolist() for _ in range(count)]
    responses = [torch.randint(3, 100, (new_tokens,), generator=g).tolist() for _ in range(count)]
    ref = [(-torch.rand(new_tokens, generator=g) * 5).tolist() for _ in range(count)] \
        if cfg.algo.kl.init_coef > 0 else None
    advantages = [torch.randn(new_tokens, generator=g).tolist() for _ in range(count)]
    return TrainSamples(prompt_ids=prompts, response_ids=responses, old_logprobs=None, ref_logprobs=ref,
                        advantages=advantages)


def _trainer(cfg):
    from bench_common import single_rank_engine

    return single_rank_engine(Path(cfg.actor.model_name_or_path), cfg.actor, cfg.ds, cfg.train, 100,
                              seed=cfg.train.seed)


def _update(trainer, cfg, seed: int) -> None:
    from hybrid_core.engines.actor_trainer import fit_actor
    from hybrid_core.engines.minibatch_updates import BatchPlan
    from hybrid_core.workers.worker_args import loss_settings, train_batching

    plan = BatchPlan(batch_size=cfg.train.batch_size, batching=train_batching(cfg), max_epochs=1, seed=seed)
    fit_actor(trainer, update_samples(cfg, seed), loss_settings(cfg), plan)


def plan_terms_gib(cfg, gpu_total_gib: float) -> dict[str, float]:
    """The memory plan's train-phase terms of the actor (and their sum) for `cfg` on this GPU."""
    from hybrid_core.plan.memory import estimate_memory

    train = next(p for p in estimate_memory(cfg, gpu_total_gib).phases if p.name == "train")
    terms = {term.name: term.gib for term in train.terms if term.name.startswith("actor")}
    return {**terms, "actor terms, summed": sum(terms.values()), "phase total (all roles)": train.total_gib}


def bench_train_memory(results, model_dir: Path, config_name: str, flags: list[str]) -> None:
    import torch

    cfg = iteration_config(config_name, model_dir, flags)
    trainer = _trainer(cfg)
    _update(trainer, cfg, seed=0)  # kernels, the allocator's first blocks, the optimizer's states
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    resident = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    _update(trainer, cfg, seed=1)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, sites = live_at_peak(snapshot["device_traces"][torch.cuda.current_device()], resident)
    gpu_total_gib = torch.cuda.get_device_properties(0).total_memory / GIB
    note = f"{config_name} {' '.join(flags)}: {cfg.train.batch_size} samples of {PROMPT_TOKENS} + " \
           f"{cfg.rollout.max_new_tokens} tokens, one optimizer step, the second update recorded"
    results.figure("train_memory_resident_gib", resident / GIB, note=note)
    results.figure("train_memory_peak_allocated_gib", torch.cuda.max_memory_allocated() / GIB,
                   trials={"replayed_peak_gib": peak / GIB})
    results.figure("train_memory_peak_reserved_gib", torch.cuda.max_memory_reserved() / GIB)
    results.figure("train_memory_at_peak_gib", top_sites_gib(sites))
    results.figure("train_memory_plan_gib", plan_terms_gib(cfg, gpu_total_gib))
    print(f"[bench] train memory: resident {resident / GIB:.2f} GiB, peak {peak / GIB:.2f} GiB; at the peak:",
          flush=True)
    for site, gib in top_sites_gib(sites, top=12).items():
        print(f"[bench]   {gib:7.2f} GiB  {site}", flush=True)
    trainer.engine.destroy()
    del trainer
    gc.collect()
    torch.cuda.empty_cache()
