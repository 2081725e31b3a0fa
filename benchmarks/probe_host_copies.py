"""Where a large pinned host-to-device copy loses speed on this machine (DeepSpeed's wake copies 20.6 GB at 48–49
GB/s against 53–55 GB/s for a 4 GB copy, s29): the same copy by size, by where the host buffer came from (torch's
pinned allocator in this thread or in a background thread, or anonymous memory advised to transparent huge pages
and registered with cudaHostRegister), into a reused or a fresh device block, whole or in chunks on one or two
streams. GB/s are the slowest of `TRIALS` copies. Also records the machine's NUMA layout and huge-page settings.
Only torch is needed (no DeepSpeed, no vLLM).
"""
from __future__ import annotations

import mmap
import subprocess
import threading
import time
from pathlib import Path

STATE_BYTES, TRIALS = 20_646_899_712, 3  # the 1.7B shape's optimizer states (s29)
SIZES_GB = (1, 4, 8, 16)


def _gbps(copy, num_bytes: int) -> list[float]:
    import torch

    copy()
    torch.cuda.synchronize()
    rates = []
    for _ in range(TRIALS):
        start = time.perf_counter()
        copy()
        torch.cuda.synchronize()
        rates.append(num_bytes / 1e9 / (time.perf_counter() - start))
    return rates


def _chunked(device, host, chunk: int, streams: list):
    import torch

    def copy() -> None:
        for index, start in enumerate(range(0, host.numel(), chunk)):
            with torch.cuda.stream(streams[index % len(streams)]):
                device[start:start + chunk].copy_(host[start:start + chunk], non_blocking=True)
    return copy


def machine_layout() -> dict:
    """NUMA nodes, the GPU's node, transparent huge pages and reserved huge pages."""
    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError as error:
            return f"unreadable: {error}"

    topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=False).stdout
    nodes = sorted(p.name for p in Path("/sys/devices/system/node").glob("node[0-9]*"))
    return {"numa_nodes": nodes, "thp": read("/sys/kernel/mm/transparent_hugepage/enabled"),
            "hugepages_total": read("/proc/sys/vm/nr_hugepages"), "nvidia_smi_topo": topo[-1500:]}


def _background_pinned(num_bytes: int):
    import torch

    box = {}
    thread = threading.Thread(target=lambda: box.update(t=torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)))
    thread.start()
    thread.join()
    return box["t"]


def _huge_page_registered(num_bytes: int):
    """Anonymous memory advised to transparent huge pages, touched, then page-locked with cudaHostRegister."""
    import torch

    region = mmap.mmap(-1, num_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    host = torch.frombuffer(region, dtype=torch.uint8)
    host.zero_()
    status = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), num_bytes, 0)
    return region, host, int(status)


def probe_host_copies(results) -> None:
    import torch

    results.figure("h2d_machine_layout", machine_layout())
    started = time.perf_counter()
    host = torch.empty(STATE_BYTES, dtype=torch.uint8, pin_memory=True)
    results.figure("h2d_pin_seconds", time.perf_counter() - started, note=f"{STATE_BYTES / 1e9:.1f} GB, this thread")
    device = torch.empty(STATE_BYTES, dtype=torch.uint8, device="cuda")
    for size in SIZES_GB:
        n = size * 10**9
        rates = _gbps(lambda: device[:n].copy_(host[:n], non_blocking=True), n)
        results.figure(f"h2d_gbps_{size}gb", min(rates), trials=rates)
    rates = _gbps(lambda: device.copy_(host, non_blocking=True), STATE_BYTES)
    results.figure("h2d_gbps_state_size", min(rates), trials=rates, note="one copy of the states' size, reused block")
    side = [torch.cuda.Stream(), torch.cuda.Stream()]
    for chunk_mb in (64, 512):
        for count in (1, 2):
            rates = _gbps(_chunked(device, host, chunk_mb << 20, side[:count]), STATE_BYTES)
            results.figure(f"h2d_gbps_chunks_{chunk_mb}mb_{count}_streams", min(rates), trials=rates)
    del device

    def fresh() -> None:
        block = torch.empty(STATE_BYTES, dtype=torch.uint8, device="cuda")
        block.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        del block
        torch.cuda.empty_cache()
    rates = _gbps(fresh, STATE_BYTES)
    results.figure("h2d_gbps_fresh_block", min(rates), trials=rates, note="cudaMalloc'd anew before every copy")
    _probe_fresh_blocks(results, host)
    del host
    _probe_other_buffers(results)


def _fresh_copy_seconds(host, prepare: str) -> dict:
    """One copy into a block cudaMalloc'd just before: the allocation, `prepare` (nothing, a 0.5 s pause, a memset,
    or two streams of 512 MB chunks for the copy) and the copy timed apart."""
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    block = torch.empty(STATE_BYTES, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    allocated = time.perf_counter()
    if prepare == "pause":
        time.sleep(0.5)
    elif prepare == "memset":
        block.zero_()
    torch.cuda.synchronize()
    prepared = time.perf_counter()
    if prepare == "two_streams":
        _chunked(block, host, 512 << 20, [torch.cuda.Stream(), torch.cuda.Stream()])()
    else:
        block.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    copied = time.perf_counter()
    del block
    torch.cuda.empty_cache()
    return {"allocate_s": allocated - start, "prepare_s": prepared - allocated, "copy_s": copied - prepared,
            "copy_gbps": STATE_BYTES / 1e9 / (copied - prepared)}


def _probe_fresh_blocks(results, host) -> None:
    for prepare in ("none", "pause", "memset", "two_streams"):
        trials = [_fresh_copy_seconds(host, prepare) for _ in range(TRIALS)]
        results.figure(f"h2d_fresh_block_{prepare}", min(t["copy_gbps"] for t in trials), trials=trials,
                       note="GB/s of the copy alone into a block allocated just before (the wake's case)")


def _probe_other_buffers(results) -> None:
    import torch

    device = torch.empty(STATE_BYTES, dtype=torch.uint8, device="cuda")
    threaded = _background_pinned(STATE_BYTES)
    rates = _gbps(lambda: device.copy_(threaded, non_blocking=True), STATE_BYTES)
    results.figure("h2d_gbps_pinned_in_thread", min(rates), trials=rates)
    del threaded
    started = time.perf_counter()
    region, host, status = _huge_page_registered(STATE_BYTES)
    results.figure("h2d_huge_page_register", {"status": status, "seconds": time.perf_counter() - started})
    if status == 0:
        rates = _gbps(lambda: device.copy_(host, non_blocking=True), STATE_BYTES)
        results.figure("h2d_gbps_huge_page_registered", min(rates), trials=rates)
        torch.cuda.cudart().cudaHostUnregister(host.data_ptr())
    del host
    region.close()
