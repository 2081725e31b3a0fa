"""The DeepSpeed train engine: ZeRO-wrapped policy, micro-batched forward/backward/step, sleep, HF export.

Owns the DeepSpeed config (ZeRO stage, dtype, clipping, schedule; the optimizer's part is `optimizer_config`),
gradient accumulation to one optimizer step per `train.batch_size` samples, no-grad forwards that ZeRO-3 ranks run in
lockstep, and DeepSpeed sleep (optimizer states, grads and fp32 masters to host, unless `ds.adam_offload` keeps them
there). The loss of a micro-batch comes from the caller (`loss_fn`); this module knows no RL maths, Ray or store.
"""
from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from hybrid_core.config import ActorConfig, DsConfig, OptimizerFields, TrainConfig
from hybrid_core.engines.frozen_model import (attn_implementation_for, batched_logprobs, device_name, free_share,
                                             load_causal_lm)
from hybrid_core.engines.ring_attention import new_ring_group
from hybrid_core.engines.sequence_batch import MicroBatching
from hybrid_core.engines.host_offload import OptimizerStateMover, PinnedHostBuffer, state_bytes_per_param
from hybrid_core.engines.lora_policy import LoraSettings, has_adapters, merged_state_dict, with_adapters
from hybrid_core.engines.optimizer_config import optimizer_block, zero_block

log = logging.getLogger(__name__)
STALE_LOCK_S = 600


def clear_stale_build_locks(extensions_dir: str) -> None:
    """A JIT build killed midway leaves a `lock` file and every later build waits on it forever: remove old ones."""
    for lock in Path(extensions_dir).glob("*/lock"):
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            log.warning("removing stale DeepSpeed build lock %s", lock)
            lock.unlink(missing_ok=True)


