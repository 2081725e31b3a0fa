"""Unit tests for hybrid_core.engines.rollout_step: per-prompt seeds and prompt tokenisation (no vLLM started)."""

import sys
from pathlib import Path

import pytest

from hybrid_core.data.prompts import Prompt
from hybrid_core.engines.rollout_step import PromptFormat, tokenize_prompts

TINY_MODEL = Path(__file__).resolve().parents[3] / "data" / "tiny-qwen3"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_MODEL)


def _ids(text: str) -> list[int]:
    """The tiny tokenizer's ids by hand: 3 special tokens, then string.printable minus \\x0b \\x0c \\r."""
    import string

    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    return [3 + chars.index(c) for c in text]


def test_importing_the_module_does_not_import_vllm():
    # in a fresh interpreter: other tests of the session may have started a vLLM engine already
    import subprocess

    check = "import sys, hybrid_core.engines.rollout_step; assert 'vllm' not in sys.modules, 'vllm imported'"
    done = subprocess.run([sys.executable, "-c", check], cwd=TINY_MODEL.parents[1], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_tokenizer_is_one_token_per_character(tokenizer):
    assert tokenizer("abc ~\n", add_special_tokens=False)["input_ids"] == _ids("abc ~\n") == [13, 14, 15, 97, 96, 99]


def test_prompts_are_left_truncated_to_max_len_minus_max_new_tokens(tokenizer):
    prompts = [Prompt(0, "abcdefghij", "l"), Prompt(1, "xyz", "m")]
    fmt = PromptFormat(apply_chat_template=False, input_template=None, max_len=10)
    texts, ids = tokenize_prompts(tokenizer, prompts, fmt, max_new_tokens=4)
    assert texts == ["abcdefghij", "xyz"]  # the text is kept whole; only the ids are cut
    # budget 10 − 4 = 6: the last six characters "efghij" → 17..22; "xyz" fits → 36, 37, 38
    assert ids == [[17, 18, 19, 20, 21, 22], [36, 37, 38]]
    assert ids == [_ids("efghij"), _ids("xyz")]


def test_input_template_is_applied_before_truncation(tokenizer):
    fmt = PromptFormat(apply_chat_template=False, input_template="Q: {} A:", max_len=8)
    texts, ids = tokenize_prompts(tokenizer, [Prompt(3, "hello", "")], fmt, max_new_tokens=2)
    assert texts == ["Q: hello A:"]
    assert ids == [_ids("llo A:")]  # budget 8 − 2 = 6 keeps the template's end


def test_chat_template_special_tokens_are_single_tokens(tokenizer):
    fmt = PromptFormat(apply_chat_template=True, input_template=None, max_len=100)
    texts, ids = tokenize_prompts(tokenizer, [Prompt(0, "hi", "")], fmt, max_new_tokens=16)
    assert texts == ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]
    # <|im_start|> = 1, <|im_end|> = 2; 23 tokens in all, under the budget of 84
    assert ids == [[1] + _ids("user\nhi") + [2] + _ids("\n") + [1] + _ids("assistant\n")]
    # max_len 20 − 16 = 4: the generation header's last four characters survive
    fmt = PromptFormat(apply_chat_template=True, input_template=None, max_len=20)
    _, cut = tokenize_prompts(tokenizer, [Prompt(0, "hi", "")], fmt, max_new_tokens=16)
    assert cut == [_ids("ant\n")]


def test_budget_is_at_least_one_token(tokenizer):
    fmt = PromptFormat(apply_chat_template=False, input_template=None, max_len=4)
    _, ids = tokenize_prompts(tokenizer, [Prompt(0, "abc", "")], fmt, max_new_tokens=8)
    assert ids == [_ids("c")]  # max(1, 4 − 8) = 1


def test_truncation_keeps_the_last_ids_and_counts_the_cut_prompts(tokenizer, caplog):
    prompts = [Prompt(0, "abcdefghij", ""), Prompt(1, "xyz", ""), Prompt(2, "0123456789", "")]
    fmt = PromptFormat(apply_chat_template=False, input_template=None, max_len=12)
    with caplog.at_level("WARNING", logger="hybrid_core.engines.rollout_step"):
        _, ids = tokenize_prompts(tokenizer, prompts, fmt, max_new_tokens=7)
    assert ids == [_ids("fghij"), _ids("xyz"), _ids("56789")]  # budget 12 − 7 = 5: the last five of each
    (record,) = caplog.records
    assert record.getMessage() == ("2 of 3 prompts are longer than data.max_len 12 - rollout.max_new_tokens 7 = 5 "
                                   "tokens: truncated from the left to the last 5 tokens")
    caplog.clear()
    with caplog.at_level("WARNING", logger="hybrid_core.engines.rollout_step"):
        tokenize_prompts(tokenizer, prompts[1:2], fmt, max_new_tokens=7)
    assert caplog.records == []  # nothing cut, nothing said


def test_truncate_left_counts_only_longer_rows():
    from hybrid_core.engines.rollout_step import truncate_left

    assert truncate_left([[1, 2, 3, 4], [5, 6], [7, 8, 9]], 3) == ([[2, 3, 4], [5, 6], [7, 8, 9]], 1)
