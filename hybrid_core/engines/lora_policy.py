"""A LoRA policy: the base model wrapped with PEFT adapters, and what the rest of the engines need to know of it.

Owns wrapping (`with_adapters`: only the adapters require gradients, so DeepSpeed gives only them optimizer states),
the adapter's names as PEFT files and vLLM read them (`adapter_parameters`), the adapter's config for vLLM, the
reference forward (the base with the adapters off: the initial policy exactly) and the merged weights of an export.
It knows nothing about DeepSpeed, vLLM, Ray or the store.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

ADAPTER = "default"  # PEFT's adapter name; its files and vLLM name tensors without it


@dataclass(frozen=True, kw_only=True)
class LoraSettings:
    rank: int
    alpha: int
    target_modules: tuple[str, ...]
    dropout: float = 0.0
    seed: int = 0  # the A matrices' initial draw (train.seed): every run and every rank starts from the same adapter

    @classmethod
    def of(cls, lora, seed: int) -> LoraSettings | None:
        """From the config's `ds.lora` block and the run's seed (None when the rank is 0: no adapters)."""
        if lora.rank == 0:
            return None
        return cls(rank=lora.rank, alpha=lora.alpha, target_modules=tuple(lora.target_modules), dropout=lora.dropout,
                   seed=seed)


def with_adapters(model: torch.nn.Module, lora: LoraSettings, is_checkpointed: bool) -> torch.nn.Module:
    """`model` as a PEFT model with fresh adapters (A drawn from `lora.seed`, B zero: the policy starts as the base
    exactly); the base's parameters are frozen. Torch's global generator is left as it was."""
    from peft import LoraConfig, get_peft_model

    targets = "all-linear" if lora.target_modules == ("all-linear",) else list(lora.target_modules)
    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=targets, lora_dropout=lora.dropout,
                        task_type="CAUSAL_LM")
    if is_checkpointed:  # checkpointed blocks need an input that requires grad, which the frozen embedding is not
        model.enable_input_require_grads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(lora.seed)
        return get_peft_model(model, config)


def has_adapters(module: torch.nn.Module) -> bool:
    return hasattr(module, "peft_config")


def adapter_name(parameter_name: str) -> str:
    """`...q_proj.lora_A.default.weight` → `...q_proj.lora_A.weight` (PEFT's file names, vLLM's tensor names)."""
    return parameter_name.replace(f".{ADAPTER}.", ".")


def adapter_parameters(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The adapter's parameters by their PEFT file names, in module order."""
    return [(adapter_name(name), p) for name, p in module.named_parameters() if ".lora_" in name]


def adapter_config(module: torch.nn.Module) -> dict:
    """The adapter's PEFT config as vLLM reads it (`PEFTHelper.from_dict`), with the targets it resolved."""
    config = module.peft_config[ADAPTER]
    return {"r": config.r, "lora_alpha": config.lora_alpha, "target_modules": sorted(config.target_modules),
            "lora_dropout": 0.0, "bias": "none"}


def reference_forward(module: torch.nn.Module):
    """A context in which `module` computes the reference policy: the base with its adapters off (a no-op for a
    model without adapters)."""
    return module.disable_adapter() if has_adapters(module) else contextlib.nullcontext()


def merged_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapter merged into its layer (W + scale·B·A), by the base's own
    names; `module` is left as it was (PEFT's merge_and_unload would change it)."""
    from peft.tuners.lora import LoraLayer

    merged = {}
    base = module.get_base_model()
    for name, layer in base.named_modules():
        if isinstance(layer, LoraLayer) and ADAPTER in layer.lora_A:
            weight = layer.get_base_layer().weight.detach()
            merged[f"{name}.weight"] = weight + layer.get_delta_weight(ADAPTER).to(weight.dtype)
    state = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        state[plain] = merged.get(plain, tensor)
    return state
