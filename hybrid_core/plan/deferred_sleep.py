"""When the actor's DeepSpeed sleep leaves its optimizer states on the GPU outside the train phase: the sleep copy
that runs on beside the weight sync (and, when there is room, beside the rollout), and the early wake that brings
the states back while the advantage stage's forwards run.

Owns the rules the memory plan applies for `engines/deepspeed_train.py`'s pinned-buffer mover (`sleep_soon`,
`finish_sleep(unless_free_share)`, `wake_up_soon`) and `workers/actor.py`'s sync. It knows nothing about phases or
terms: it takes byte counts (GiB) and answers with GiB or yes/no.
"""
from __future__ import annotations

from hybrid_core.config import RunConfig


def defers_ds_sleep(cfg: RunConfig) -> bool:
    """Whether the actor's DeepSpeed sleep copies its optimizer states to the host while the weight sync runs (our
    pinned-buffer mover under ZeRO-1/2; ZeRO-3, stage 0 and `ds.adam_offload` sleep at once)."""
    return cfg.ds.enable_sleep and cfg.ds.zero_stage in (1, 2) and not cfg.ds.adam_offload


def sync_excess(cfg: RunConfig, actor, vllm_weights_gib: float) -> float:
    """GiB the sync phase holds beyond the train phase, counted in the train phase: while DeepSpeed's sleep still
    copies (`defers_ds_sleep`), the actor's weights, gradients and optimizer states stay beside the vLLM weights that
    wake for the sync; the step's activations, logits and temporaries are free by then. `actor`: its TrainerBytes."""
    if not (defers_ds_sleep(cfg) and cfg.vllm.enable_sleep and vllm_weights_gib):
        return 0.0
    return max(0.0, vllm_weights_gib - (actor.activations + actor.logits + actor.step))


def wakes_early(cfg: RunConfig) -> bool:
    """Whether the actor's optimizer states are back on the GPU in the experience phase: the mover starts their wake
    when the advantage stage begins, so the copy overlaps the reference's forward (`ExperienceStage.run`)."""
    return defers_ds_sleep(cfg)


def states_outlast_sync(cfg: RunConfig, held_at_sync_gib: float, gpu_total_gib: float) -> bool:
    """Whether the actor's optimizer states are still on the GPU in the rollout phase. At the sync's end the actor
    waits for its sleep copy only when less than the waking engine's share (`vllm.gpu_memory_utilization`; none when
    vLLM does not sleep) of the GPU is free; otherwise the copy runs on, and the states stay until the next call that
    touches the optimizer (the early wake, `wakes_early`). `held_at_sync_gib`: what the GPU holds then, the states
    included. Measured on the H200 at the 4B GRPO shape (s52): 122.5 GiB in the rollout, 46.8 above the plan without
    this rule, whose optimizer states are 45.0."""
    if not defers_ds_sleep(cfg):
        return False
    wake_share = cfg.vllm.gpu_memory_utilization if cfg.vllm.enable_sleep else 0.0
    return (gpu_total_gib - held_at_sync_gib) / gpu_total_gib >= wake_share
