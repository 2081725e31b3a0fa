"""Build the tiny random-weight Qwen3-style causal LM and its character tokenizer, deterministically, offline.

Owns the demo/test model recipe only. head_dim is 64 because vLLM's CPU attention kernel rejects 16, and the
embeddings are untied because vLLM's CPU backend does not refresh a tied lm_head when weights are reloaded.
Usage: python data/build_tiny_model.py [OUT_DIR]   (default: data/tiny-qwen3)
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


def build_tokenizer(out_dir: Path):
    """A character-level BPE tokenizer (no merges): every printable ASCII character is one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
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


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "tiny-qwen3")
    print(f"tiny model written to {build(target)}")
