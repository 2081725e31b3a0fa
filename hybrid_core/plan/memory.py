"""Per-GPU memory estimate of a colocated run: the terms `hybrid plan` prints and `hybrid train` checks.

Owns the bytes every role holds on one GPU in each phase of a step, from the models' shapes (`model_shapes`). Pure
functions of a `RunConfig`: no torch, no Ray. It does not know the placement (the caller names the roles sharing
the GPU), what vLLM does inside its reservation, or the allocator's fragmentation beyond the cached blocks it models.
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

from hybrid_core.config import OptimizerFields, RunConfig
from hybrid_core.plan.adapter_memory import adapter_notes, trained_params
from hybrid_core.plan.deferred_sleep import states_outlast_sync, sync_excess, wakes_early
from hybrid_core.plan.model_shapes import ModelShape, model_shape
from hybrid_core.switches import switch_value

GIB = 2**30
PARAM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
CONTEXT_GIB = 0.5  # one CUDA context (measured 0.51 GiB on the H200, CUDA 13, lazy module loading)
# Outside PyTorch's pool in a DeepSpeed process after a step: NCCL and cuBLAS buffers (measured 1.30 GiB with the
# context on the H200, ZeRO-1/2/3, one rank), on top of CONTEXT_GIB.
DEEPSPEED_RUNTIME_GIB = 0.8
ZERO3_SUB_GROUP_PARAMS = 10**9  # DeepSpeed's stage-3 `sub_group_size` default: its optimizer steps one group at a time
# Bytes per logit of one vocabulary-head chunk (`ds.logit_chunk_tokens` tokens × vocab; engines/vocab_head.py, the
# only logits there are): the chunk's 16-bit logits and two fp32 blocks (their fp32 copy and logsumexp's temporary,
# or log p and p). The same in a no-grad forward, in the policy's forward and in its per-chunk recompute and backward,
# with or without an entropy bonus (measured 10.2 on CPU through torch's profiler, bf16 model). The policy's backward
# also sums the head weight's gradient over the chunks: one more 16-bit vocab × hidden matrix. On CUDA the fused
# kernels (`engines/logprob_kernel`) keep no fp32 block: the chunk's logits and their gradient, in the logits' dtype
# (`logit_bytes`).
LOGIT_BYTES = 10
# Per parameter of the rank's partition during DeepSpeed's optimizer step: the fp32 copy of the gradients and
# torch AdamW's sqrt(v) temporary (measured +8.0 bytes/param over the resident states, ZeRO-2 on the H200).
# These are two fp32 tensors of the partition's size. Under ZeRO ≤ 2 they come out of PyTorch's cache when the
# backward freed fp32 logit blocks at least as large (a chunk's tokens × vocab ≥ the partition's parameters). The
# cache splits a larger free block, so then the step adds nothing. Measured on the H200 before the head ran in
# chunks: at 8,192 tokens the blocks were smaller and the step added its 8 bytes/param. At 16,384 padded tokens the
# whole GPU peaked at 73.1 GiB; the plan said 87.5 GiB with the step counted and 85.1 GiB without it; the rest was
# the experience forward's cache, counted twice (see _trainer_terms): the plan then said 74.7 GiB (+2.1%).
STEP_BYTES = 8
SYNC_BUFFERS = 2  # weight-sync bucket buffers the actor fills in turn (engines/weight_sync.py BucketBuffers)


@dataclass(frozen=True)
class Term:
    """One named amount of GPU memory, in GiB."""

    name: str
    gib: float


@dataclass(frozen=True)
class Phase:
    """What one GPU holds while one stage runs: `terms` add up to `total_gib`."""

    name: str
    terms: tuple[Term, ...]

    @property
    def total_gib(self) -> float:
        return sum(term.gib for term in self.terms)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-phase terms of one GPU, the GPU's size and notes; the peak is the largest phase."""

    phases: tuple[Phase, ...]
    gpu_total_gib: float
    notes: tuple[str, ...] = ()

    @property
    def peak_phase(self) -> Phase:
        # Without sleep every phase holds the same blocks: on a tie name the train phase, where they are in use.
        return max(self.phases, key=lambda phase: (round(phase.total_gib, 9), phase.name == "train"))

    @property
    def peak_gib(self) -> float:
        return self.peak_phase.total_gib

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.gpu_total_gib

    @property
    def largest_term(self) -> Term:
        return max(self.peak_phase.terms, key=lambda term: term.gib)


