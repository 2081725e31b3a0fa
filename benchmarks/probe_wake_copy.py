"""Whether the wake's copy beats the driver's slowdown after a free by running on the streaming multiprocessors: a
20.6 GB pinned buffer (the 1.7B shape's optimizer states) copied into a reused block and into a block allocated
just after a block of the same size was freed (the wake right after a sleep), by the copy engine (`copy_`), by
`pinned_copy`'s kernel (several block sizes and warp counts) and split between the two on two streams; and how
long the slowdown lasts (the copy engine after pauses of 10–200 ms). GB/s per copy; every copy checked byte for
byte on sampled slices. Only torch and Triton are needed.
"""
from __future__ import annotations

import time

STATE_BYTES, TRIALS = 20_646_899_712, 3
KERNEL_CONFIGS = ((4096, 4), (16384, 8), (16384, 16), (65536, 16))


def _check(device, host) -> bool:
    import torch

    step = host.numel() // 8
    return all(torch.equal(device[s:s + (1 << 20)].cpu(), host[s:s + (1 << 20)])
               for s in range(0, host.numel() - (1 << 20), step))


def _method(name: str, host):
    import torch

    from hybrid_core.engines.pinned_copy import launch_copy_kernel

    if name == "engine":
        return lambda block: block.copy_(host, non_blocking=True)
    if name.startswith("sm"):
        block_words, warps = (int(x) for x in name.split("_")[1:])
        return lambda block: launch_copy_kernel(block, host, block_words=block_words, num_warps=warps)
    share = float(name.split("_")[1])  # split_F: the kernel moves the first F of the bytes, the engine the rest
    side = torch.cuda.Stream()
    cut = int(host.numel() * share) // 256 * 256

    def split(block) -> None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            launch_copy_kernel(block[:cut], host[:cut])
        block[cut:].copy_(host[cut:], non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)
    return split


def _reused(results, host, names) -> None:
    import torch

    block = torch.empty(STATE_BYTES, dtype=torch.uint8, device="cuda")
    for name in names:
        copy = _method(name, host)
        copy(block)
        torch.cuda.synchronize()
        rates = []
        for _ in range(TRIALS):
            block.zero_()
            torch.cuda.synchronize()
            start = time.perf_counter()
            copy(block)
            torch.cuda.synchronize()
            rates.append(STATE_BYTES / 1e9 / (time.perf_counter() - start))
        results.figure(f"wake_copy_reused_{name}", min(rates), trials=rates + [_check(block, host)],
                       note="GB/s into a reused block; last trial entry: bytes checked equal")
    del block
    torch.cuda.empty_cache()


def _after_free(host, copy, pause_s: float) -> dict:
    """Free a block of the states' size, optionally pause, allocate a fresh one and copy into it."""
    import torch

    previous = torch.empty(STATE_BYTES, dtype=torch.uint8, device="cuda")
    previous.fill_(1)
    torch.cuda.synchronize()
    del previous
    torch.cuda.empty_cache()
    time.sleep(pause_s)
    block = torch.empty(STATE_BYTES, dtype=torch.uint8, device="cuda")
    start = time.perf_counter()
    copy(block)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    equal = _check(block, host)
    del block
    torch.cuda.empty_cache()
    return {"gbps": STATE_BYTES / 1e9 / seconds, "equal": equal}


def _fresh(results, host, names, pauses=(0.0,)) -> None:
    for name in names:
        copy = _method(name, host)
        for pause in pauses:
            trials = [_after_free(host, copy, pause) for _ in range(TRIALS)]
            label = f"wake_copy_fresh_{name}" + (f"_pause_{int(pause * 1000)}ms" if pause else "")
            results.figure(label, min(t["gbps"] for t in trials), trials=trials,
                           note="GB/s into a block allocated right after a free of the same size")


def probe_wake_copy(results) -> None:
    import torch

    started = time.perf_counter()
    host = torch.empty(STATE_BYTES, dtype=torch.uint8, pin_memory=True)
    host[: 1 << 30].random_(0, 256)
    for start in range(1 << 30, STATE_BYTES, 1 << 30):  # every GiB a different pattern, cheap to write
        host[start:start + (1 << 30)].copy_(host[: min(1 << 30, STATE_BYTES - start)].roll(start >> 30))
    results.figure("wake_copy_host_setup_s", time.perf_counter() - started)
    kernels = [f"sm_{w}_{n}" for w, n in KERNEL_CONFIGS]
    _reused(results, host, ["engine"] + kernels)
    best = max(kernels, key=lambda n: results.data["figures"][f"wake_copy_reused_{n}"])
    results.figure("wake_copy_best_kernel", best)
    _fresh(results, host, ["engine", best, "split_0.1", "split_0.2"])
    _fresh(results, host, ["engine"], pauses=(0.01, 0.05, 0.1, 0.2))
    _reused(results, host, ["split_0.1"])
