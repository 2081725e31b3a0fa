"""The rollout engine's LoRA adapter: vLLM with LoRA on, one adapter slot, a new adapter id per synced version.

Owns the `LLM(...)` options of a LoRA engine (`max_lora_rank`: the smallest rank vLLM allows that holds the
policy's), loading an adapter from tensors in the engine's worker (vLLM 0.32's `LoRAModel.from_lora_tensors`, as
its own file loader does after reading the files; no file is written), the `LoRARequest` every generation names
(its id is the version's, so vLLM never serves a cached older adapter) and the host copy that re-adds the adapter
after the base weights were reloaded. It knows nothing about Ray, the store or how the tensors arrived.
"""
from __future__ import annotations

import torch

from hybrid_core.engines.lora_policy import LoraSettings

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks
IN_MEMORY = "in-memory://policy"  # the request's path: never read, the adapter is loaded before any request names it


def lora_options(lora: LoraSettings) -> dict:
    """`LLM(...)` arguments of an engine that serves `lora`'s adapters (one at a time)."""
    fitting = [rank for rank in VLLM_LORA_RANKS if rank >= lora.rank]
    if not fitting:
        raise ValueError(f"ds.lora.rank {lora.rank} is above vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}; "
                         "use a smaller --ds.lora.rank")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": 1}


def peft_config(lora: LoraSettings, names: list[str]) -> dict:
    """The adapter's PEFT config as vLLM reads it, its targets taken from the tensor names."""
    targets = sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in names})
    return {"r": lora.rank, "lora_alpha": lora.alpha, "target_modules": targets, "lora_dropout": 0.0,
            "bias": "none"}


def _rename_mapper(model):
    """vLLM's renames of the model's HF weight names without its qkv/gate_up stacking, as its own adapter loader
    uses them: `get_rename_mapper` in vLLM 0.32, `get_unstacked_mapper` in 0.26 (None: the model renames nothing)."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is None:
        return None
    renames = getattr(mapper, "get_rename_mapper", None) or mapper.get_unstacked_mapper
    return renames()


def _add_adapter(worker, tensors: dict[str, torch.Tensor], config: dict, lora_id: int) -> int:
    """In vLLM's worker: the adapter `lora_id` from tensors replaces every adapter the worker holds, and is active."""
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager
    helper = PEFTHelper.from_dict(config)
    helper.validate_legal(manager.lora_config)
    model = manager._adapter_manager.model
    adapter = manager._lora_model_cls.from_lora_tensors(
        lora_model_id=lora_id, tensors=tensors, peft_helper=helper, device="cpu",
        dtype=manager.lora_config.lora_dtype, model_vocab_size=manager.vocab_size,
        weights_mapper=_rename_mapper(model),
        skip_prefixes=getattr(model, "lora_skip_prefixes", None))
    manager.remove_all_adapters()
    manager._adapter_manager.add_adapter(adapter)
    manager._adapter_manager.activate_adapter(lora_id)
    return len(tensors)


class AdapterSlot:
    """The adapter an engine serves: staged tensor by tensor as buckets arrive, activated as one new version."""

    def __init__(self, llm, lora: LoraSettings):
        self.llm, self.lora = llm, lora
        self.lora_id = 0  # 0: no adapter yet (the base alone, which is where a fresh LoRA policy starts)
        self.tensors: dict[str, torch.Tensor] = {}
        self._staged: dict[str, torch.Tensor] = {}

    def stage(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Keep copies (the buckets' memory is reused or read-only) until `activate`."""
        for name, tensor in named:
            if ".lora_" not in name:
                raise ValueError(f"a LoRA engine takes adapter tensors only: got {name!r} (a full-weight sync "
                                 "into an engine started with ds.lora.rank)")
            self._staged[name] = tensor.detach().to("cpu", copy=True)

    def activate(self, after_base_reload: bool = False) -> None:
        """The staged adapter becomes the served one, under a new id; with nothing staged, `after_base_reload` adds
        the served adapter again (a reload of the base weights resets vLLM's LoRA layers)."""
        if self._staged:
            self.tensors, self._staged = self._staged, {}
            self.lora_id += 1
            self._load()
        elif after_base_reload and self.lora_id:
            self._load()

    def _load(self) -> None:
        config = peft_config(self.lora, list(self.tensors))
        self.llm.collective_rpc(_add_adapter, args=(self.tensors, config, self.lora_id))

    def request(self):
        """The `LoRARequest` of the served adapter (None before the first sync: the base is the policy then)."""
        from vllm.lora.request import LoRARequest

        if not self.lora_id:
            return None
        return LoRARequest(lora_name=f"policy-{self.lora_id}", lora_int_id=self.lora_id, lora_path=IN_MEMORY)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())
