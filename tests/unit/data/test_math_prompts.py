"""data/make_math_prompts.py and what uses its output: the file is reproducible and committed as generated, every
label equals an independent exact evaluation of its question, the math reward grades `\\boxed{label}` correct, and
the CPU math demo config passes `hybrid plan`."""
from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from fractions import Fraction

from tests.conftest import REPO_ROOT

QUESTION = re.compile(r"^(?:What is|Compute|Evaluate|Calculate) (?P<expr>[-+*/^() 0-9]+)[?.]"
                      r"(?P<note> Give the answer as a fraction in lowest terms\.)? Put the final answer in "
                      r"\\boxed\{\}\.$")


def _generator():
    spec = importlib.util.spec_from_file_location("make_math_prompts", REPO_ROOT / "data" / "make_math_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exact_value(expression: str) -> Fraction:
    """The expression's value by Python's grammar (`^` as `**`), every literal a Fraction: no floats anywhere."""
    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow):
                assert right.denominator == 1
                return left ** int(right)
            return {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}.get(type(node.op)) \
                if not isinstance(node.op, ast.Div) else left / right
        raise AssertionError(f"unexpected syntax in {expression!r}: {ast.dump(node)}")

    return value(ast.parse(expression.replace("^", "**"), mode="eval").body)


def _label(value: Fraction) -> str:
    return f"{value.numerator}" if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def test_the_generator_is_deterministic_and_the_committed_file_is_its_output(tmp_path):
    make = _generator()
    make.main(["--out", str(tmp_path / "a.jsonl")])
    make.main(["--out", str(tmp_path / "b.jsonl"), "--rows", "320", "--seed", "0"])
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.jsonl").read_bytes() == (REPO_ROOT / "data" / "math_prompts.jsonl").read_bytes()
    make.main(["--out", str(tmp_path / "c.jsonl"), "--seed", "1"])
    assert (tmp_path / "c.jsonl").read_bytes() != (tmp_path / "a.jsonl").read_bytes()


def test_every_label_is_the_exact_value_of_its_question():
    rows = [json.loads(line) for line in (REPO_ROOT / "data" / "math_prompts.jsonl").read_text().splitlines()]
    assert len(rows) >= 256 and all(set(row) == {"prompt", "label"} for row in rows)
    assert len({row["prompt"] for row in rows}) == len(rows)  # no question twice
    kinds = {"fraction": 0, "power": 0, "integer": 0}
    for row in rows:
        match = QUESTION.match(row["prompt"])
        assert match, row["prompt"]
        value = exact_value(match["expr"])
        assert row["label"] == _label(value), row
        assert bool(match["note"]) == (value.denominator != 1), row  # the fraction note only on fractions
        kinds["power" if "^" in match["expr"] else "fraction" if "/" in match["expr"] else "integer"] += 1
    assert min(kinds.values()) >= 80, kinds  # arithmetic, fractions and powers, in about equal shares


def test_the_math_reward_grades_the_boxed_label_correct_and_a_wrong_answer_not():
    from hybrid_core.rewards.reward_func import load_reward_func

    reward_func = load_reward_func(str(REPO_ROOT / "data" / "rewards" / "math_reward_func.py"))
    rows = [json.loads(line) for line in (REPO_ROOT / "data" / "math_prompts.jsonl").read_text().splitlines()]
    prompts, labels = [row["prompt"] for row in rows], [row["label"] for row in rows]
    right = [f"{p}Working it out, the answer is \\boxed{{{label}}}." for p, label in zip(prompts, labels)]
    wrong = [f"{p}\\boxed{{{_label(Fraction(label) + 1)}}}" for p, label in zip(prompts, labels)]
    assert reward_func(right, prompts, labels)["rewards"].tolist() == [1.0] * len(rows)
    assert reward_func(wrong, prompts, labels)["rewards"].tolist() == [0.0] * len(rows)


def test_the_cpu_math_demo_passes_the_plan():
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "plan", "--config", "data/math_demo.yaml"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "device: cpu" in proc.stdout and "not implemented yet: none" in proc.stdout

    from hybrid_core.flags import load_config_file

    demo = load_config_file(REPO_ROOT / "data" / "math_demo.yaml")
    assert demo["data"] | demo["reward"] == {
        "prompt_dataset": "data/math_prompts.jsonl", "input_key": "prompt", "label_key": "label",
        "apply_chat_template": True, "max_len": 256, "remote_url": "data/rewards/math_reward_func.py"}


def test_the_math_demo_prompts_fit_without_truncation():
    """Every chat-templated prompt of the demo fits in data.max_len − rollout.max_new_tokens (the tiny tokenizer is
    one token per character), so the demo's truncation warning never fires, and a step's prefill fits vLLM's CPU
    token budget."""
    from transformers import AutoTokenizer

    from hybrid_core.data.prompts import format_prompt
    from hybrid_core.flags import load_config_file

    demo = load_config_file(REPO_ROOT / "data" / "math_demo.yaml")
    tokenizer = AutoTokenizer.from_pretrained(REPO_ROOT / "data" / "tiny-qwen3")
    rows = [json.loads(line) for line in (REPO_ROOT / "data" / "math_prompts.jsonl").read_text().splitlines()]
    longest = max(len(tokenizer(format_prompt(r["prompt"], tokenizer, True, None), add_special_tokens=False)
                      ["input_ids"]) for r in rows)
    assert longest <= demo["data"]["max_len"] - demo["rollout"]["max_new_tokens"], longest
    # and vllm.max_num_seqs of them fit vLLM's CPU token budget of a step (no chunked prefill: see the config)
    assert demo["vllm"]["max_num_seqs"] * longest <= 4096, longest