@dataclass(frozen=True)
class TrainerBytes:
    """One DeepSpeed role's bytes on a GPU (its ZeRO partition), each in GiB; `forward` is a no-grad logprob pass."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    step: float
    forward: float = 0.0


def trainer_bytes(cfg: RunConfig, shape: ModelShape, has_logits: bool) -> TrainerBytes:
    """Weights, gradients, optimizer states (`optimizer_bytes_per_param`), activations, logits (one head chunk's) and
    the optimizer step's temporaries of one rank, for ZeRO stage `ds.zero_stage` over the actor's world size.

    ZeRO ≥ 1 divides optimizer states, ≥ 2 gradients, 3 weights; `ds.adam_offload` keeps the optimizer on the host.
    `has_logits`: the policy (a vocabulary head, the actor's optimizer); else the critic, whose value head has none
    worth counting.
    """
    params, world, stage = shape.num_params, cfg.actor_world_size, cfg.ds.zero_stage
    param_bytes = PARAM_BYTES[cfg.ds.param_dtype]
    state_bytes = optimizer_bytes_per_param(cfg.actor if has_logits else cfg.critic, shape, cfg.ds.param_dtype)
    trained = trained_params(cfg, shape) if has_logits else params  # a LoRA policy trains its adapters alone
    partition = trained / world if stage >= 1 else trained
    step_params = min(partition, ZERO3_SUB_GROUP_PARAMS) if stage == 3 else partition
    tokens, forward_tokens = ring_tokens(train_tokens(cfg), cfg), ring_tokens(forward_tokens_of(cfg), cfg)
    chunk = cfg.ds.logit_chunk_tokens  # a ring's rank runs the head over its own share's response tokens only
    logit_tokens, forward_logit_tokens = min(tokens, chunk), min(forward_tokens, chunk)
    checkpointed = cfg.actor.checkpointed_layers(shape.num_hidden_layers) if has_logits else 0
    fused, per_logit = runs_fused_kernels(cfg), logit_bytes(cfg)
    activations = tokens * shape.activation_bytes_per_token(param_bytes, checkpointed, fused)
    if checkpointed:  # the backward recomputes one layer at a time
        activations += tokens * shape.layer_bytes_per_token(param_bytes, fused)
    activations += ring_kv_bytes(cfg, shape, tokens, checkpointed)
    offloaded = cfg.ds.adam_offload
    # the step's two fp32 partition-sized temporaries come out of the largest block the head's backward freed
    freed_block = logit_tokens * shape.vocab_size * (param_bytes if runs_logprob_kernels(cfg) else 4)
    step_from_cache = has_logits and stage < 3 and freed_block >= 4 * step_params
    head_gradient_sum = shape.vocab_size * shape.hidden_size * param_bytes
    return TrainerBytes(
        weights=params * param_bytes / (world if stage == 3 else 1) / GIB,
        gradients=trained * param_bytes / (world if stage >= 2 else 1) / GIB,
        optimizer=0.0 if offloaded else partition * state_bytes / GIB,
        activations=activations / GIB,
        logits=(logit_tokens * shape.vocab_size * per_logit + head_gradient_sum) / GIB if has_logits else 0.0,
        step=0.0 if offloaded or step_from_cache else step_params * STEP_BYTES / GIB,
        forward=forward_logit_tokens * shape.vocab_size * per_logit / GIB if has_logits else 0.0)


def runs_logprob_kernels(cfg: RunConfig) -> bool:
    """Whether the vocabulary head's maths runs in the fused Triton kernels (`engines/logprob_kernel`): on CUDA
    where Triton is installed, unless `ds.logprob_kernel` is torch (see `switches`)."""
    is_triton = switch_value("logprob_kernel", cfg.ds.logprob_kernel) == "triton"
    return cfg.train.device == "cuda" and is_triton and triton_installed()


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def logit_bytes(cfg: RunConfig) -> int:
    """Bytes per logit of a head chunk at its peak: `LOGIT_BYTES`, or with the fused kernels the logits and their
    gradient in the weights' dtype."""
    return 2 * PARAM_BYTES[cfg.ds.param_dtype] if runs_logprob_kernels(cfg) else LOGIT_BYTES


def runs_fused_kernels(cfg: RunConfig) -> bool:
    """Whether the trainers run Liger's fused RMSNorm, rotary and SwiGLU (`engines/liger_kernels`): as
    `ds.use_liger_kernel` says (true: required, false: off), else by default on CUDA wherever the package is
    installed. The plan takes Liger to cover the model type, as it does the Qwen-style decoders `ModelShape`
    describes."""
    if cfg.ds.use_liger_kernel is not None:
        return cfg.ds.use_liger_kernel
    return cfg.train.device == "cuda" and liger_installed()


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def optimizer_bytes_per_param(block: OptimizerFields, shape: ModelShape, param_dtype: str) -> float:
    """Resident optimizer bytes per parameter: the fp32 master copy of 16-bit weights, and Adam's two fp32 moments;
    with Muon 4 bytes of momentum for the 2-D hidden matrices (`matrix_params`: one fp32 buffer, or at ZeRO-1/2 one in
    the gradients' dtype beside DeepSpeed's staging copy), Adam's two moments for the rest."""
    master = 0 if param_dtype == "fp32" else 4
    if block.optim != "muon":
        return master + 8
    return master + 8 - 4 * shape.matrix_params / shape.num_params


def train_tokens(cfg: RunConfig) -> int:
    """Tokens of the largest train micro-batch: the dynamic budget, or micro_batch_size × data.max_len.

    With a budget a sample longer than it still forms a micro-batch of its own, so data.max_len bounds it too.
    """
    if cfg.train.dynamic_batch_enable:  # the budget is a GPU's: a ring's ranks share a micro-batch
        return max(cfg.train.max_tokens_per_gpu * cfg.ds.ring_attn_size, cfg.data.max_len)
    return cfg.train.micro_batch_size * cfg.data.max_len


def ring_tokens(tokens: int, cfg: RunConfig) -> int:
    """A rank's tokens of a micro-batch: ring attention splits each packed row into ds.ring_attn_size chunks."""
    return -(-tokens // cfg.ds.ring_attn_size)


def ring_kv_bytes(cfg: RunConfig, shape: ModelShape, tokens: int, checkpointed_layers: int) -> int:
    """All-gathered keys and values a ring keeps for the backward: each layer's that is not checkpointed, and one
    recomputed layer's when any is."""
    size, kv_width = cfg.ds.ring_attn_size, shape.num_key_value_heads * shape.head_dim
    per_layer = size * tokens * 2 * kv_width * PARAM_BYTES[cfg.ds.param_dtype] if size > 1 else 0
    return per_layer * (shape.num_hidden_layers - checkpointed_layers + (checkpointed_layers > 0))


def forward_tokens_of(cfg: RunConfig) -> int:
    """Tokens of the largest no-grad logprob micro-batch (advantage stage), as `train_tokens` for the forwards."""
    if cfg.train.dynamic_batch_enable:
        return max((cfg.rollout.max_tokens_per_gpu or cfg.train.max_tokens_per_gpu) * cfg.ds.ring_attn_size,
                   cfg.data.max_len)
    return cfg.rollout.micro_batch_size * cfg.data.max_len


def _trainer_terms(role: str, b: TrainerBytes, phase: str, own_phase: str, sleeps: bool) -> list[Term]:
    """A DeepSpeed role's terms in `phase`; `own_phase` is the one where it trains.

    Asleep (ds.enable_sleep) outside its train phase it keeps only its 16-bit weights, plus the no-grad logprob
    forward in the experience phase. Otherwise PyTorch's caching allocator keeps every block of the last train step
    (nothing empties it), so all of them count in every phase. The experience forward's cached blocks serve what
    the train phase allocates after it (activations, logits, the step's temporaries and, when they slept, the woken
    gradients and optimizer states), so the forward adds only what exceeds those. Measured on the H200 (ds-peak
    benchmark, 1.7B): the actor's peak reserved memory was 60.7 GiB in the experience phase (plan 60.8) and 69.8 GiB
    in the train phase (plan 72.9 with this rule; 83.3 when the forward's excess over activations and logits alone
    was added).
    """
    weights = Term(f"{role} weights", b.weights)
    if sleeps and phase != own_phase:
        held = [weights, Term(f"{role} logprob forward", b.forward if phase == "experience" else 0.0)]
    else:
        reallocated = b.activations + b.logits + b.step + (b.gradients + b.optimizer if sleeps else 0.0)
        beyond_cache = max(0.0, b.forward - reallocated)
        held = [weights, Term(f"{role} gradients", b.gradients), Term(f"{role} optimizer states", b.optimizer),
                Term(f"{role} activations", b.activations), Term(f"{role} logits", b.logits),
                Term(f"{role} optimizer step", b.step), Term(f"{role} logprob forward", beyond_cache)]
    return [term for term in held if term.gib > 0]


@dataclass(frozen=True)
class _GpuRoles:
    """What each role sharing the GPU would hold, before phases decide which of it is resident."""

    actor: TrainerBytes
    critic: TrainerBytes | None
    ref: tuple[Term, ...]
    reward: tuple[Term, ...]  # (weights, forward) of the reward model, or ()
    vllm_gib: float
    resident: tuple[Term, ...]  # held in every phase: contexts, library buffers, weight-sync buffers
    sync_excess_gib: float = 0.0  # the sync's vLLM weights beyond the train step's freed blocks (`sync_excess`)
    states_awake_in: tuple[str, ...] = ()  # phases outside train where the actor's optimizer states stay on the GPU


def _phase(name: str, roles: _GpuRoles, cfg: RunConfig) -> Phase:
    """One phase's terms: vLLM holds its reservation in the rollout phase (in every phase without vllm sleep)."""
    terms = []
    if roles.vllm_gib and (name == "rollout" or not cfg.vllm.enable_sleep):
        terms.append(Term("vLLM reservation", roles.vllm_gib))
    terms += _trainer_terms("actor", roles.actor, name, "train", cfg.ds.enable_sleep)
    if name in roles.states_awake_in and roles.actor.optimizer > 0:
        woken = "woken early, beside the forwards" if name == "experience" else "their sleep copy left running"
        terms.append(Term(f"actor optimizer states ({woken})", roles.actor.optimizer))
    if name == "train" and roles.sync_excess_gib > 0:
        terms.append(Term("vLLM weights in the sync, beside DeepSpeed's sleep copy", roles.sync_excess_gib))
    if roles.ref:  # the reference empties PyTorch's cache after its forwards: the forward counts where it runs
        terms += roles.ref if name == "experience" else () if cfg.ref.offload else roles.ref[:1]
    if roles.critic is not None:
        terms += _trainer_terms("critic", roles.critic, name, "critic train", cfg.ds.enable_sleep)
    if roles.reward:  # it empties PyTorch's cache after its forwards; offloaded, its weights visit for them only
        is_held = name == "reward" or not cfg.reward.offload
        terms += (roles.reward if name == "reward" else roles.reward[:1]) if is_held else ()
    return Phase(name, (*terms, *roles.resident))


def reward_model_terms(cfg: RunConfig) -> tuple[Term, ...]:
    """The reward model's weights (embedding, layers, final norm and a value head: no vocabulary head) and its
    no-grad forward. The forward holds the residual stream and one layer's activations at a time, about one layer's
    full activations per token (`layer_bytes_per_token`; not measured on a GPU yet)."""
    shape = model_shape(cfg.reward.model_name_or_path, "reward.model_name_or_path")
    param_bytes = PARAM_BYTES[cfg.ds.param_dtype]
    params = shape.vocab_size * shape.hidden_size + shape.non_embedding_params + shape.hidden_size
    forward = forward_tokens_of(cfg) * shape.layer_bytes_per_token(param_bytes)
    return Term("reward model weights", params * param_bytes / GIB), Term("reward model forward", forward / GIB)


def estimate_memory(cfg: RunConfig, gpu_total_gib: float, roles: tuple[str, ...] | None = None) -> MemoryPlan:
    """Per-GPU memory of the roles sharing one of the actor's GPUs, phase by phase, on a GPU of `gpu_total_gib`.

    Phases: rollout (vLLM generates), with a reward model reward (its forwards), experience (no-grad logprob
    forwards), train (the actor's update, and the weight sync after it: `sync_excess`) and, with a critic, critic
    train. vLLM reserves `vllm.gpu_memory_utilization` of the whole GPU for its weights, KV cache and activations.
    The reference model keeps its weights (with `ref.offload` in the experience phase only); its logprob forward
    counts in the experience phase; the reward model's in the reward phase.

    Args:
        roles: the roles placed on the actor's GPUs ("actor", "ref", "critic", "reward", "rollout"); default
            `cfg.roles`, every role on one GPU (train.colocate_all).

    Raises:
        ValueError: when a model's shape is unknown (see `model_shape`).
    """
    roles = cfg.roles if roles is None else roles
    shape = model_shape(cfg.actor.model_name_or_path)
    critic = None
    if "critic" in roles:
        path = cfg.critic.model_name_or_path or cfg.reward.model_name_or_path or cfg.actor.model_name_or_path
        critic = trainer_bytes(cfg, model_shape(path, "critic.model_name_or_path"), has_logits=False)
    actor = trainer_bytes(cfg, shape, has_logits=True)
    ref: tuple[Term, ...] = ()
    if "ref" in roles:
        # the policy's shape and dtype, whole on every replica (a plain PyTorch module, not ZeRO-partitioned)
        ref_weights = shape.num_params * PARAM_BYTES[cfg.ds.param_dtype] / GIB
        ref = (Term("ref weights", ref_weights), Term("ref logprob forward", actor.forward))
    reward = reward_model_terms(cfg) if "reward" in roles and cfg.reward.model_name_or_path else ()
    num_vllm = math.ceil(cfg.num_rollout_gpus / cfg.actor_world_size) if "rollout" in roles else 0
    # an engine whose model runner runs in a child process (RunConfig.engine_executor mp) counts that one's context too
    engine_processes = num_vllm * (1 + (cfg.engine_executor == "mp"))
    num_processes = 1 + engine_processes + ("ref" in roles) + (critic is not None) + bool(reward)
    resident = (Term("CUDA contexts", num_processes * CONTEXT_GIB),
                Term("DeepSpeed NCCL/cuBLAS buffers", (1 + (critic is not None)) * DEEPSPEED_RUNTIME_GIB))
    if num_vllm:  # the actor packs weight buckets into persistent buffers that vLLM maps through CUDA IPC
        bucket_bytes = max(cfg.vllm.sync_bucket_mb * 2**20, shape.largest_param_numel * PARAM_BYTES[cfg.ds.param_dtype])
        resident += (Term("actor weight-sync buffers", SYNC_BUFFERS * bucket_bytes / GIB),)
    vllm_weights_gib = num_vllm * shape.num_params * PARAM_BYTES[cfg.ds.param_dtype] / cfg.vllm.tensor_parallel_size \
        / GIB
    held_at_sync = actor.weights + actor.optimizer + sum(t.gib for t in (*ref[:1], *resident)) + vllm_weights_gib
    states_awake_in = (("rollout",) if states_outlast_sync(cfg, held_at_sync, gpu_total_gib) else ()) \
        + (("experience",) if wakes_early(cfg) else ())
    gpu_roles = _GpuRoles(actor, critic, ref, reward, num_vllm * cfg.vllm.gpu_memory_utilization * gpu_total_gib,
                          resident, sync_excess(cfg, actor, vllm_weights_gib), states_awake_in)
    names = ("rollout",) + (("reward",) if reward else ()) + ("experience", "train") \
        + (("critic train",) if critic is not None else ())
    phases = tuple(_phase(name, gpu_roles, cfg) for name in names)
    notes = _notes(cfg, shape, actor, num_vllm, roles)
    if "rollout" in states_awake_in:
        notes += ("more than vLLM's share of the GPU is free when the sync ends, so DeepSpeed's sleep copy runs on "
                  "beside the rollout: the actor's optimizer states stay on the GPU until the advantage stage wakes "
                  "them",)
    return MemoryPlan(phases, gpu_total_gib, notes)


def _notes(cfg: RunConfig, shape: ModelShape, actor: TrainerBytes, num_vllm: int, roles: tuple[str, ...]) -> tuple:
    """What the terms assume, and the host memory that sleeping roles use instead of the GPU."""
    tied = "tied" if shape.tie_word_embeddings else "untied"
    notes = [f"model {cfg.actor.model_name_or_path}: {shape.num_params / 1e9:.2f}B parameters ({tied} embeddings)",
             f"largest micro-batches: train {train_tokens(cfg)} tokens, logprob forwards {forward_tokens_of(cfg)} "
             f"tokens (sequences of up to data.max_len {cfg.data.max_len})",
             "training activations of " + ("Liger's fused RMSNorm, rotary and SwiGLU kernels"
                                           if runs_fused_kernels(cfg) else "the model's own kernels")]
    if num_vllm and cfg.vllm.enable_sleep:
        weights_gib = shape.num_params * PARAM_BYTES[cfg.ds.param_dtype] / cfg.vllm.tensor_parallel_size / GIB
        held = (f"level 1: its weights wait in host memory, {weights_gib:.2f} GiB of RAM per GPU"
                if cfg.vllm.sleep_level == 1 else "level 2: its weights are dropped and pushed again")
        notes.append(f"vLLM sleeps outside the rollout phase ({held})")
    if cfg.ds.adam_offload:
        host_gib = shape.num_params / cfg.actor_world_size \
            * optimizer_bytes_per_param(cfg.actor, shape, cfg.ds.param_dtype) / GIB
        notes.append(f"ds.adam_offload: the actor's fp32 master weights and Adam moments live and step in host memory "
                     f"({host_gib:.2f} GiB of RAM per GPU); DeepSpeed's sleep moves none of them")
    elif cfg.ds.enable_sleep:
        notes.append(f"DeepSpeed sleeps outside its train phase: optimizer states wait in pinned host memory "
                     f"({actor.optimizer:.2f} GiB of RAM per GPU for the actor)")
    notes += adapter_notes(cfg, shape)
    if "ref" in roles and cfg.ref.offload:
        ref_gib = shape.num_params * PARAM_BYTES[cfg.ds.param_dtype] / GIB
        notes.append(f"ref.offload: the reference's weights wait in pinned host memory outside the experience phase "
                     f"({ref_gib:.2f} GiB of RAM per GPU)")
    if "reward" in roles and cfg.reward.model_name_or_path and cfg.reward.offload:
        notes.append(f"reward.offload: the reward model's weights wait in host memory outside the reward phase "
                     f"({reward_model_terms(cfg)[0].gib:.2f} GiB of RAM per GPU)")
    return tuple(notes)


def fit_summary(plan: MemoryPlan) -> str:
    """The verdict: it fits (with the room to spare), or it does not, with the need and the largest term."""
    if plan.fits:
        return (f"fits on a {plan.gpu_total_gib:.2f} GiB GPU "
                f"({plan.gpu_total_gib - plan.peak_gib:.2f} GiB to spare)")
    term = plan.largest_term
    return (f"does not fit: needs {plan.peak_gib:.2f} GiB of {plan.gpu_total_gib:.2f} GiB; "
            f"largest term: {term.name} ({term.gib:.2f} GiB)")


def render_memory(plan: MemoryPlan) -> list[str]:
    """The lines `hybrid plan` prints: every term of every phase in GiB, the peak and whether it fits."""
    lines = []
    for phase in plan.phases:
        lines.append(f"phase {phase.name}: {phase.total_gib:.2f} GiB")
        lines += [f"  {term.name}: {term.gib:.2f} GiB" for term in phase.terms]
    lines.append(f"peak: {plan.peak_gib:.2f} GiB in phase {plan.peak_phase.name}")
    lines.append(fit_summary(plan))
    return lines + [f"note: {note}" for note in plan.notes]

