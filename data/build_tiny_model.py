"""Build the tiny random-weight Qwen3-style causal LM and its character tokenizer, deterministically, offline.

Owns the demo/test model recipe only. head_dim is 64 because vLLM's CPU attention kernel rejects 16, and the
embeddings are untied because vLLM's CPU backend does not refresh a tied lm_head when weights are reloaded.
It also builds random-weight stand-ins of real Qwen3 shapes (data/model_shapes.json) for GPU tests and benchmarks:
the same character tokenizer, its vocabulary padded with placeholder tokens up to the model's vocab_size so every
id decodes, bf16 weights with the shape's tying. `--reward` builds the tiny reward model beside it: the tiny policy's
backbone shape and tokenizer with a seeded random value head `score` (transformers' Qwen3ForSequenceClassification,
one label), the layout OpenRLHF's reward models have, and a `mean`/`std` for --reward.normalize_enable.
Usage: python data/build_tiny_model.py [OUT_DIR]   (default: data/tiny-qwen3)
       python data/build_tiny_model.py --reward [OUT_DIR]   (default: data/tiny-qwen3-rm)
       python data/build_tiny_model.py --standin Qwen/Qwen3-1.7B OUT_DIR [--device cuda]
"""
import json
import string
import sys
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MODEL_SHAPE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=64, max_position_embeddings=512)


def build_tokenizer(out_dir: Path, vocab_size: int | None = None):
    """A character-level BPE tokenizer (no merges): every printable ASCII character is one token; with
    `vocab_size`, placeholder tokens `<|pN|>` fill the vocabulary up to that size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    tokens = SPECIAL_TOKENS + chars
    tokens += [f"<|p{i}|>" for i in range(len(tokens), vocab_size or 0)]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_model(out_dir: Path, vocab_size: int, eos_token_id: int, pad_token_id: int, seed: int = 0) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=vocab_size, tie_word_embeddings=False, eos_token_id=eos_token_id,
                         pad_token_id=pad_token_id, bos_token_id=None, rope_theta=10000.0, torch_dtype="float32",
                         **MODEL_SHAPE)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = eos_token_id
    model.save_pretrained(out_dir, safe_serialization=True)


def build(out_dir: Path, seed: int = 0) -> Path:
    """Write tokenizer and model into `out_dir`; returns it. Same seed, same bytes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    vocab_size = 64 * ((len(tokenizer) + 63) // 64)  # round up: kernels prefer aligned vocab sizes
    build_model(out_dir, vocab_size, tokenizer.eos_token_id, tokenizer.pad_token_id, seed)
    (out_dir / "BUILT_BY").write_text(json.dumps({"script": "data/build_tiny_model.py", "seed": seed}) + "\n")
    return out_dir


# What OpenRLHF's train_rm stores in a reward model's config.json: the head's name and, with normalisation, the
# training rewards' mean and std (made up here, so normalising visibly changes the rewards).
REWARD_CONFIG = {"value_head_prefix": "score", "mean": 0.05, "std": 0.2}


def build_reward_model(out_dir: Path, seed: int = 1) -> Path:
    """Write the tiny reward model (tokenizer, backbone, value head) into `out_dir`; same seed, same bytes."""
    import torch
    from transformers import Qwen3Config, Qwen3ForSequenceClassification

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    config = Qwen3Config(vocab_size=64 * ((len(tokenizer) + 63) // 64), tie_word_embeddings=False, num_labels=1,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         rope_theta=10000.0, torch_dtype="float32", **MODEL_SHAPE, **REWARD_CONFIG)
    torch.manual_seed(seed)
    model = Qwen3ForSequenceClassification(config).to(torch.float32)
    torch.nn.init.normal_(model.score.weight, std=1.0 / (config.hidden_size + 1) ** 0.5)
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "BUILT_BY").write_text(json.dumps({"script": "data/build_tiny_model.py", "reward": True,
                                                  "seed": seed}) + "\n")
    return out_dir


def build_standin(name: str, out_dir: Path, device: str = "cpu", seed: int = 0) -> Path:
    """A random-weight bf16 model with the shape of hub model `name` (data/model_shapes.json)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    shapes = json.loads((Path(__file__).parent / "model_shapes.json").read_text())
    if name not in shapes:
        raise SystemExit(f"--standin: unknown model {name!r}; known: {', '.join(k for k in shapes if k[0] != '_')}")
    shape = shapes[name]
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir, shape["vocab_size"])
    config = Qwen3Config(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, torch_dtype="bfloat16", **shape)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "BUILT_BY").write_text(json.dumps({"script": "data/build_tiny_model.py", "standin": name,
                                                  "seed": seed}) + "\n")
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--standin":
        device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
        print(f"stand-in written to {build_standin(sys.argv[2], Path(sys.argv[3]), device)}")
    elif len(sys.argv) > 1 and sys.argv[1] == "--reward":
        target = Path(sys.argv[2] if len(sys.argv) > 2 else Path(__file__).parent / "tiny-qwen3-rm")
        print(f"tiny reward model written to {build_reward_model(target)}")
    else:
        target = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "tiny-qwen3")
        print(f"tiny model written to {build(target)}")
