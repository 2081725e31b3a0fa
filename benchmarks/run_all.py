"""GPU benchmarks of the Hybrid Engine on one GPU; one command, results written after every figure.

Figures (issue #6), each beside its baseline from the same run: DeepSpeed sleep/wake through persistent pinned
buffers vs DeepSpeed's `offload_states`; vLLM sleep/wake at levels 1 and 2; bucketed CUDA IPC weight sync into
vLLM vs one transfer per tensor; rollout generation vs a decode roofline from the device copy bandwidth measured here.
Issue #7's sections (→ h200-train-<date>.json): `train` (MFU through fit_actor, packed 1.7B and 4B, padded 1.7B),
`sync4b` (bucketed vs per-tensor sync of the 4B shape), `memory` (plan vs measured peak, two configurations) and
`iteration` (three colocated `hybrid train` iterations, seconds per stage, GPU and host memory peaks; the config
benchmarks/configs/NAME.yaml of --iteration-config, default h200-iteration).
Issue 48's `train_memory`: the actor's update at that config's shape (and --iteration-flag's), the bytes live at
its peak by allocation site beside the memory plan's train-phase terms (bench_train_memory.py).
Issue #18's `long_context` (needs --model-4b): one 74,240-token sample of the 4B shape trained on the GPU (ZeRO-2,
bf16, checkpointing, sleep) through fit_actor: step time, tokens/s and the device peak against the memory plan.
Usage (on the GPU machine, repository root on PYTHONPATH):
  python3 benchmarks/run_all.py --model DIR --out FILE.json [--only anchors,ds,vllm] [--git-sha SHA]
  python3 benchmarks/run_all.py --model DIR --model-4b DIR4B --only train,sync4b,memory,iteration --out FILE.json
  (`train1p7b` / `train4b` alone measure one model's MFU on the default path; `train1p7b_torch_head` the 1.7B
  with the head's maths in PyTorch ops; `train_liger` both with --ds.use_liger_kernel; `train_gaps` the
  iteration config's update under torch's profiler, the GPU's idle time by host call)
  python3 benchmarks/run_all.py --model DIR --only logprob_kernel,h2d,wake_copy --out FILE.json  (no DeepSpeed or
  vLLM: the head's kernels against PyTorch's ops, where large host-to-device copies lose speed, and the wake's copy
  by the copy engine against the multiprocessors' kernel)
  python3 benchmarks/run_all.py --model DIR --only gpu_overlap --out FILE.json  (torch alone: a decode-like and a
  forward-like job of the 1.7B shape alone, on two streams of one process and in two processes; PROBE_OVERLAP_MPS=1
  adds two processes under MPS)
  python3 benchmarks/run_all.py --model DIR4B --model-4b DIR4B --only long_context --out FILE.json
DIR is a random-weight stand-in (python3 data/build_tiny_model.py --standin Qwen/Qwen3-1.7B DIR --device cuda).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))


def git_sha() -> str:
    """The checkout's short commit, for a results file's meta ("unknown" outside a git checkout)."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


class Results:
    """The results file: metadata, figures and raw trials; rewritten after every figure so a cut-off run keeps
    what it measured."""

    def __init__(self, path: Path, meta: dict):
        self.path, self.data = path, {"meta": meta, "figures": {}, "trials": {}, "notes": {}, "errors": {}}
        self.write()

    def section(self, name: str, measure) -> None:
        """Run one section; a failure is printed and recorded under `errors` and the next section still runs."""
        import traceback

        started = time.perf_counter()
        try:
            measure()
        except Exception as error:  # noqa: BLE001 — the other sections' figures are worth keeping
            traceback.print_exc()
            self.data["errors"][name] = f"{type(error).__name__}: {error}"[-2000:]
            self.write()
        print(f"[bench] section {name}: {time.perf_counter() - started:.1f} s", flush=True)

    def figure(self, name: str, value, trials=None, note: str | None = None) -> None:
        self.data["figures"][name] = value
        if trials is not None:
            self.data["trials"][name] = trials
        if note:
            self.data["notes"][name] = note
        shown = f"{value:.4g}" if isinstance(value, float) else value
        print(f"[bench] {name} = {shown}" + (f"  trials={_short(trials)}" if trials else ""), flush=True)
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1, default=str) + "\n")


def _short(trials):
    return [round(t, 4) if isinstance(t, float) else t for t in trials] if isinstance(trials, list) else trials


