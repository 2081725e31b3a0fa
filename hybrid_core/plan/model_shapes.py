"""Model shapes for the memory plan: the architecture fields memory depends on, read from a local model's
config.json or, for hub names, from the shipped table `data/model_shapes.json` (so planning works offline), and the
parameter counts and per-token activation bytes that follow from them.

Pure functions of names and files: no torch, no Ray, no configuration.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SHAPES_FILE = Path(__file__).parents[2] / "data" / "model_shapes.json"


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

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of a decoder layer, by module name."""
        h, q_dim = self.hidden_size, self.num_attention_heads * self.head_dim
        kv_dim, inter = self.num_key_value_heads * self.head_dim, self.intermediate_size
        return {"q_proj": (h, q_dim), "k_proj": (h, kv_dim), "v_proj": (h, kv_dim), "o_proj": (q_dim, h),
                "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}

    def adapter_params(self, rank: int, target_modules: list[str]) -> int:
        """LoRA parameters of every layer's targeted linears (A: rank × in, B: out × rank), and of the output head
        when `lm_head` is named; `all-linear` is every linear of the layers (PEFT leaves the output head out)."""
        shapes = self.linear_shapes()
        targets = shapes if target_modules == ["all-linear"] else [t for t in target_modules if t in shapes]
        per_layer = sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)
        head = rank * (self.hidden_size + self.vocab_size) if "lm_head" in target_modules else 0
        return self.num_hidden_layers * per_layer + head

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
    def matrix_params(self) -> int:
        """The layers' 2-D weights (attention and MLP projections): what Muon optimises; its auxiliary Adam takes the
        embedding, the vocabulary head and the norms."""
        return self.num_hidden_layers * (self.layer_params - 2 * self.hidden_size - 2 * self.head_dim)

    @property
    def non_embedding_params(self) -> int:
        """Layers and the final norm: `num_params` without the embedding and the lm_head."""
        return self.num_hidden_layers * self.layer_params + self.hidden_size

    def activation_bytes_per_token(self, param_bytes: int, checkpointed_layers: int, fused: bool = False) -> int:
        """Bytes autograd keeps per token for the whole decoder stack during a training forward, when
        `checkpointed_layers` of its layers are checkpointed (0: none, `num_hidden_layers`: all): a checkpointed
        layer keeps its input (hidden), every other layer its full activations (`layer_bytes_per_token`)."""
        kept_layers = self.num_hidden_layers - checkpointed_layers
        return checkpointed_layers * self.hidden_size * param_bytes \
            + kept_layers * self.layer_bytes_per_token(param_bytes, fused)

    def layer_bytes_per_token(self, param_bytes: int, fused: bool = False) -> int:
        """One layer's full activations per token: what a layer that is not checkpointed keeps, and what a
        checkpointed backward recomputes at a time.

        Per layer (2-byte activations, measured within 2% on the H200 for a Qwen3-1.7B shape with sdpa attention):
        each RMSNorm keeps an fp32 copy of its input and its bf16 output (6·hidden bytes, two norms); q/k/v outputs
        2·(q + 2·kv); q_norm/k_norm 6·(q + kv); the rotated q/k 2·(q + kv); the attention output and its contiguous
        copy for o_proj 4·q; gate, up, SiLU(gate) and their product 8·intermediate. Sum: 12·hidden + 14·q + 12·kv
        + 8·intermediate.

        `fused` (Liger's RMSNorm, rotary and SwiGLU kernels): each layer norm keeps its 16-bit input beside its
        output (4·hidden each, with one fp32 scale per row); q_norm/k_norm keep nothing new (their inputs are the
        q/k outputs, and the rotary needs only cos/sin); SwiGLU keeps gate and up, and its product is down_proj's
        input: 6·intermediate. Sum: 8·hidden + 8·q + 6·kv + 6·intermediate, 0.63 of the unfused sum for Qwen3-0.6B
        (the plan then came within 1% of the H200's peak at 8,192 tokens, 2026-12-02).
        """
        h = self.hidden_size
        q_dim, kv_dim = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        if fused:
            per_layer = 8 * h + 8 * q_dim + 6 * kv_dim + 6 * self.intermediate_size
        else:
            per_layer = 12 * h + 14 * q_dim + 12 * kv_dim + 8 * self.intermediate_size
        return per_layer * param_bytes // 2


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
