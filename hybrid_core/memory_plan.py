"""Per-GPU memory estimate of a colocated run: the terms `hybrid plan` prints and `hybrid train` checks.

Owns model shapes (a local model's config.json, or the shipped table `data/model_shapes.json` for hub names, so
planning works offline) and the bytes every role holds on one GPU in each phase of a step. Pure functions of a
`RunConfig`: no torch, no Ray. It does not know the placement (the caller names the roles sharing the GPU), what
vLLM does inside its reservation, or the allocator's fragmentation beyond the cached blocks it models.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from hybrid_core.config import RunConfig

GIB = 2**30
SHAPES_FILE = Path(__file__).parents[1] / "data" / "model_shapes.json"
PARAM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
CONTEXT_GIB = 0.5  # one CUDA context (measured 0.51 GiB on the H200, CUDA 13, lazy module loading)
# Outside PyTorch's pool in a DeepSpeed process after a step: NCCL and cuBLAS buffers (measured 1.30 GiB with the
# context on the H200, ZeRO-1/2/3, one rank), on top of CONTEXT_GIB.
DEEPSPEED_RUNTIME_GIB = 0.8
ZERO3_SUB_GROUP_PARAMS = 10**9  # DeepSpeed's stage-3 `sub_group_size` default: its optimizer steps one group at a time
# Bytes per logit (tokens × vocab) at the peak of the policy's forward+backward: bf16 logits gathered at the
# response positions, their fp32 copy kept for logsumexp's backward, its exp temporary and the fp32 gradient being
# built (measured 18.1 on the H200 with this project's token_logprobs); an entropy bonus that enters the loss keeps
# its softmax and adds 6. A no-grad logprob forward holds the full bf16 logits, the gathered copy, the fp32 copy and
# logsumexp's temporary: 12.
TRAIN_LOGIT_BYTES = 18
ENTROPY_LOGIT_BYTES = 6
FORWARD_LOGIT_BYTES = 12
# Per parameter of the rank's partition during DeepSpeed's optimizer step: the fp32 copy of the gradients and
# torch AdamW's sqrt(v) temporary (measured +8.0 bytes/param over the resident states, ZeRO-2 on the H200).
# These are two fp32 tensors of the partition's size. Under ZeRO ≤ 2 they come out of PyTorch's cache when the
# backward freed fp32 logit blocks at least as large (tokens × vocab ≥ the partition's parameters). The cache
# splits a larger free block, so then the step adds nothing. Measured on the H200: at 8,192 tokens the blocks were
# smaller and the step added its 8 bytes/param. At 16,384 padded tokens the whole GPU peaked at 73.1 GiB; the
# plan said 87.5 GiB with the step counted and 85.1 GiB without it; the rest was the experience forward's cache,
# counted twice (see _trainer_terms): the plan now says 74.7 GiB (+2.1%).
STEP_BYTES = 8
SYNC_BUFFERS = 2  # weight-sync bucket buffers the actor fills in turn (engines/weight_sync.py BucketBuffers)


@dataclass(frozen=True)
class ModelShape:
    """The architecture fields of a Qwen-style decoder (a config.json's names) that memory depends on."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool

    @property
    def layer_params(self) -> int:
        """One decoder layer: q/k/v/o projections (no biases), gate/up/down MLP, two RMSNorms, q_norm and k_norm."""
        h, q_dim, kv_dim = self.hidden_size, self.num_attention_heads * self.head_dim, \
            self.num_key_value_heads * self.head_dim
        attention = h * q_dim + 2 * h * kv_dim + q_dim * h
        return attention + 3 * h * self.intermediate_size + 2 * h + 2 * self.head_dim

    @property
    def largest_param_numel(self) -> int:
        """The biggest single tensor (the embedding for these vocabularies): a sync bucket is at least that big."""
        q_dim = self.num_attention_heads * self.head_dim
        return max(self.vocab_size * self.hidden_size, self.hidden_size * max(self.intermediate_size, q_dim))

    @property
    def num_params(self) -> int:
        """Embedding + layers + final norm + lm_head (none when tied to the embedding)."""
        embedding = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embedding
        return embedding + self.num_hidden_layers * self.layer_params + self.hidden_size + lm_head

    @property
    def non_embedding_params(self) -> int:
        """Layers and the final norm: `num_params` without the embedding and the lm_head."""
        return self.num_hidden_layers * self.layer_params + self.hidden_size

    def activation_bytes_per_token(self, param_bytes: int, is_checkpointed: bool) -> int:
        """Bytes autograd keeps per token for the whole decoder stack during a training forward.

        Checkpointed: each layer's input (hidden). Otherwise, per layer (2-byte activations, measured within 2% on
        the H200 for a Qwen3-1.7B shape with sdpa attention): each RMSNorm keeps an fp32 copy of its input and its
        bf16 output (6·hidden bytes, two norms); q/k/v outputs 2·(q + 2·kv); q_norm/k_norm 6·(q + kv); the rotated
        q/k 2·(q + kv); the attention output and its contiguous copy for o_proj 4·q; gate, up, SiLU(gate) and
        their product 8·intermediate. Sum: 12·hidden + 14·q + 12·kv + 8·intermediate.
        """
        h = self.hidden_size
        if is_checkpointed:
            return self.num_hidden_layers * h * param_bytes
        q_dim, kv_dim = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        per_layer = 12 * h + 14 * q_dim + 12 * kv_dim + 8 * self.intermediate_size
        return self.num_hidden_layers * per_layer * param_bytes // 2

    def layer_bytes_per_token(self, param_bytes: int) -> int:
        """One layer's full activations per token: what a checkpointed backward recomputes at a time."""
        return self.activation_bytes_per_token(param_bytes, False) // self.num_hidden_layers


def model_shape(name_or_path: str | None, field: str = "actor.model_name_or_path") -> ModelShape:
    """The shape of a local HF model directory (its config.json) or of a hub name in `data/model_shapes.json`.

    Raises:
        ValueError: naming `field`, the value and the fix, when neither source knows the model.
    """
    table = {name: shape for name, shape in json.loads(SHAPES_FILE.read_text()).items() if not name.startswith("_")}
    if name_or_path is not None:
        config_file = Path(name_or_path) / "config.json"
        if config_file.is_file():
            return _shape_from(json.loads(config_file.read_text()), str(config_file))
        if name_or_path in table:
            return _shape_from(table[name_or_path], f"{SHAPES_FILE} [{name_or_path!r}]")
    raise ValueError(f"{field} has no known model shape for the memory plan: got {name_or_path!r}; give a local "
                     f"HF model directory with a config.json, or one of {', '.join(sorted(table))} "
                     f"(add others to {SHAPES_FILE.name})")


def _shape_from(fields: dict, source: str) -> ModelShape:
    fields = fields.get("text_config", fields)  # multimodal configs nest the language model's fields
    missing = [name for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                 "vocab_size") if name not in fields]
    if missing:
        raise ValueError(f"{source} lacks {', '.join(missing)}: got keys {sorted(fields)}; the memory plan needs "
                         "a decoder config (hidden_size, intermediate_size, num_hidden_layers, …)")
    heads = fields["num_attention_heads"]
    return ModelShape(fields["hidden_size"], fields["intermediate_size"], fields["num_hidden_layers"], heads,
                      fields.get("num_key_value_heads") or heads,
                      fields.get("head_dim") or fields["hidden_size"] // heads, fields["vocab_size"],
                      bool(fields.get("tie_word_embeddings", False)))


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
    """Weights, gradients, optimizer states (fp32 master + Adam moments), activations, logits and the optimizer
    step's temporaries of one rank, for ZeRO stage `ds.zero_stage` over the actor's world size.

    ZeRO ≥ 1 divides optimizer states, ≥ 2 gradients, 3 weights; `ds.adam_offload` keeps the optimizer on the host.
    `has_logits`: the policy (a vocabulary head); the critic's value head has none worth counting.
    """
    params, world, stage = shape.num_params, cfg.actor_world_size, cfg.ds.zero_stage
    param_bytes = PARAM_BYTES[cfg.ds.param_dtype]
    state_bytes = 8 + (0 if cfg.ds.param_dtype == "fp32" else 4)
    partition = params / world if stage >= 1 else params
    step_params = min(partition, ZERO3_SUB_GROUP_PARAMS) if stage == 3 else partition
    tokens, forward_tokens = ring_tokens(train_tokens(cfg), cfg), ring_tokens(forward_tokens_of(cfg), cfg)
    logit_bytes = TRAIN_LOGIT_BYTES + (ENTROPY_LOGIT_BYTES if (cfg.actor.entropy_coef or 0) > 0 else 0)
    is_checkpointed = cfg.actor.gradient_checkpointing_enable
    activations = tokens * shape.activation_bytes_per_token(param_bytes, is_checkpointed)
    if is_checkpointed:  # the backward recomputes one layer at a time
        activations += tokens * shape.layer_bytes_per_token(param_bytes)
    activations += ring_kv_bytes(cfg, shape, tokens, is_checkpointed)
    offloaded = cfg.ds.adam_offload
    step_from_cache = has_logits and stage < 3 and tokens * shape.vocab_size >= step_params
    return TrainerBytes(
        weights=params * param_bytes / (world if stage == 3 else 1) / GIB,
        gradients=params * param_bytes / (world if stage >= 2 else 1) / GIB,
        optimizer=0.0 if offloaded else partition * state_bytes / GIB,
        activations=activations / GIB,
        logits=tokens * shape.vocab_size * logit_bytes / GIB if has_logits else 0.0,
        step=0.0 if offloaded or step_from_cache else step_params * STEP_BYTES / GIB,
        forward=forward_tokens * shape.vocab_size * FORWARD_LOGIT_BYTES / GIB if has_logits else 0.0)


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