def versions() -> dict:
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("vllm", "deepspeed", "transformers"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            found[name] = None
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
        found["gpu_total_gib"] = round(torch.cuda.mem_get_info()[1] / 2**30, 2)
    return found


def machine() -> dict:
    """The machine a results file was measured on: host name, CPU count, host memory (the card is in `versions`)."""
    from host_counters import used_gib

    meminfo = Path("/proc/meminfo").read_text()
    total_kib = int(meminfo.split("MemTotal:")[1].split()[0])
    return {"host": platform.node(), "cpus": os.cpu_count(), "ram_gib": round(total_kib / 2**20, 1),
            "ram_in_use_gib_at_start": round(used_gib(meminfo), 1)}


def device_copy_gbps() -> float:
    """Device copy bandwidth, bytes read + written: one 2 GiB bf16 device-to-device copy, median of 20."""
    import torch

    src = torch.randn(2**30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    dst = torch.empty_like(src)
    copy_s = _median_cuda_seconds(lambda: dst.copy_(src), repeats=20)
    return 2 * src.numel() * 2 / copy_s / 1e9


def anchors(results: Results) -> dict:
    """The two ceilings measured here: device copy bandwidth (bytes read + written) and bf16 matmul rate."""
    import torch

    copy_gbps = device_copy_gbps()
    n = 8192
    a, b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16), torch.randn(n, n, device="cuda",
                                                                               dtype=torch.bfloat16)
    mm_s = _median_cuda_seconds(lambda: a @ b, repeats=30)
    tflops = 2 * n**3 / mm_s / 1e12
    results.figure("device_copy_gbps", copy_gbps, note="one 2 GiB bf16 device-to-device copy, read + write bytes")
    results.figure("bf16_matmul_tflops", tflops, note="8192^3 bf16 matmul, median of 30")
    return {"copy_gbps": copy_gbps, "tflops": tflops}


def _median_cuda_seconds(fn, repeats: int) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def engine_options(pairs: list[str]) -> dict:
    """`FIELD=VALUE` pairs → EngineSettings overrides (numbers parsed as JSON: 32, 0.85, null)."""
    options = {}
    for pair in pairs:
        field, _, value = pair.partition("=")
        if not value:
            raise SystemExit(f"--engine-option wants FIELD=VALUE: got {pair!r}")
        options[field] = json.loads(value)
    return options


def model_shape(model_dir: Path) -> dict:
    config = json.loads((model_dir / "config.json").read_text())
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "tie_word_embeddings")
    return {k: config.get(k) for k in keys}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--out", type=Path,
                        default=REPO_ROOT / "benchmarks" / "results" / f"h200-hybrid-{date.today()}.json")
    parser.add_argument("--only", default="anchors,ds,vllm")
    parser.add_argument("--git-sha", default=os.environ.get("GIT_SHA", "unknown"))
    parser.add_argument("--gen-trials", type=int, default=2)
    parser.add_argument("--vllm-parts", default="gen,sleep,sync", help="which vLLM figures: gen, sleep, sync")
    parser.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs (faster start; not for gen)")
    parser.add_argument("--engine-option", action="append", default=[], metavar="FIELD=VALUE",
                        help="an EngineSettings override for the vLLM section, e.g. block_size=32 (repeatable)")
    parser.add_argument("--model-4b", type=Path, help="a Qwen3-4B stand-in, for train_mfu_4b and sync_4b")
    parser.add_argument("--memory-configs", default="vllm-peak,ds-peak",
                        help="which memory configurations (benchmarks/configs/h200-memory-NAME.yaml)")
    parser.add_argument("--iteration-flag", action="append", default=[], metavar="--FLAG=VALUE",
                        help="an extra `hybrid train` flag for the iteration run, written with `=`: "
                             "--iteration-flag=--ds.packing_samples=false")
    parser.add_argument("--iteration-config", default="h200-iteration", metavar="NAME",
                        help="the iteration run's config, benchmarks/configs/NAME.yaml (h200-grpo-4b: the 4B GRPO "
                             "shape of issue 48; give --model its 4B stand-in)")
    parser.add_argument("--profile-train", action="store_true",
                        help="after the timed 1.7B packed steps, profile one more and print its busiest operators")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/hybrid-bench"), help="runs of the product")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with our load function
    results = Results(args.out, {"git_sha": args.git_sha, "command": " ".join(sys.argv), "date": str(date.today()),
                                 "versions": versions(), "machine": machine(), "model": str(args.model),
                                 "shape": model_shape(args.model)})
    sections = args.only.split(",")
    needs_anchors = {"anchors", "train", "train1p7b", "train1p7b_torch_head", "train4b", "train_liger",
                     "long_context", "logprob_kernel"} & set(sections) \
        or ("vllm" in sections and "gen" in args.vllm_parts)
    ceilings = anchors(results) if needs_anchors else {"copy_gbps": 0.0}
    if "logprob_kernel" in sections:
        from bench_logprob_kernel import bench_logprob_kernel

        results.section("logprob_kernel", lambda: bench_logprob_kernel(results, ceilings["copy_gbps"]))
    if "h2d" in sections:
        from probe_host_copies import probe_host_copies

        results.section("h2d", lambda: probe_host_copies(results))
    if "wake_copy" in sections:
        from probe_wake_copy import probe_wake_copy

        results.section("wake_copy", lambda: probe_wake_copy(results))
    if "gpu_overlap" in sections:
        from probe_gpu_overlap import probe_gpu_overlap

        results.section("gpu_overlap", lambda: probe_gpu_overlap(results))
    if "ds" in sections:
        from bench_ds_sleep import bench_ds_sleep

        results.section("ds", lambda: bench_ds_sleep(results, args.model))
    if "vllm" in sections:
        from bench_vllm import bench_vllm

        results.section("vllm", lambda: bench_vllm(results, args.model, ceilings["copy_gbps"], args.gen_trials,
                                                   args.vllm_parts, args.eager,
                                                   engine_options=engine_options(args.engine_option)))
    run_train_sections(results, args, sections, ceilings)
    print(json.dumps(results.data["figures"], indent=1, default=str))
    return 0


