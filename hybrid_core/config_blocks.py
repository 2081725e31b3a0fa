"""The base of every configuration block, the optimizer block the actor and the critic share (`--<role>.optim`,
`--<role>.adam.*`, `--<role>.muon.*`, the schedule and clipping), and the two trainer blocks (`--actor.*`,
`--critic.*`).

Part of the configuration tree of `config.py`, which re-exports these names; pydantic only, no torch or Ray.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class ConfigError(ValueError):
    """A configuration with one or more problems; `problems` holds one message per line."""
    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class ConfigBlock(BaseModel):
    """Base of every config model: immutable, unknown keys are errors. Each block declares beside its fields which
    have behaviour (`IMPLEMENTED`: `hybrid train` refuses any other set flag) and which values of a choice field
    work yet (`IMPLEMENTED_VALUES`)."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset()
    IMPLEMENTED_VALUES: ClassVar[dict[str, frozenset]] = {}


class AdamConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"lr", "betas", "eps", "weight_decay"})
    lr: float = Field(1e-6, ge=0, description="Adam learning rate (0 freezes the policy: a control run)")
    betas: tuple[float, float] = Field((0.9, 0.95), description="Adam betas (beta1 beta2)")
    eps: float = Field(1e-8, gt=0, description="Adam epsilon")
    weight_decay: float = Field(0.0, ge=0, description="decoupled weight decay")


class MuonConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"lr", "momentum"})  # DeepSpeed's Muon: 5 steps, Nesterov
    lr: float = Field(0.02, gt=0, description="Muon learning rate (2-D hidden weights)")
    momentum: float = Field(0.95, ge=0, lt=1, description="Muon momentum")
    ns_steps: int = Field(5, gt=0, description="Newton-Schulz iterations (DeepSpeed always runs 5)")
    nesterov: bool = Field(True, description="Nesterov momentum (DeepSpeed always uses it); --<role>.muon.no_nesterov")


class OptimizerFields(ConfigBlock):
    """The optimizer block shared by the actor and the critic."""

    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"optim", "lr_scheduler", "lr_warmup_ratio", "min_lr_ratio", "max_norm"})
    optim: Literal["adam", "muon"] = Field("adam", description="optimizer (muon: DeepSpeed's Muon with an aux Adam)")
    adam: AdamConfig = Field(default_factory=AdamConfig, description="Adam settings (also Muon's auxiliary Adam)")
    muon: MuonConfig = Field(default_factory=MuonConfig, description="Muon settings (optim=muon)")
    lr_scheduler: Literal["cosine_with_min_lr", "constant", "linear", "cosine"] = Field(
        "cosine_with_min_lr", description="learning-rate schedule")
    lr_warmup_ratio: float = Field(0.03, ge=0, le=1, description="fraction of steps spent warming up")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr as a fraction of the peak lr")
    max_norm: float = Field(1.0, ge=0, description="gradient clipping norm (0: no clipping)")


class LoraConfig(ConfigBlock):
    """`--ds.lora.*`: PEFT LoRA adapters on the policy (rank 0: off); only the adapters train and sync."""

    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"rank", "alpha", "target_modules", "dropout", "save_merged"})
    rank: int = Field(0, ge=0, description="LoRA rank (0: off)")
    alpha: int = Field(16, gt=0, description="LoRA alpha (the update is scaled by alpha / rank)")
    target_modules: list[str] = Field(default_factory=lambda: ["all-linear"],
                                      description="LoRA targets: module names (q_proj ...) or all-linear")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout")
    save_merged: bool = Field(False, description="PROJECT: HF exports also hold the merged model (`merged/`) beside "
                              "the PEFT adapter")


class ActorConfig(OptimizerFields):
    IMPLEMENTED_VALUES: ClassVar[dict[str, frozenset]] = {"policy_loss_type": frozenset({"ppo", "gspo"})}
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset(OptimizerFields.IMPLEMENTED | {
        "model_name_or_path", "num_nodes", "num_gpus_per_node", "gradient_checkpointing_enable",
        "gradient_checkpointing_reentrant", "gradient_checkpointing_layers", "eps_clip", "eps_clip_low_high",
        "dual_clip", "policy_loss_type", "entropy_coef"})
    model_name_or_path: str | None = Field(None, description="HF model id or local path of the policy")
    num_nodes: int = Field(1, gt=0, description="nodes for the actor")
    num_gpus_per_node: int = Field(8, gt=0, description="GPUs per node for the actor")
    gradient_checkpointing_enable: bool = Field(False, description="activation checkpointing")
    gradient_checkpointing_reentrant: bool = Field(False, description="reentrant checkpointing")
    gradient_checkpointing_layers: int | None = Field(
        None, gt=0, description="PROJECT: with checkpointing on, recompute only the first N decoder layers; the others "
        "keep their activations (less recompute, more memory: `hybrid plan` shows the train phase). None: every layer")
    eps_clip: float = Field(0.2, gt=0, description="PPO clip range")
    eps_clip_low_high: tuple[float, float] | None = Field(None, description="asymmetric clip (low high)")
    dual_clip: float | None = Field(None, gt=1, description="dual-clip constant c (> 1)")
    policy_loss_type: Literal["ppo", "gspo"] = Field("ppo", description="token-level PPO or sequence-level GSPO")
    aux_loss_coef: float = Field(0.0, ge=0, description="MoE balance loss coefficient")
    entropy_coef: float | None = Field(None, description="entropy bonus (None: off, 0: log only)")
    freeze_visual_encoder: bool = Field(False, description="freeze the vision tower (VLM)")

    def checkpointed_layers(self, num_layers: int) -> int:
        """How many of a `num_layers`-layer decoder's layers recompute their activations in the backward."""
        if not self.gradient_checkpointing_enable:
            return 0
        return min(self.gradient_checkpointing_layers or num_layers, num_layers)


class CriticConfig(OptimizerFields):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset(OptimizerFields.IMPLEMENTED | {
        "model_name_or_path", "num_nodes", "num_gpus_per_node", "value_clip", "freezing_steps"})
    adam: AdamConfig = Field(default_factory=lambda: AdamConfig(lr=9e-6), description="Adam settings")
    model_name_or_path: str | None = Field(None, description="critic model (default: reward model path)")
    num_nodes: int = Field(1, gt=0, description="nodes for the critic")
    num_gpus_per_node: int = Field(8, gt=0, description="GPUs per node for the critic")
    value_clip: float = Field(0.5, gt=0, description="value clip range")
    freezing_steps: int = Field(-1, ge=-1, description="keep the actor frozen for the first N steps")
    save_value_network: bool = Field(False, description="also save the value network")
