"""DeepSpeed sleep on a GPU: optimizer states and fp32 master weights to persistent pinned host memory and back.

Owns one page-locked host buffer per train engine, allocated once when the worker starts (in a background thread,
overlapped with model loading), and the moves: sleep copies every state into that buffer (on a side stream, so the
caller's next GPU work can run beside the copy) and frees the GPU copies once it is done; wake allocates one GPU
block, copies the whole buffer back in one transfer (right after the sleep's free by `pinned_copy`'s kernel on the
multiprocessors, which the driver's clean-up of the freed memory does not slow) and points the states at views of it.
DeepSpeed's own `offload_states` allocates pinned memory on its first call (17–23 s for 20 GB on an H200) and per
tensor afterwards, and under ZeRO-3 it refuses a torch optimizer (it moves only its FusedAdam's states); this avoids
all three. The bf16 weights stay on the GPU. It knows nothing about RL, Ray or vLLM.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

import torch

ALIGN = 256  # bytes: every state starts on a boundary that any dtype view accepts


def state_bytes_per_param(param_dtype: str) -> int:
    """Host bytes one trainable parameter needs asleep: Adam's two fp32 moments, plus an fp32 master copy when the
    weights are trained in 16 bits."""
    return 8 + (0 if param_dtype == "fp32" else 4)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class PinnedHostBuffer:
    """A page-locked host byte buffer, allocated through torch's pinned allocator in a background thread.

    (Registering plain memory with cudaHostRegister is exact-sized but leaves a stale registration behind when the
    memory is freed without unregistering; torch's allocator frees pinned memory correctly.)"""

    def __init__(self, num_bytes: int):
        self.num_bytes, self.tensor, self.error, self.seconds = _aligned(num_bytes), None, None, 0.0
        self._thread = threading.Thread(target=self._allocate, name="pinned-host-alloc", daemon=True)
        self._thread.start()

    def _allocate(self) -> None:
        start = time.perf_counter()
        try:
            self.tensor = torch.empty(self.num_bytes, dtype=torch.uint8, pin_memory=True)
        except Exception as error:  # noqa: BLE001 — re-raised in the caller's thread by `get`
            self.error = error
        self.seconds = time.perf_counter() - start

    def get(self) -> torch.Tensor:
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"allocating {self.num_bytes / 1e9:.1f} GB of pinned host memory for DeepSpeed sleep "
                               f"failed: {self.error}; lower the model size or turn off --ds.enable_sleep") \
                from self.error
        return self.tensor


@dataclass
class _Slot:
    """One state tensor's place: how to read and replace it, and where it lives in the flat layout."""

    get: object
    set: object
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: torch.Size


def fp32_partitions(zero_optimizer) -> list[torch.Tensor]:
    """A ZeRO optimizer's fp32 master partitions: one flat tensor per parameter group (ZeRO-1/2) or per sub-group
    (ZeRO-3); the wrapped torch optimizer steps these very tensors."""
    partitions = getattr(zero_optimizer, "single_partition_of_fp32_groups", None)
    return partitions if partitions is not None else zero_optimizer.fp32_partitioned_groups_flat


@dataclass(frozen=True)
class _Copy:
    """A sleep's device-to-host copy under way: its end on the side stream, its bytes and when it started."""

    done: torch.cuda.Event
    total: int
    started: float


