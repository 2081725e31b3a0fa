"""Whether two GPU-bound jobs of one step overlap on one GPU, and how (issue 48, target 4): a decode-like job
(CUDA-graphed steps of a 1.7B-shaped layer stack at a batch of 256 rows, and of 32 rows for a rollout's tail, each
row attending over a KV cache of CONTEXT tokens; it reads every weight and the whole cache each step, so it is bound
by memory bandwidth, as the iteration's generation is) beside a forward-like job (the same stack over 16,384 tokens
at a time on a second set of weights, the reference's logprob forward; bound by matmul throughput).

Modes, every one in fresh child processes so that no mode inherits another's memory or context:
- `alone`: each job by itself, the baseline;
- `streams`: both jobs in one process on two CUDA streams (what a reference forward inside vLLM's process would get);
- `processes`: each job in its own process, started together (what two Ray actors sharing the GPU get today: the
  driver time-slices their contexts);
- `mps`: as `processes`, under an MPS control daemon of its own pipe directory. Only with PROBE_OVERLAP_MPS=1 and
  `nvidia-cuda-mps-control` on the PATH; the daemon is stopped at the end (`quit`).

Figures per mode and decode batch: the wall of both jobs, each job's own finish, and the saving: the seconds of the
shorter job that the overlap hid, as a fraction of that job alone (1.0: hidden whole; 0.0: no better than serial).
Only torch is needed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

HIDDEN, INTER, QKV, VOCAB, LAYERS = 2048, 6144, 4096, 151936, 28  # Qwen3-1.7B: q 2048 + k 1024 + v 1024
HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
CONTEXT = 560  # the iteration's mean decode context (prompt + half the response)
FORWARD_TOKENS, HEAD_CHUNK = 16384, 4096
DECODE_STEPS = {256: 300, 32: 1000}  # decode batch → steps: about 2 s alone on an H100, as are the forwards
FORWARDS = 20
CHILD_TIMEOUT_S = 300


def overlap_summary(alone: dict, together: dict) -> dict:
    """The figures of one mode. `alone`: each job's seconds by itself; `together`: each job's finish, in seconds
    from the common start, when both ran at once. The saving is serial minus overlapped wall, over the shorter
    job's alone time, bounded to [0, 1] only by the measurement."""
    serial = alone["decode"] + alone["forward"]
    wall = max(together["decode"], together["forward"])
    shorter = min(alone["decode"], alone["forward"])
    return {"wall_s": wall, "serial_s": serial, "saving_fraction": (serial - wall) / shorter,
            "decode_slowdown": together["decode"] / alone["decode"],
            "forward_slowdown": together["forward"] / alone["forward"]}


def _stack(seed: int):
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)

    def weight(rows: int, cols: int):
        return torch.randn(rows, cols, generator=generator, device="cuda", dtype=torch.bfloat16) * rows**-0.5

    layers = [(weight(HIDDEN, QKV), weight(HIDDEN, HIDDEN), weight(HIDDEN, 2 * INTER), weight(INTER, HIDDEN))
              for _ in range(LAYERS)]
    return layers, weight(HIDDEN, VOCAB)


def _kv_cache(batch: int):
    """Each layer's (keys, values), (batch · KV_HEADS, CONTEXT, HEAD_DIM) each: 16.4 GB at a batch of 256."""
    import torch

    shape = (batch * KV_HEADS, CONTEXT, HEAD_DIM)
    return [(torch.randn(shape, device="cuda", dtype=torch.bfloat16),
             torch.randn(shape, device="cuda", dtype=torch.bfloat16)) for _ in range(LAYERS)]


def _run_stack(x, stack, chunk: int, kv=None):
    """The layer stack's matmuls over `x` (rows × HIDDEN), each row's query heads attending over its cached keys
    and values when `kv` is given (a decode step), then the head chunk by chunk, each reduced to its row maximum so
    no full logits tensor is kept."""
    layers, head = stack
    for index, (qkv, out, gate_up, down) in enumerate(layers):
        attended = (x @ qkv)[:, :HIDDEN]
        if kv is not None:
            keys, values = kv[index]
            queries = attended.reshape(x.shape[0] * KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
            scores = (queries @ keys.transpose(1, 2) * HEAD_DIM**-0.5).softmax(dim=-1)
            attended = (scores @ values).reshape(x.shape[0], HIDDEN)
        x = ((attended @ out) @ gate_up)[:, :INTER] @ down
    return [(x[i:i + chunk] @ head).amax(dim=1) for i in range(0, x.shape[0], chunk)]


class Jobs:
    """The two jobs of this process: a captured decode step of `batch` rows and a forward of FORWARD_TOKENS."""

    def __init__(self, batch: int, roles: tuple[str, ...]):
        import torch

        self.graph = self.tokens = None
        if "decode" in roles:
            self.decode_stack, self.kv = _stack(seed=1), _kv_cache(batch)
            self.rows = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.bfloat16)
            self.steps = DECODE_STEPS[batch]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # warm the kernels before the capture
                    _run_stack(self.rows, self.decode_stack, batch, self.kv)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                _run_stack(self.rows, self.decode_stack, batch, self.kv)
        if "forward" in roles:
            self.forward_stack = _stack(seed=2)
            self.tokens = torch.randn(FORWARD_TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16)
            self.forward()
        torch.cuda.synchronize()

    def decode(self, steps: int) -> None:
        for _ in range(steps):
            self.graph.replay()

    def forward(self) -> None:
        _run_stack(self.tokens, self.forward_stack, HEAD_CHUNK)


