"""Host-to-device copies of page-locked memory by the GPU's streaming multiprocessors instead of its copy engines,
for the moments when the copy engines are slow.

Owns one Triton kernel that reads a pinned host buffer through unified addressing (a pinned allocation is mapped into
the device's address space) and writes a device block, and which copies take it (`sm_copy_applies`). On an H200
(PCIe 5) a copy engine moves a 20.6 GB pinned buffer at 55 GB/s and the kernel at 51 (its reads go out in 128-byte
requests). Right after a large free the driver's clean-up of the freed memory shares the copy engines: the copy
engine's rate into a fresh block was 43.6–45.6 GB/s at once, 46.7 after 10 ms, 52.1 after 50 ms and 55 after
100 ms, while the kernel kept 49.3–50.2 (s31 probe, `benchmarks/probe_wake_copy.py`). So by default (`auto`) the
kernel copies only when the caller freed memory less than `DRIVER_BUSY_S` before; `--ds.wake_copy sm` or `engine`
forces one way.
It knows nothing about optimizers, DeepSpeed or what the bytes are, nor about frees other than the one it is told of.
"""
from __future__ import annotations

import math
import time

import torch
import triton
import triton.language as tl

from hybrid_core.switches import switch_value

DRIVER_BUSY_S = 0.03  # after a free, below this the kernel beats the copy engine (the crossing of the s31 curves)
WORD_BYTES = 4  # the kernel moves int32 words; 4 per thread per load make a 16-byte access
ALIGN_BYTES = 16
BLOCK_WORDS = 16384  # 64 KB per program
NUM_WARPS = 8
WARM_UP_WORD_COUNTS = (BLOCK_WORDS, 2**31 + BLOCK_WORDS)  # Triton compiles one variant for 32-bit counts, one for 64


@triton.jit
def _copy_kernel(source_ptr, target_ptr, num_words, BLOCK_SIZE: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK_SIZE
    offsets = start + tl.arange(0, BLOCK_SIZE)
    inside = offsets < num_words
    words = tl.load(source_ptr + offsets, mask=inside, cache_modifier=".cg")
    tl.store(target_ptr + offsets, words, mask=inside, cache_modifier=".cs")


def copy_choice(configured: str | None = None) -> str:
    """How a pinned copy runs, `ds.wake_copy` (`configured`) as it applies (see `switches`): `auto` (the default:
    the kernel right after a free, else the copy engine), `sm` (the kernel) or `engine` (the copy engine's
    `copy_`)."""
    return switch_value("wake_copy", configured)


def sm_copy_applies(target: torch.Tensor, source: torch.Tensor, seconds_since_free: float = math.inf,
                    choice: str | None = None) -> bool:
    """The kernel takes a copy from a pinned host tensor to a CUDA tensor of the same bytes, both contiguous and
    16-byte aligned in address and size, when the choice (`ds.wake_copy`) is `sm`, or `auto` with the caller's last
    free less than `DRIVER_BUSY_S` ago."""
    choice = copy_choice(choice)
    wanted = choice == "sm" or (choice == "auto" and seconds_since_free < DRIVER_BUSY_S)
    return wanted and target.is_cuda and not source.is_cuda and source.is_pinned() \
        and target.is_contiguous() and source.is_contiguous() \
        and target.numel() * target.element_size() == source.numel() * source.element_size() \
        and all(t.data_ptr() % ALIGN_BYTES == 0 for t in (target, source)) \
        and (source.numel() * source.element_size()) % ALIGN_BYTES == 0


def copy_pinned_to_device(target: torch.Tensor, source: torch.Tensor, seconds_since_free: float = math.inf,
                          choice: str | None = None) -> torch.Tensor:
    """Copy `source` (pinned host) into `target` (CUDA) on the current stream: by the kernel where
    `sm_copy_applies`, else by `target.copy_(source, non_blocking=True)`. Returns `target`."""
    if not sm_copy_applies(target, source, seconds_since_free, choice):
        return target.copy_(source, non_blocking=True)
    return launch_copy_kernel(target, source)


def launch_copy_kernel(target: torch.Tensor, source: torch.Tensor, *, block_words: int = BLOCK_WORDS,
                       num_warps: int = NUM_WARPS) -> torch.Tensor:
    """The kernel's launch for two contiguous tensors of the same bytes, a multiple of 4; no check of where they
    live (Triton's interpreter runs it on CPU tensors). Returns `target`."""
    num_words = source.numel() * source.element_size() // WORD_BYTES
    if num_words > 0:
        _copy_kernel[(triton.cdiv(num_words, block_words),)](source.view(torch.int32), target.view(torch.int32),
                                                             num_words, BLOCK_SIZE=block_words, num_warps=num_warps)
    return target


def warm_up_kernel(device: str = "cuda") -> float:
    """Compile the kernel (or load it from Triton's cache) for word counts below and above 2**31, so that a wake's
    first copy does not pay for it (0.24 s of the first wake on the H200, s31b). Copies one block of zeros into a
    scratch block; returns the seconds taken."""
    start = time.perf_counter()
    source = torch.zeros(BLOCK_WORDS, dtype=torch.int32, pin_memory=device != "cpu")
    target = torch.empty(BLOCK_WORDS, dtype=torch.int32, device=device)
    for num_words in WARM_UP_WORD_COUNTS:  # one program: it copies the first block only, whatever the count says
        _copy_kernel[(1,)](source, target, num_words, BLOCK_SIZE=BLOCK_WORDS, num_warps=NUM_WARPS)
    if device != "cpu":
        torch.cuda.current_stream().synchronize()
    return time.perf_counter() - start