class OptimizerStateMover:
    """Moves a ZeRO optimizer's fp32 master partitions and Adam states between the GPU and pinned host memory.

    `sleep` keeps the layout; `wake_up` restores each state as a view of one GPU block, and the next `sleep` moves
    that block back in one copy. `start_sleep` + `finish_sleep` are `sleep` in two halves, so that other GPU work
    runs while the copy does. DeepSpeed's fp32↔bf16 fragment links are cleared before and rebuilt after, as its
    own `offload_states` does.
    """

    def __init__(self, zero_optimizer, host: PinnedHostBuffer, wake_copy: str | None = None):
        self.opt, self.host, self.asleep, self._block = zero_optimizer, host, False, None
        self.wake_copy = wake_copy  # ds.wake_copy (None: unset, see `switches`)
        self.last_bytes, self.last_seconds, self.last_wake_seconds = 0, {}, {}
        self._stream: torch.cuda.Stream | None = None  # `_side_stream`, once made
        self._copy: _Copy | None = None  # a sleep started and not finished
        self._freed_at = -math.inf  # perf_counter() when the last sleep gave its GPU memory back
        self._warm_up_copy_kernel()

    def _warm_up_copy_kernel(self) -> None:
        """Compile `pinned_copy`'s kernel now, with the engine, so that the first wake at once after a sleep (which
        takes the kernel) does not; nothing when the copy engine is forced."""
        from hybrid_core.engines.pinned_copy import copy_choice, warm_up_kernel  # imports Triton: CUDA only

        if copy_choice(self.wake_copy) != "engine":
            warm_up_kernel()

    def _side_stream(self) -> torch.cuda.Stream:
        """The stream a sleep's copy (and a wake beside compute) runs on, made at first use."""
        self._stream = self._stream or torch.cuda.Stream()
        return self._stream

    def _slots(self) -> list[_Slot]:
        slots, offset = [], 0
        hp = fp32_partitions(self.opt)

        def add(getter, setter):
            nonlocal offset
            t = getter()
            nbytes = t.numel() * t.element_size()
            slots.append(_Slot(getter, setter, offset, nbytes, t.dtype, t.shape))
            offset += _aligned(nbytes)

        for i in range(len(hp)):
            add(lambda i=i: hp[i], lambda v, i=i: setattr(hp[i], "data", v))
        for state in self.opt.optimizer.state.values():
            for key in sorted(k for k, v in state.items() if torch.is_tensor(v) and v.is_cuda):
                add(lambda s=state, k=key: s[k], lambda v, s=state, k=key: s.__setitem__(k, v))
        return slots

    @staticmethod
    def _view(flat: torch.Tensor, slot: _Slot) -> torch.Tensor:
        return flat[slot.offset:slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape)

    def _still_in_block(self) -> bool:
        """True when every state is still the view `wake_up` placed in its block (no state was added or replaced,
        e.g. Adam creates its moments at the first step)."""
        if self._block is None:
            return False
        base = self._block.data_ptr()
        return all(slot.get().data_ptr() == base + slot.offset for slot in self._layout) and \
            self._layout[-1].offset + self._layout[-1].nbytes <= self._block.numel()

    def _release_fragment_links(self) -> None:
        """Drop DeepSpeed's views into the fp32 partitions (gradients, bf16↔fp32 fragment maps), as its
        `_clear_hp_buffer_references` does but without its full garbage collection (~0.1–0.3 s per call)."""
        for grads in getattr(self.opt, "offload_gradient_dict", {}).values():
            if grads is not None:
                grads.clear()
        for partition in fp32_partitions(self.opt):
            partition.grad = None
        for group in getattr(self.opt, "bit16_groups", []):  # ZeRO-1/2's fragment maps; ZeRO-3 keeps none
            for param in group:
                mapping = getattr(param, "_hp_mapping", None)
                if mapping is not None:
                    mapping.hp_fragment = None
                    if getattr(mapping, "optim_fragment", None) is not None:
                        mapping.optim_fragment.clear()

    def start_sleep(self) -> None:
        """Start copying every state to the pinned buffer on a side stream, after the work queued so far (the
        optimizer step), and return: the caller's later GPU work (the weight sync) runs beside the copy. The states
        stay on the GPU, untouched, until `finish_sleep`."""
        if self.asleep or self._copy is not None:
            return
        start = time.perf_counter()
        self._release_fragment_links()
        self._layout = self._slots()
        total = self._layout[-1].offset + self._layout[-1].nbytes if self._layout else 0
        host = self.host.get()
        if total > host.numel():
            raise RuntimeError(f"DeepSpeed sleep needs {total / 1e9:.2f} GB of host buffer, {host.numel() / 1e9:.2f} "
                               "GB were allocated at start; report this (unexpected optimizer state)")
        side = self._side_stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            if self._still_in_block():  # states are the views of one GPU block `wake_up` made: one transfer
                host[:self._block.numel()].copy_(self._block, non_blocking=True)
            else:
                for slot in self._layout:
                    self._view(host, slot).copy_(slot.get(), non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        self._copy = _Copy(done=done, total=total, started=start)

    def finish_sleep(self) -> int:
        """Wait for the copy `start_sleep` began, point every state at the host buffer and free the GPU copies;
        returns the bytes moved (0 when no copy was under way)."""
        if self._copy is None:
            return 0
        copy, self._copy = self._copy, None
        copy.done.synchronize()
        copied = time.perf_counter()
        host = self.host.get()
        for slot in self._layout:
            slot.set(self._view(host, slot))
        self._block, self.asleep, self.last_bytes = None, True, copy.total
        torch.cuda.empty_cache()  # the freed memory goes back to the driver, for vLLM's process
        self._freed_at = time.perf_counter()
        self.last_seconds = {"copy": copied - copy.started, "release": self._freed_at - copied}
        return copy.total

    @property
    def is_copying(self) -> bool:
        """A sleep was started and not finished yet."""
        return self._copy is not None

    def sleep(self) -> int:
        """Copy every state to the pinned buffer and free the GPU copies; returns the bytes moved."""
        self.start_sleep()
        return self.finish_sleep()

    def wake_up(self, beside_compute: bool = False) -> int:
        """Bring every state back to the GPU (one allocation, one copy); returns the bytes moved.

        At once (the default) `pinned_copy` chooses the copy: on the multiprocessors when this mover's sleep freed
        the memory moments ago (the driver's clean-up then slows the copy engines), else by the copy engine.
        `beside_compute` (a wake started ahead, in a background thread, while the caller's forwards run) leaves the
        multiprocessors to them: the copy engine copies, on the side stream, so the forwards queued on the default
        stream do not wait for it nor it for them. The states are relinked while the copy runs (`_relink`);
        `last_wake_seconds["copy"]` counts from the copy's launch to its end, the relink's host time within it."""
        self.finish_sleep()
        if not self.asleep:
            return 0
        total, start = self.last_bytes, time.perf_counter()
        stream = self._side_stream() if beside_compute else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            block = torch.empty(_aligned(total), dtype=torch.uint8, device="cuda")
            allocated = time.perf_counter()
            self._copy_in(block, beside_compute)
            launched = time.perf_counter()
            self._relink(block)
            linked = time.perf_counter()
            stream.synchronize()
        self.last_wake_seconds = {"allocate": allocated - start, "copy": time.perf_counter() - allocated,
                                  "relink": linked - launched}
        return total

    def _relink(self, block: torch.Tensor) -> None:
        """Point every state at its view of `block` and rebuild DeepSpeed's fp32↔bf16 fragment links: host work on
        views only (no GPU kernel), done while the copy into `block` runs; nothing reads the states before the
        wake's synchronize. It took 6–10 ms of the 1.7B shape's wake after the copy (s32)."""
        for slot in self._layout:
            slot.set(self._view(block, slot))
        self._block, self.asleep = block, False
        self.opt._link_all_hp_params()

    def _copy_in(self, block: torch.Tensor, beside_compute: bool) -> None:
        host = self.host.get()[:block.numel()]
        if beside_compute:
            block.copy_(host, non_blocking=True)
            return
        from hybrid_core.engines.pinned_copy import copy_pinned_to_device  # imports Triton: CUDA only

        copy_pinned_to_device(block, host, seconds_since_free=time.perf_counter() - self._freed_at,
                              choice=self.wake_copy)
