"""`pinned_copy`'s kernel on the GPU: a pinned host buffer reaches the device byte for byte, into a reused block, into
one allocated right after a free of the same size (the wake after a sleep), at an offset into a larger block and
for sizes that are not a multiple of the kernel's block; the copy engine's path (long after a free, or
`HYBRID_WAKE_COPY=engine`) and a pageable source (not pinned) give the same bytes."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
GIB = 1 << 30


def _host(cuda, num_bytes: int):
    torch = cuda
    host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
    host.random_(0, 256, generator=torch.Generator().manual_seed(num_bytes))
    return host


def test_a_pinned_buffer_reaches_a_fresh_block_byte_for_byte(cuda):
    torch = cuda
    from hybrid_core.engines.pinned_copy import copy_pinned_to_device, sm_copy_applies

    host = _host(cuda, 2 * GIB + 48)  # 2 GiB and a partial kernel block
    previous = torch.full((host.numel(),), 7, dtype=torch.uint8, device="cuda")
    del previous
    torch.cuda.empty_cache()
    block = torch.empty(host.numel(), dtype=torch.uint8, device="cuda")
    assert sm_copy_applies(block, host, seconds_since_free=0.0)
    copy_pinned_to_device(block, host, seconds_since_free=0.0)
    torch.cuda.synchronize()
    assert torch.equal(block.cpu(), host)


def test_an_offset_target_gets_its_bytes_and_nothing_around_it_changes(cuda):
    torch = cuda
    from hybrid_core.engines.pinned_copy import copy_pinned_to_device

    host = _host(cuda, 64 * 1024 * 1024 + 16)
    outer = torch.full((host.numel() + 512,), 0xA5, dtype=torch.uint8, device="cuda")
    copy_pinned_to_device(outer[256:256 + host.numel()], host, seconds_since_free=0.0)
    torch.cuda.synchronize()
    assert torch.equal(outer[256:256 + host.numel()].cpu(), host)
    assert bool((outer[:256] == 0xA5).all()) and bool((outer[256 + host.numel():] == 0xA5).all())


def test_the_copy_engine_and_a_pageable_source_give_the_same_bytes(cuda, monkeypatch):
    torch = cuda
    from hybrid_core.engines.pinned_copy import copy_pinned_to_device, sm_copy_applies

    host = _host(cuda, 32 * 1024 * 1024)
    by_kernel = copy_pinned_to_device(torch.empty_like(host, device="cuda"), host, seconds_since_free=0.0)
    pageable = host.clone()
    assert not sm_copy_applies(torch.empty_like(host, device="cuda"), pageable, seconds_since_free=0.0)
    from_pageable = copy_pinned_to_device(torch.empty_like(host, device="cuda"), pageable, seconds_since_free=0.0)
    assert not sm_copy_applies(torch.empty_like(host, device="cuda"), host)  # no free told of: the copy engine
    long_after = copy_pinned_to_device(torch.empty_like(host, device="cuda"), host)
    monkeypatch.setenv("HYBRID_WAKE_COPY", "engine")
    assert not sm_copy_applies(torch.empty_like(host, device="cuda"), host, seconds_since_free=0.0)
    by_engine = copy_pinned_to_device(torch.empty_like(host, device="cuda"), host, seconds_since_free=0.0)
    torch.cuda.synchronize()
    assert torch.equal(by_kernel, by_engine) and torch.equal(by_kernel, from_pageable)
    assert torch.equal(by_kernel, long_after)
    assert torch.equal(by_kernel.cpu(), host)
