"""Host-to-device copies of page-locked memory by the GPU's streaming multiprocessors instead of its copy engines.

Owns one Triton kernel that reads a pinned host buffer through unified addressing (a pinned allocation is mapped into
the device's address space) and writes a device block, and which copies take it (`sm_copy_applies`). A copy engine
moves a large pinned buffer at the link's rate (55 GB/s on an H200's PCIe 5) into a reused block, but into a block
allocated just after another was freed it ran at 48.9 GB/s (s30 probe): the driver's work on the freed memory shares
the copy engines for about half a second. The kernel does not use them. `HYBRID_WAKE_COPY=engine` keeps the copy
engine's `copy_`; any other value than `sm` or `engine` is refused.
It knows nothing about optimizers, DeepSpeed or what the bytes are.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

COPY_ENV = "HYBRID_WAKE_COPY"
COPY_CHOICES = ("sm", "engine")
WORD_BYTES = 4  # the kernel moves int32 words; 4 per thread per load make a 16-byte access
ALIGN_BYTES = 16
BLOCK_WORDS = 16384  # 64 KB per program
NUM_WARPS = 8


@triton.jit
def _copy_kernel(source_ptr, target_ptr, num_words, BLOCK_SIZE: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK_SIZE
    offsets = start + tl.arange(0, BLOCK_SIZE)
    inside = offsets < num_words
    words = tl.load(source_ptr + offsets, mask=inside, cache_modifier=".cg")
    tl.store(target_ptr + offsets, words, mask=inside, cache_modifier=".cs")


def copy_choice() -> str:
    """Which way a wake's copy runs: `sm` (the kernel, the default) or `engine` (the copy engine's `copy_`)."""
    choice = os.environ.get(COPY_ENV, "sm")
    if choice not in COPY_CHOICES:
        raise ValueError(f"{COPY_ENV} must be one of {list(COPY_CHOICES)}: got {choice!r}; unset it for the default "
                         "'sm' (streaming multiprocessors) or set 'engine' for the copy engine")
    return choice


def sm_copy_applies(target: torch.Tensor, source: torch.Tensor) -> bool:
    """The kernel takes a copy from a pinned host tensor to a CUDA tensor of the same bytes, both contiguous and
    16-byte aligned in address and size, unless the copy engine is asked for."""
    return copy_choice() == "sm" and target.is_cuda and not source.is_cuda and source.is_pinned() \
        and target.is_contiguous() and source.is_contiguous() \
        and target.numel() * target.element_size() == source.numel() * source.element_size() \
        and all(t.data_ptr() % ALIGN_BYTES == 0 for t in (target, source)) \
        and (source.numel() * source.element_size()) % ALIGN_BYTES == 0


def copy_pinned_to_device(target: torch.Tensor, source: torch.Tensor, *, block_words: int = BLOCK_WORDS,
                          num_warps: int = NUM_WARPS) -> torch.Tensor:
    """Copy `source` (pinned host) into `target` (CUDA) on the current stream: by the kernel where
    `sm_copy_applies`, else by `target.copy_(source, non_blocking=True)`. Returns `target`."""
    if not sm_copy_applies(target, source):
        return target.copy_(source, non_blocking=True)
    return launch_copy_kernel(target, source, block_words=block_words, num_warps=num_warps)


def launch_copy_kernel(target: torch.Tensor, source: torch.Tensor, *, block_words: int = BLOCK_WORDS,
                       num_warps: int = NUM_WARPS) -> torch.Tensor:
    """The kernel's launch for two contiguous tensors of the same bytes, a multiple of 4; no check of where they
    live (Triton's interpreter runs it on CPU tensors). Returns `target`."""
    num_words = source.numel() * source.element_size() // WORD_BYTES
    if num_words > 0:
        _copy_kernel[(triton.cdiv(num_words, block_words),)](source.view(torch.int32), target.view(torch.int32),
                                                             num_words, BLOCK_SIZE=block_words, num_warps=num_warps)
    return target
