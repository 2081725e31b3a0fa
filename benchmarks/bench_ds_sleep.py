"""DeepSpeed sleep/wake on the GPU: the project's pinned-buffer mover vs DeepSpeed's own offload_states.

Both move the same states (fp32 master partitions + Adam moments) of a ZeRO-2 bf16 engine after one training step;
bytes moved ÷ 1e9 ÷ seconds per call, the slowest of the first 4 calls of a run. The pinned buffer is allocated at
engine start in a background thread (overlapped with model loading) and timed separately.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from unittest import mock

from bench_common import single_rank_trainer, timed

CALLS = 4
WAKE_PAUSE_S = 2.0  # an iteration's wake comes seconds after its sleep (rollout, reward, experience between)


def _trainer(model_dir: Path):
    start = time.perf_counter()
    trainer = single_rank_trainer(model_dir, lr=1e-6, ds={"zero_stage": 2, "param_dtype": "bf16", "enable_sleep": True},
                                  train={"batch_size": 1, "micro_batch_size": 1, "device": "cuda"}, total_steps=10,
                                  with_sleep_buffer=True)
    return trainer, trainer.state_mover.host, time.perf_counter() - start


def _one_step(trainer) -> None:
    import torch

    from hybrid_core.engines.sequence_batch import make_sequence_batch
    from hybrid_core.engines.vocab_head import response_logprobs

    generator = torch.Generator().manual_seed(0)
    prompt, response = torch.randint(3, 100, (64,), generator=generator).tolist(), \
        torch.randint(3, 100, (512,), generator=generator).tolist()

    def loss_fn(model):
        batch = make_sequence_batch([prompt], [response], 0).to("cuda")
        return -(response_logprobs(model, batch).sum() / batch.response_mask.sum()), {}
    trainer.train_micro_batch(loss_fn, is_boundary=True)


def _timed(fn) -> float:
    return timed(fn)[0]


def host_to_device_gbps(results, num_bytes: int = 4 << 30, streams: int = 1) -> None:
    """The wake's ceiling on this machine: one pinned host buffer copied to the device, `CALLS` times (GB/s, the
    slowest call), the copy split over `streams` CUDA streams when more than one."""
    import torch

    host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    side = [torch.cuda.Stream() for _ in range(streams)]
    chunk = num_bytes // streams

    def copy() -> None:
        for index, stream in enumerate(side):
            with torch.cuda.stream(stream):
                device[index * chunk:(index + 1) * chunk].copy_(host[index * chunk:(index + 1) * chunk],
                                                                non_blocking=True)
        torch.cuda.synchronize()
    copy()
    rates = [num_bytes / 1e9 / _timed(copy) for _ in range(CALLS)]
    results.figure(f"h2d_pinned_gbps_{streams}_streams", min(rates), trials=rates,
                   note=f"{num_bytes / 1e9:.1f} GB pinned host to device, the ceiling of ds_wake_gbps")
    del host, device


def bench_ds_sleep(results, model_dir: Path) -> None:
    import torch

    host_to_device_gbps(results)
    host_to_device_gbps(results, streams=4)
    trainer, buffer, start_s = _trainer(model_dir)
    results.figure("ds_engine_start_s", start_s, note="model load + DeepSpeed init, pinned allocation running beside")
    _one_step(trainer)  # Adam creates its moments at the first step
    sleeps, wakes, moved, parts, wake_parts = [], [], 0, [], []
    for _ in range(CALLS):
        sleeps.append(_timed(lambda: trainer.sleep()))
        moved, parts = trainer.state_mover.last_bytes, parts + [trainer.state_mover.last_seconds]
        wakes.append(_timed(lambda: trainer.wake_up()))
        wake_parts.append(trainer.state_mover.last_wake_seconds)
    results.figure("ds_sleep_parts_s", parts[0], trials=parts, note="copy to pinned host vs releasing GPU memory")
    results.figure("ds_wake_parts_s", wake_parts[0], trials=wake_parts,
                   note="GPU block allocation, the one host-to-device copy, DeepSpeed's fragment links")
    results.figure("ds_pinned_alloc_s", buffer.seconds, note=f"{buffer.num_bytes / 1e9:.2f} GB, at engine start, "
                   "in a background thread overlapped with model loading")
    results.figure("ds_state_bytes", moved)
    results.figure("ds_first_sleep_s", sleeps[0], trials=sleeps)
    results.figure("ds_sleep_gbps", moved / 1e9 / max(sleeps), trials=[moved / 1e9 / s for s in sleeps])
    results.figure("ds_wake_gbps", moved / 1e9 / max(wakes), trials=[moved / 1e9 / s for s in wakes])
    # the wake as an iteration sees it: seconds after the sleep (rollout, reward and experience run between them)
    _wake_variant(results, trainer, "ds_wake_gbps_after_pause", f"each wake {WAKE_PAUSE_S} s after its sleep",
                  pause_s=WAKE_PAUSE_S)
    # the copy engine's copy_, the path before pinned_copy's kernel, beside the default's ds_wake_gbps
    _wake_variant(results, trainer, "ds_wake_gbps_copy_engine",
                  "each wake at once after its sleep, copied by the copy engine", copy="engine")
    _deepspeed_baseline(results, trainer, moved)
    del trainer
    torch.cuda.empty_cache()


def _wake_variant(results, trainer, name: str, note: str, pause_s: float = 0.0, copy: str | None = None) -> None:
    """`CALLS` sleeps, each followed `pause_s` later by a timed wake (`copy`: `HYBRID_WAKE_COPY` for them); GB/s of
    the slowest wake, as figure `name`."""
    from hybrid_core.switches import SWITCHES

    wakes = []
    with mock.patch.dict(os.environ, {SWITCHES["wake_copy"].env: copy} if copy else {}):
        for _ in range(CALLS):
            trainer.sleep()
            time.sleep(pause_s)
            wakes.append(_timed(lambda: trainer.wake_up()))
    moved = trainer.state_mover.last_bytes
    results.figure(name, moved / 1e9 / max(wakes), trials=[moved / 1e9 / s for s in wakes], note=note)


def _deepspeed_baseline(results, trainer, moved: int) -> None:
    """DeepSpeed's own offload_states/reload_states on the same states (fp32 masters + optimizer states)."""
    from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

    trainer.state_mover = None  # DeepSpeed's path from here on
    include = [OffloadStateTypeEnum.hp_params, OffloadStateTypeEnum.optim_states]
    offloads, reloads = [], []
    for _ in range(CALLS):
        offloads.append(_timed(lambda: trainer.engine.offload_states(include=include)))
        reloads.append(_timed(lambda: trainer.engine.reload_states()))
    results.figure("ds_offload_states_first_s", offloads[0], trials=offloads)
    results.figure("ds_offload_states_gbps", moved / 1e9 / max(offloads[1:]), trials=[moved / 1e9 / s for s in offloads])
    results.figure("ds_reload_states_gbps", moved / 1e9 / max(reloads[1:]), trials=[moved / 1e9 / s for s in reloads])
    results.figure("ds_first_sleep_vs_offload_states_first", results.data["figures"]["ds_first_sleep_s"] / offloads[0])
