"""Peer benchmark (issue 17): OpenRLHF 0.11.2's `openrlhf.cli.train_ppo_ray` (the seed's own trainer) at our
iteration benchmark's shape on one GPU: `--train.colocate_all` (actor, reference and one vLLM engine share the GPU),
`--vllm.enable_sleep --ds.enable_sleep`, ZeRO-2 bf16, packed samples in dynamic token-budget micro-batches, gradient
checkpointing, the same reward file, three steps (`--data.max_samples` = 3 rollout batches).

It runs as a child process whose output streams into the log; every `✨ Global step N: {...}` line its PPOTrainer
logs is stamped on arrival and parsed. Figures (run_all.py's layout, via step_figures): the wall between consecutive
step lines (steps 2–3 count) and per step OpenRLHF's own timings (`timing/generation`, `make_experience`,
`ppo_train`, `broadcast`; `other` = wall − these). OpenRLHF imports `flash_attn` at module top and no flash-attn
wheel runs on the GPU machine: benchmarks/peers/flash_attn_standin serves its calls with PyTorch's varlen attention
(see its package docstring); `TORCH_CUDA_ARCH_LIST=9.0` lets DeepSpeed's FusedAdam JIT build parse the arch.
Usage (on the GPU machine, wheels from fetch_wheels.sh installed; see run_peers.sh):
  python3 benchmarks/peers/openrlhf_ppo.py --model DIR --out FILE.json --log FILE.log [--timeout-s 540]
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration_shape import IterationShape, read_iteration_shape  # noqa: E402
from step_figures import open_results, record_steps  # noqa: E402

STANDIN_DIR = Path(__file__).resolve().parent / "flash_attn_standin"
STEP_LINE = re.compile(r"Global step (\d+): (\{.*\})")
NUMBER_ITEM = re.compile(r"'([^']+)': (?:[\w.]+\()?(-?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf))")
STAGES = {"timing/generation": "generation", "timing/make_experience": "make_experience",
          "timing/ppo_train": "ppo_train", "timing/broadcast": "broadcast"}
HOW = ("openrlhf.cli.train_ppo_ray, one GPU, --train.colocate_all, --vllm.enable_sleep --ds.enable_sleep, ZeRO-2 "
       "bf16, packed + dynamic batch, {checkpointing}, the letters reward file; flash_attn from "
       "benchmarks/peers/flash_attn_standin (PyTorch varlen attention; no flash_attn.ops, so OpenRLHF's logprobs take "
       "its torch fallback); TORCH_CUDA_ARCH_LIST=9.0 for DeepSpeed's FusedAdam JIT build")


def openrlhf_argv(shape: IterationShape, model_dir: Path, work_dir: Path) -> list[str]:
    """train_ppo_ray's command line for `shape` on one GPU (OpenRLHF 0.11's dotted flags, which our config mirrors)."""
    flags = {
        "--actor.num_nodes": 1, "--actor.num_gpus_per_node": 1, "--ref.num_nodes": 1, "--ref.num_gpus_per_node": 1,
        "--vllm.num_engines": 1, "--vllm.tensor_parallel_size": 1,
        "--vllm.gpu_memory_utilization": shape.vllm_gpu_memory_utilization,
        "--actor.model_name_or_path": model_dir, "--reward.remote_url": shape.reward_file,
        "--data.prompt_dataset": shape.prompt_file, "--data.input_key": shape.input_key,
        "--data.label_key": shape.label_key, "--data.max_len": shape.max_len,
        # three rollout batches of prompts = three steps (OpenRLHF has no max-steps flag)
        "--data.max_samples": shape.prompts_per_step * shape.num_steps,
        "--rollout.batch_size": shape.prompts_per_step, "--rollout.n_samples_per_prompt": shape.samples_per_prompt,
        "--rollout.micro_batch_size": shape.micro_batch_size, "--rollout.max_new_tokens": shape.max_new_tokens,
        "--rollout.temperature": shape.temperature,
        "--train.batch_size": shape.train_batch_size, "--train.micro_batch_size": shape.micro_batch_size,
        "--train.max_tokens_per_gpu": shape.max_tokens_per_gpu, "--train.max_epochs": 1, "--train.num_episodes": 1,
        "--train.seed": shape.seed, "--ds.zero_stage": shape.zero_stage, "--ds.param_dtype": shape.param_dtype,
        "--actor.adam.lr": shape.lr, "--actor.lr_scheduler": shape.lr_scheduler,
        "--algo.advantage.estimator": shape.advantage_estimator, "--algo.kl.init_coef": shape.kl_coef,
        "--algo.kl.estimator": shape.kl_estimator, "--logger.logging_steps": 1,
        "--ckpt.output_dir": work_dir / "model", "--ckpt.path": work_dir / "ckpt",
    }
    switches = ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep", "--ds.packing_samples",
                "--train.dynamic_batch_enable", "--algo.kl.use_loss", "--data.apply_chat_template"]
    if shape.gradient_checkpointing:
        switches.append("--actor.gradient_checkpointing_enable")
    argv = [sys.executable, "-m", "openrlhf.cli.train_ppo_ray"]
    for flag, value in flags.items():
        argv += [flag, str(value)]
    return argv + switches


def parse_step_line(line: str) -> tuple[int, dict[str, float]] | None:
    """(step, its numeric status items) from a PPOTrainer `Global step N: {...}` log line, else None. The status is a
    dict's repr; its numbers are read item by item (also inside `tensor(...)` or `np.float64(...)`), so a value
    that is no literal spoils nothing."""
    found = STEP_LINE.search(line)
    if found is None:
        return None
    return int(found.group(1)), {key: float(value) for key, value in NUMBER_ITEM.findall(found.group(2))}


class StepLog:
    """The step lines seen so far: each step's arrival time, status and stages; results written after each."""

    def __init__(self, results, started: float):
        self.results, self.started = results, started
        self.arrived: dict[int, float] = {}
        self.status: dict[int, dict[str, float]] = {}

    def on_line(self, line: str, now: float) -> None:
        parsed = parse_step_line(line)
        if parsed is None:
            return
        step, status = parsed
        self.arrived[step], self.status[step] = now, status
        if len(self.arrived) == 1:
            self.results.figure("startup_s", now - self.started - status.get("timing/step_total", 0.0),
                                note="launch to step 1's line, less step 1's own timings")
        self.results.data["trials"]["openrlhf_status"] = self.status
        record_steps(self.results, self.walls(), self.stages())

    def walls(self) -> dict[int, float]:
        return {k: self.arrived[k] - self.arrived[k - 1] for k in sorted(self.arrived) if k - 1 in self.arrived}

    def stages(self) -> dict[int, dict[str, float]]:
        return {k: {name: status[key] for key, name in STAGES.items() if key in status}
                for k, status in self.status.items()}