def run_train_sections(results: Results, args, sections: list[str], ceilings: dict) -> None:
    """Issue #7's figures; each section is independent, so one failing leaves the others' figures."""
    if {"train", "train1p7b"} & set(sections):  # train1p7b: the default path's 1.7B figure alone
        from bench_train import bench_train_mfu

        results.section("train_1p7b", lambda: bench_train_mfu(results, args.model, "1p7b", ceilings["tflops"],
                                                              profile=args.profile_train))
    if "train1p7b_torch_head" in sections:  # the same with the head's maths in PyTorch ops (no Triton kernels)
        from bench_train import bench_train_mfu

        results.section("train_1p7b_torch_head", lambda: bench_train_mfu(results, args.model, "1p7b",
                                                                         ceilings["tflops"], head_kernel="torch"))
    if "train" in sections:
        results.section("train_1p7b_padded", lambda: bench_train_mfu(results, args.model, "1p7b", ceilings["tflops"],
                                                                     packed=False))
        # without recomputation 16k-token micro-batches ran out of memory on the H200 (2026-11-29: 134 GiB allocated
        # when it asked for 10 more), so this variant uses 8k
        results.section("train_1p7b_no_ckpt", lambda: bench_train_mfu(results, args.model, "1p7b", ceilings["tflops"],
                                                                      checkpointing=False, token_budget=8192))
    if {"train", "train4b"} & set(sections) and args.model_4b:  # train4b: the 4B figure alone
        from bench_train import bench_train_mfu

        results.section("train_4b", lambda: bench_train_mfu(results, args.model_4b, "4b", ceilings["tflops"],
                                                            token_budget=8192))  # 16k: logits + Adam > 140 GB
    if "train_liger" in sections:  # last: Liger patches the model type process-wide
        from bench_train import bench_train_mfu

        results.section("train_1p7b_liger", lambda: bench_train_mfu(results, args.model, "1p7b", ceilings["tflops"],
                                                                    liger=True))
        if args.model_4b:
            results.section("train_4b_liger", lambda: bench_train_mfu(results, args.model_4b, "4b",
                                                                      ceilings["tflops"], token_budget=8192,
                                                                      liger=True))
    if "train_gaps" in sections:  # the iteration config's update under torch's profiler: where its GPU idles
        from profile_train_gaps import train_gaps

        results.section("train_gaps", lambda: train_gaps(results, args.model, args.iteration_config,
                                                         list(args.iteration_flag)))
    if "sync4b" in sections and args.model_4b:
        from bench_vllm import bench_vllm

        results.section("sync4b", lambda: bench_vllm(results, args.model_4b, 0.0, 0, "sync", enforce_eager=True,
                                                     tag="4b"))
    run_memory_sections(results, args, sections, ceilings)


def run_memory_sections(results: Results, args, sections: list[str], ceilings: dict) -> None:
    """Issue #7's memory and iteration figures, issue #18's long context and issue 48's train memory."""
    if "memory" in sections:
        from bench_iteration import bench_memory

        gpu_total_gib = results.data["meta"]["versions"]["gpu_total_gib"]
        results.section("memory", lambda: bench_memory(results, args.model, args.work_dir, gpu_total_gib,
                                                                  args.memory_configs.split(",")))
    if "train_memory" in sections:  # the actor's update at the iteration config's shape, allocation by allocation
        from bench_train_memory import bench_train_memory

        results.section("train_memory", lambda: bench_train_memory(results, args.model, args.iteration_config,
                                                                   list(args.iteration_flag)))
    if "long_context" in sections:
        from bench_long_context import bench_long_context

        gpu_total_gib = results.data["meta"]["versions"]["gpu_total_gib"]
        results.section("long_context", lambda: bench_long_context(results, args.model_4b, gpu_total_gib,
                                                                   ceilings["tflops"]))
    if "iteration" in sections:
        from bench_iteration import bench_iteration

        gpu_total_gib = results.data["meta"]["versions"].get("gpu_total_gib")
        results.section("iteration", lambda: bench_iteration(results, args.model, args.work_dir,
                                                             tuple(args.iteration_flag),
                                                             measure_copy_gbps=device_copy_gbps,
                                                             config_name=args.iteration_config,
                                                             gpu_total_gib=gpu_total_gib))

if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"[bench] done in {time.perf_counter() - started:.1f} s")
    sys.exit(code)
