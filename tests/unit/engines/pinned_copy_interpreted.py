"""Run under TRITON_INTERPRET=1 by `test_pinned_copy.py` (Triton's interpreter runs the kernel on CPU tensors):
`pinned_copy`'s kernel copies every byte of its source and no byte past its target. Exits non-zero with the first
mismatch; prints one line per case checked, and one for the warm-up's launches."""
from __future__ import annotations

import torch

from hybrid_core.engines.pinned_copy import launch_copy_kernel, warm_up_kernel

SENTINEL = 0xA5


def _case(num_bytes: int, block_words: int, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(num_bytes)
    source = torch.randint(0, 256, (num_bytes,), dtype=torch.uint8, generator=generator)
    padded = torch.full((num_bytes + 64,), SENTINEL, dtype=torch.uint8)
    target = padded[16:16 + num_bytes]
    launch_copy_kernel(target.view(dtype), source.view(dtype), block_words=block_words, num_warps=1)
    assert torch.equal(target, source), f"{num_bytes} bytes, block {block_words}: copy differs"
    untouched = torch.cat([padded[:16], padded[16 + num_bytes:]])
    assert bool((untouched == SENTINEL).all()), f"{num_bytes} bytes, block {block_words}: wrote past the target"
    print(f"ok {num_bytes} {block_words} {dtype}")


def main() -> None:
    _case(0, 256, torch.uint8)
    _case(4, 256, torch.uint8)
    _case(4 * 1000, 256, torch.uint8)  # 3 full blocks and a partial one
    _case(4 * 1024, 256, torch.int32)  # whole blocks only
    _case(2 * 777 * 2, 64, torch.bfloat16)
    assert warm_up_kernel(device="cpu") >= 0.0  # both word-count variants, one block each, stay inside the scratch
    print("ok warm up")


if __name__ == "__main__":
    main()