def _child(mode: str, roles: tuple[str, ...], batch: int, barrier, results) -> None:
    """One child process: build its jobs, wait for its sibling, run, and put {role: seconds} on `results`."""
    try:
        jobs = Jobs(batch, roles)
        barrier.wait(timeout=CHILD_TIMEOUT_S)
        results.put(_two_streams(jobs) if mode == "streams" else _one_job(jobs, roles[0]))
    except Exception as error:  # noqa: BLE001 — the parent raises it with the mode's name
        results.put({"error": f"{type(error).__name__}: {error}"})


def _one_job(jobs: Jobs, role: str) -> dict:
    import torch

    start = time.perf_counter()
    if role == "decode":
        jobs.decode(jobs.steps)
    else:
        for _ in range(FORWARDS):
            jobs.forward()
    torch.cuda.synchronize()
    return {role: time.perf_counter() - start}


def _two_streams(jobs: Jobs) -> dict:
    """Both jobs from this process: each forward on one stream, the decode steps interleaved with them on another,
    so both streams stay fed; each job's finish timed by an event on its stream."""
    import torch

    decode_stream, forward_stream = torch.cuda.Stream(), torch.cuda.Stream()
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    for stream in (decode_stream, forward_stream):
        stream.wait_event(start)
    per_forward = jobs.steps // FORWARDS
    for _ in range(FORWARDS):
        with torch.cuda.stream(forward_stream):
            jobs.forward()
        with torch.cuda.stream(decode_stream):
            jobs.decode(per_forward)
    with torch.cuda.stream(decode_stream):
        jobs.decode(jobs.steps - per_forward * FORWARDS)
    ends = {}
    for role, stream in (("decode", decode_stream), ("forward", forward_stream)):
        ends[role] = torch.cuda.Event(enable_timing=True)
        ends[role].record(stream)
    torch.cuda.synchronize()
    return {role: start.elapsed_time(end) / 1e3 for role, end in ends.items()}


def _spawn(mode: str, groups: list[tuple[str, ...]], batch: int, env: dict | None = None) -> dict:
    """Run one child per group of roles, started together; their {role: seconds} merged."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(len(groups)), context.Queue()
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        children = [context.Process(target=_child, args=(mode, roles, batch, barrier, results)) for roles in groups]
        for child in children:
            child.start()
        merged = _collect(children, results)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if "error" in merged:
        raise RuntimeError(f"mode {mode}, decode batch {batch}: {merged['error']}")
    return merged


def _collect(children, results) -> dict:
    """Each child's one answer, merged; a child that dies without answering (a crash in CUDA) fails the mode now
    rather than at the timeout."""
    import queue

    merged, answers, deadline = {}, 0, time.monotonic() + CHILD_TIMEOUT_S
    while answers < len(children):
        try:
            merged |= results.get(timeout=5)
            answers += 1
        except queue.Empty:
            dead = [child.exitcode for child in children if child.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                merged["error"] = f"a child exited with {dead} before answering" if dead else "timed out"
                break
    for child in children:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    return merged


def _mps_daemon(pipe_dir: str):
    """Start an MPS control daemon of its own pipe and log directories; returns the clients' environment and its
    stop function, or None when the binary is not on the PATH."""
    binary = shutil.which("nvidia-cuda-mps-control")
    if binary is None:
        return None
    env = {"CUDA_MPS_PIPE_DIRECTORY": f"{pipe_dir}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{pipe_dir}/log"}
    for path in env.values():
        os.makedirs(path, exist_ok=True)
    subprocess.run([binary, "-d"], env=os.environ | env, check=True, timeout=30)
    stop = lambda: subprocess.run([binary], input="quit\n", text=True, env=os.environ | env, timeout=30)  # noqa: E731
    return env, stop


def _modes(batch: int, mps_env: dict | None) -> dict:
    """Every mode at decode batch `batch`: {mode: summary}, with the alone seconds."""
    alone = _spawn("alone", [("decode",)], batch) | _spawn("alone", [("forward",)], batch)
    found = {"alone": alone,
             "streams": overlap_summary(alone, _spawn("streams", [("decode", "forward")], batch)),
             "processes": overlap_summary(alone, _spawn("processes", [("decode",), ("forward",)], batch))}
    if mps_env is not None:
        found["mps"] = overlap_summary(alone, _spawn("mps", [("decode",), ("forward",)], batch, env=mps_env))
    return found


def probe_gpu_overlap(results) -> None:
    """The section's figures: `overlap_<mode>_b<batch>_saving` with each mode's summary as its trials."""
    daemon = _mps_daemon("/tmp/probe-overlap-mps") if os.environ.get("PROBE_OVERLAP_MPS") == "1" else None
    if os.environ.get("PROBE_OVERLAP_MPS") == "1" and daemon is None:
        results.figure("overlap_mps_available", False, note="nvidia-cuda-mps-control is not on the PATH")
    try:
        for batch in DECODE_STEPS:
            found = _modes(batch, daemon[0] if daemon else None)
            results.figure(f"overlap_alone_b{batch}_s", found.pop("alone"),
                           note=f"seconds alone: {DECODE_STEPS[batch]} decode steps of {batch} rows over "
                                f"{CONTEXT} cached tokens each; {FORWARDS} forwards of {FORWARD_TOKENS} tokens")
            for mode, summary in found.items():
                results.figure(f"overlap_{mode}_b{batch}_saving", summary["saving_fraction"], trials=summary,
                               note="the shorter job's alone seconds hidden by running both at once (1: all)")
    finally:
        if daemon is not None:
            daemon[1]()