def ds_config(optim: OptimizerFields, ds: DsConfig, train: TrainConfig, world_size: int = 1,
              device: str = "cuda") -> dict:
    """DeepSpeed's config for one rank of `world_size` ranks on `device`, whose rings of `ds.ring_attn_size` ranks
    share their samples (world ÷ ring size data-parallel groups). The accumulation count and the batch size only
    satisfy DeepSpeed's batch check, which counts every rank as data-parallel: the update loop sets each optimizer
    step's boundary itself."""
    groups = world_size // ds.ring_attn_size
    per_step = train.micro_batch_size * groups
    if train.batch_size % per_step:
        raise ValueError(f"train.batch_size must be a multiple of train.micro_batch_size × data-parallel groups: got "
                         f"{train.batch_size}, {train.micro_batch_size} × {groups}; change --train.batch_size "
                         "or --train.micro_batch_size")
    accumulation = train.batch_size // per_step
    return {
        "train_batch_size": train.micro_batch_size * accumulation * world_size,
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": optim.max_norm,  # 0: no clipping
        "zero_optimization": zero_block(optim, ds, device),
        "bf16": {"enabled": ds.param_dtype == "bf16"},
        "fp16": {"enabled": ds.param_dtype == "fp16"},
        "optimizer": optimizer_block(optim, ds, device),
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def make_scheduler_factory(optim: OptimizerFields, total_optimizer_steps: int) -> Callable:
    from transformers import get_scheduler

    warmup = math.ceil(total_optimizer_steps * optim.lr_warmup_ratio)
    extra = {"scheduler_specific_kwargs": {"min_lr_rate": optim.min_lr_ratio}} \
        if optim.lr_scheduler == "cosine_with_min_lr" else {}
    return lambda optimizer: get_scheduler(optim.lr_scheduler, optimizer, num_warmup_steps=warmup,
                                           num_training_steps=max(total_optimizer_steps, 1), **extra)


def load_policy(model_path: str, actor: ActorConfig, ds: DsConfig, seed: int = 0) -> torch.nn.Module:
    """The trainable policy, with activation checkpointing when asked, the attention kernel of its layout, Liger's
    kernels (as `ds.use_liger_kernel` says: required, off, or by default on CUDA where they apply) and, with
    `ds.lora.rank`, LoRA adapters drawn from `seed` (train.seed; then only they train)."""
    model = load_causal_lm(model_path, ds.param_dtype,
                           attn_implementation_for(ds.packing_samples, ds.ring_attn_size > 1, ds.packed_attention),
                           ds.use_liger_kernel)
    if actor.gradient_checkpointing_enable:
        checkpoint_layers(model, actor)
    lora = LoraSettings.of(ds.lora, seed)
    return model if lora is None else with_adapters(model, lora, actor.gradient_checkpointing_enable)


def checkpoint_layers(model: torch.nn.Module, actor: ActorConfig) -> None:
    """Activation checkpointing on `model`'s decoder layers: all of them, or the first
    `actor.gradient_checkpointing_layers` (the later ones then keep their activations for the backward)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": actor.gradient_checkpointing_reentrant})
    wanted = actor.gradient_checkpointing_layers
    if wanted is None:
        return
    layers = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
    if wanted > len(layers):
        raise ValueError(f"actor.gradient_checkpointing_layers {wanted} is more than the policy's {len(layers)} "
                         f"checkpointable decoder layers: give at most {len(layers)}, or drop the flag to "
                         "checkpoint every layer")
    for layer in layers[wanted:]:
        layer.gradient_checkpointing = False


def count_parameters(model_path: str) -> int:
    """Parameters of a local HF model, counted on the meta device (nothing is loaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    return sum(p.numel() for p in model.parameters())


def start_sleep_buffer(model_path: str, ds: DsConfig, world_size: int = 1) -> PinnedHostBuffer | None:
    """With --ds.enable_sleep on a GPU, start allocating the pinned host buffer now, while the model loads: room for
    this rank's partition of the optimizer states among `world_size` ranks (none with --ds.adam_offload: the states
    live in DeepSpeed's host buffers already)."""
    if not (ds.enable_sleep and device_name() == "cuda") or ds.adam_offload:
        return None
    slack = 64 * 2**20  # alignment of each state, padded partitions, a value head
    partition = math.ceil(count_parameters(model_path) / (world_size if ds.zero_stage >= 1 else 1))
    return PinnedHostBuffer(partition * state_bytes_per_param(ds.param_dtype) + slack)


def use_gloo_all_reduce_on_cpu() -> None:
    """On CPU, DeepSpeed's communication backend JIT-compiles a shared-memory all-reduce op the first time a process
    starts it (measured 84–131 s on the 2-core machine, and again each time a different ninja builds it: pip's 1.13
    and a system 1.11 hash the same command line differently, so they rebuild each other's output). CPU runs are the
    demo and tests with tiny models, where gloo's all-reduce is as good: the op is marked unavailable and DeepSpeed
    falls back to torch.distributed, as on platforms without it (its compatibility table is kept for such edits)."""
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


class DeepSpeedTrainEngine:
    """One DeepSpeed rank holding a trainable model (the policy, or the critic's value model)."""

    def __init__(self, model: torch.nn.Module, optim: OptimizerFields, ds: DsConfig, train: TrainConfig,
                 total_optimizer_steps: int, pad_id: int, sleep_buffer: PinnedHostBuffer | None = None):
        import deepspeed

        on_cpu = device_name() == "cpu"
        if on_cpu:
            use_gloo_all_reduce_on_cpu()
        deepspeed.init_distributed(dist_backend="gloo" if on_cpu else "nccl")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()  # DeepSpeed's ranks of this role
        # rings of ds.ring_attn_size consecutive ranks share their samples: world ÷ ring size data-parallel groups
        self.ring = new_ring_group(ds.ring_attn_size, ds.ring_attn_head_stride)
        self.data_parallel_rank = self.rank // ds.ring_attn_size
        self.data_parallel_size = self.world_size // ds.ring_attn_size
        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=ds_config(optim, ds, train, self.world_size, device_name()),
            lr_scheduler=make_scheduler_factory(optim, total_optimizer_steps))
        self.micro_batch_size, self.pad_id = train.micro_batch_size, pad_id
        self.is_zero3, self.can_sleep = ds.zero_stage == 3, ds.enable_sleep and device_name() == "cuda"
        self.is_optimizer_on_host = ds.adam_offload
        if ds.enable_sleep and not self.can_sleep:
            log.info("ds.enable_sleep: training on CPU keeps every state in host memory already")
        self.state_mover = self._state_mover(sleep_buffer, ds.wake_copy)
        self._waking: Future | None = None  # a wake started ahead (`wake_up_soon`), on `_waker`'s one thread
        self._waker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ds-wake") if self.state_mover else None
        self.ema = None  # rank 0 with train.enable_ema: an `ema.EmaWeights` updated after each optimizer step

    def _state_mover(self, sleep_buffer: PinnedHostBuffer | None, wake_copy: str | None) -> OptimizerStateMover | None:
        """Our pinned-buffer mover for the ZeRO optimizers, waking by `wake_copy` (`ds.wake_copy`); stage 0 uses
        DeepSpeed's `offload_states`; none when ds.adam_offload keeps the optimizer on the host."""
        if not self.can_sleep or self.is_optimizer_on_host:
            return None
        optimizer = self.engine.optimizer
        is_zero = hasattr(optimizer, "single_partition_of_fp32_groups") or self.is_zero3
        if sleep_buffer is None or not is_zero:
            log.warning("ds.enable_sleep: ZeRO stage %s uses DeepSpeed's offload_states (pinned memory is allocated "
                        "on its first call)", self.engine.zero_optimization_stage())
            return None
        return OptimizerStateMover(optimizer, sleep_buffer, wake_copy)

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    def forward_count(self, own: int) -> int:
        """How many no-grad forwards this rank runs for its `own` micro-batches: under ZeRO-3 with several ranks the
        most any rank has (each forward gathers the partitioned weights from every rank, so all run as many; one
        all-reduce), else its own."""
        if not (self.is_zero3 and self.world_size > 1):
            return own
        count = torch.tensor([own], dtype=torch.long, device=device_name())
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return int(count.item())

    def logprobs(self, prompt_ids, response_ids, batching: MicroBatching) -> list[list[float]]:
        self.engine.eval()
        return batched_logprobs(self.engine, prompt_ids, response_ids, self.pad_id, batching, self.ring,
                                self.forward_count)

    def train_micro_batch(self, loss_fn: Callable[[torch.nn.Module], tuple[torch.Tensor, dict]],
                          is_boundary: bool) -> dict:
        """Backward one micro-batch; the optimizer steps when `is_boundary` (the caller's last micro-batch).

        `loss_fn` returns a loss already normalised for the whole optimizer step (a global token mean over every
        rank's samples), so DeepSpeed must not divide it by the accumulation steps again, and its average over the
        data-parallel ranks is undone (× ranks) so the ranks' gradients add up (a ring's ranks each hold the part of
        the micro-batch's gradient that flows through their chunk: they add up too); the caller owns the boundary, so an
        optimizer step may hold fewer micro-batches than `train.batch_size` implies (a filtered or token-budgeted
        step). Every rank must make the same number of calls per optimizer step.
        """
        self.engine.train()
        self.engine.set_gradient_accumulation_boundary(is_boundary)
        loss, stats = loss_fn(self.engine)
        self.engine.backward(loss * self.world_size if self.world_size > 1 else loss, scale_wrt_gas=False)
        self.engine.step()
        if is_boundary and self.ema is not None:
            self.ema.update()
        if is_boundary:
            stats["grad_norm"] = float(self.engine.get_global_grad_norm() or 0.0)
            stats["lr"] = float(self.engine.get_lr()[0])
        return stats

    def sleep(self) -> int:
        """Optimizer states, grads and fp32 masters to host; the bf16 weights stay for logprob forwards.
        Returns the bytes moved (0 when nothing moved or DeepSpeed's own path did)."""
        if self._waking is not None:  # a wake started ahead finishes first: the states are then on the GPU
            self.wake_up()
        if self.state_mover is not None:
            moved = self.state_mover.sleep()
            if self.is_zero3:  # its gradient partitions and reduce bucket: DeepSpeed moves those itself
                self.engine.offload_states(include=self._zero3_gradient_states())
            return moved
        if self.can_sleep and self.is_optimizer_on_host:
            self._sleep_beside_host_optimizer()
        elif self.can_sleep:
            self.engine.offload_states()
        return 0

    def sleep_soon(self) -> None:
        """Start `sleep`'s copy to the host and return while it runs (the weight sync goes on beside it);
        `finish_sleep` waits for it and frees the GPU memory. Only our mover under ZeRO-1/2 does this; every other
        path (ZeRO-3's DeepSpeed-moved gradient states, DeepSpeed's own offload) sleeps at once."""
        if self.state_mover is None or self.is_zero3:
            self.sleep()
            return
        if self._waking is not None:
            self.wake_up()
        torch.cuda.empty_cache()  # the step's freed blocks go back now (emptying during the copy would wait for it)
        self.state_mover.start_sleep()

    def finish_sleep(self, unless_free_share: float | None = None) -> float:
        """Wait for the sleep `sleep_soon` started, so its GPU memory is free; returns the seconds waited (0.0 when
        none was under way). With `unless_free_share`, a fraction of the GPU's memory that the next user of the GPU
        may take (the colocated rollout engine waking its KV cache: `vllm.gpu_memory_utilization`), the copy is left
        running when that much memory is free already (its bytes stay on the GPU until then). Every other call that
        touches the optimizer finishes it first."""
        if self.state_mover is None or not self.state_mover.is_copying:
            return 0.0
        if unless_free_share is not None and free_share() >= unless_free_share:
            return 0.0
        start = time.perf_counter()
        self.state_mover.finish_sleep()
        return time.perf_counter() - start

    def _sleep_beside_host_optimizer(self) -> None:
        """ds.adam_offload: the fp32 masters, Adam's moments and the step live on the host already, so nothing is
        copied. What training left on the GPU is ZeRO-3's gradient bucket (dropped; `wake_up` allocates it again)
        and PyTorch's cached blocks, which go back to the driver for the rollout engine."""
        if self.is_zero3:  # its gradient partitions are on the host too (DeepSpeed leaves them out)
            self.engine.offload_states(include=self._zero3_gradient_states())
        torch.cuda.empty_cache()

    @staticmethod
    def _zero3_gradient_states() -> list:
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

        return [OffloadStateTypeEnum.lp_grads, OffloadStateTypeEnum.contiguous_grad_buffer]

    def wake_up_soon(self) -> None:
        """Start bringing the states back in a background thread, so the host-to-device copy overlaps other work
        (the advantage stage's reference forward); `wake_up` then only waits for what is left. Only our pinned-buffer
        mover does this (DeepSpeed's own reload is not thread-safe to overlap)."""
        self.finish_sleep()
        if self.state_mover is None or not self.state_mover.asleep or self._waking is not None:
            return
        self._waking = self._waker.submit(self.state_mover.wake_up, beside_compute=True)

    def wake_up(self) -> int:
        if self.state_mover is not None and self.is_zero3 and self.engine.optimizer.offloaded_states:
            self.engine.reload_states()  # ZeRO-3's gradient partitions and bucket: DeepSpeed's, in this thread
        if self._waking is not None:  # started ahead: its result (or its error) is this call's
            waking, self._waking = self._waking, None
            return waking.result()
        if self.state_mover is not None:
            return self.state_mover.wake_up()
        if self.can_sleep and getattr(self.engine.optimizer, "offloaded_states", True):
            self.engine.reload_states()
        return 0

    @property
    def has_adapters(self) -> bool:
        return has_adapters(self.module)

    def save_hf(self, out_dir: str, tokenizer=None, with_merged: bool = False) -> None:
        """Write HF weights to `out_dir` from rank 0 (a LoRA policy: its adapter in PEFT's format, and with
        `with_merged` the merged model in `merged/`; with an EMA, the EMA's in `ema/` beside). Under ZeRO-3 every
        rank must call it: the weights are gathered from all ranks, layer by layer, and the other ranks write
        nothing."""
        state = self.engine._zero3_consolidated_16bit_state_dict() if self.is_zero3 else self.module.state_dict()
        if self.rank != 0:
            return
        _write_hf(self.module, out_dir, state, tokenizer)
        if with_merged and self.has_adapters:
            _write_hf(self.module.get_base_model(), f"{out_dir}/merged", merged_state_dict(self.module), tokenizer)
        if self.ema is not None:
            _write_hf(self.module, f"{out_dir}/ema", self.ema.export_state_dict(), tokenizer)


def _write_hf(module: torch.nn.Module, out_dir: str, state: dict, tokenizer) -> None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    module.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