def child_env(base: dict[str, str], torch_extensions_dir: Path) -> dict[str, str]:
    """The environment of OpenRLHF's driver (and so of its Ray workers): the flash_attn stand-in first on the path,
    DeepSpeed's JIT arch and cache, unbuffered UTF-8 output, offline hubs."""
    path = os.pathsep.join(p for p in (str(STANDIN_DIR), base.get("PYTHONPATH", "")) if p)
    return base | {"PYTHONPATH": path, "TORCH_CUDA_ARCH_LIST": "9.0", "TORCH_EXTENSIONS_DIR": str(torch_extensions_dir),
                   "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8", "RAY_AUTH_MODE": "disabled",
                   "RAY_DEDUP_LOGS": "0",  # every step line reaches the driver as it is logged
                   "RAY_USAGE_STATS_ENABLED": "0", "VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1",
                   "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                   "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


def run_streaming(argv: list[str], env: dict[str, str], log_path: Path, timeout_s: float, on_line) -> int | str:
    """Run `argv` in its own process group, each output line to `log_path` and `on_line(line, arrival time)`; the
    group is killed at `timeout_s`. Returns the exit code, or why it was cut off."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", encoding="utf-8") as log:
        child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 encoding="utf-8", errors="replace", bufsize=1, process_group=0)

        def pump() -> None:
            for line in child.stdout:
                arrived = time.perf_counter()
                log.write(line)
                log.flush()
                on_line(line, arrived)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = f"cut off after {timeout_s:.0f} s"
        finally:
            _kill_group(child)
        reader.join(timeout=10)
    return code


def _kill_group(child: subprocess.Popen) -> None:
    """End what the run left behind in its group (Ray's workers die with their driver; this catches the rest)."""
    for sig, grace_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path, help="the random-weight stand-in (build_tiny_model.py)")
    parser.add_argument("--out", required=True, type=Path, help="results JSON, rewritten after every step")
    parser.add_argument("--log", required=True, type=Path, help="OpenRLHF's whole output")
    parser.add_argument("--git-sha", default=os.environ.get("GIT_SHA", "unknown"))
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/peer-openrlhf"), help="checkpoints, JIT cache")
    parser.add_argument("--timeout-s", type=float, default=540.0, help="the run is killed after this many seconds")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"--model {args.model} has no config.json: build the stand-in first "
                         f"(python3 data/build_tiny_model.py --standin Qwen/Qwen3-1.7B {args.model} --device cuda)")
    shape = read_iteration_shape()
    how = HOW.format(checkpointing=shape.checkpointing_words)
    results = open_results(args.out, peer="openrlhf", how=how, model_dir=args.model, shape=shape,
                           git_sha=args.git_sha, packages=("openrlhf", "ray", "torchdata"))
    command = openrlhf_argv(shape, args.model, args.work_dir)
    results.data["meta"]["openrlhf_command"] = " ".join(command[1:])
    steps = StepLog(results, time.perf_counter())
    code = run_streaming(command, child_env(dict(os.environ), args.work_dir / "torch_extensions"), args.log,
                         args.timeout_s, steps.on_line)
    if code != 0:
        tail = args.log.read_text(encoding="utf-8", errors="replace")[-2000:]
        results.data["errors"]["openrlhf"] = f"train_ppo_ray exited {code}; log tail:\n{tail}"
        results.write()
        print(f"[peers] OpenRLHF exited {code}; log {args.log}", flush=True)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