def ring_kv_bytes(cfg: RunConfig, shape: ModelShape, tokens: int, is_checkpointed: bool) -> int:
    """All-gathered keys and values a ring keeps per layer for the backward (one layer's with checkpointing)."""
    size, kv_width = cfg.ds.ring_attn_size, shape.num_key_value_heads * shape.head_dim
    per_layer = size * tokens * 2 * kv_width * PARAM_BYTES[cfg.ds.param_dtype] if size > 1 else 0
    return per_layer * (1 if is_checkpointed else shape.num_hidden_layers)


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


def _phase(name: str, roles: _GpuRoles, cfg: RunConfig) -> Phase:
    """One phase's terms: vLLM holds its reservation in the rollout phase (in every phase without vllm sleep)."""
    terms = []
    if roles.vllm_gib and (name == "rollout" or not cfg.vllm.enable_sleep):
        terms.append(Term("vLLM reservation", roles.vllm_gib))
    terms += _trainer_terms("actor", roles.actor, name, "train", cfg.ds.enable_sleep)
    if roles.ref:  # the reference empties PyTorch's cache after its forwards: the forward counts where it runs
        terms += roles.ref if name == "experience" else roles.ref[:1]
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
    forwards), train (the actor's update) and, with a critic, critic train. vLLM reserves
    `vllm.gpu_memory_utilization` of the whole GPU for its weights, KV cache and activations. The reference model
    keeps its weights; its logprob forward counts in the experience phase; the reward model's in the reward phase.

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
        # the policy's shape and dtype, partitioned like the actor's weights under ZeRO-3
        ref = (Term("ref weights", actor.weights), Term("ref logprob forward", actor.forward))
    reward = reward_model_terms(cfg) if "reward" in roles and cfg.reward.model_name_or_path else ()
    num_vllm = math.ceil(cfg.num_rollout_gpus / cfg.actor_world_size) if "rollout" in roles else 0
    num_processes = 1 + num_vllm + ("ref" in roles) + (critic is not None) + bool(reward)
    resident = (Term("CUDA contexts", num_processes * CONTEXT_GIB),
                Term("DeepSpeed NCCL/cuBLAS buffers", (1 + (critic is not None)) * DEEPSPEED_RUNTIME_GIB))
    if num_vllm:  # the actor packs weight buckets into persistent buffers that vLLM maps through CUDA IPC
        bucket_bytes = max(cfg.vllm.sync_bucket_mb * 2**20, shape.largest_param_numel * PARAM_BYTES[cfg.ds.param_dtype])
        resident += (Term("actor weight-sync buffers", SYNC_BUFFERS * bucket_bytes / GIB),)
    gpu_roles = _GpuRoles(actor, critic, ref, reward, num_vllm * cfg.vllm.gpu_memory_utilization * gpu_total_gib,
                          resident)
    names = ("rollout",) + (("reward",) if reward else ()) + ("experience", "train") \
        + (("critic train",) if critic is not None else ())
    phases = tuple(_phase(name, gpu_roles, cfg) for name in names)
    return MemoryPlan(phases, gpu_total_gib, _notes(cfg, shape, actor, num_vllm, roles))


def _notes(cfg: RunConfig, shape: ModelShape, actor: TrainerBytes, num_vllm: int, roles: tuple[str, ...]) -> tuple:
    """What the terms assume, and the host memory that sleeping roles use instead of the GPU."""
    tied = "tied" if shape.tie_word_embeddings else "untied"
    notes = [f"model {cfg.actor.model_name_or_path}: {shape.num_params / 1e9:.2f}B parameters ({tied} embeddings)",
             f"largest micro-batches: train {train_tokens(cfg)} tokens, logprob forwards {forward_tokens_of(cfg)} "
             f"tokens (sequences of up to data.max_len {cfg.data.max_len})"]
    if num_vllm and cfg.vllm.enable_sleep:
        weights_gib = shape.num_params * PARAM_BYTES[cfg.ds.param_dtype] / cfg.vllm.tensor_parallel_size / GIB
        held = (f"level 1: its weights wait in host memory, {weights_gib:.2f} GiB of RAM per GPU"
                if cfg.vllm.sleep_level == 1 else "level 2: its weights are dropped and pushed again")
        notes.append(f"vLLM sleeps outside the rollout phase ({held})")
    if cfg.ds.enable_sleep:
        notes.append(f"DeepSpeed sleeps outside its train phase: optimizer states wait in pinned host memory "
                     f"({actor.optimizer:.2f} GiB of RAM per GPU for the actor)")
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
