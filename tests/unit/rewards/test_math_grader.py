"""The math grader (`hybrid_core.rewards.math`) on hand-written cases, its time limit, and the math reward file.

Each line of math_cases.jsonl is one test: a response, a label and the verdict worked out by hand (and, where the
case is about extraction, whether an answer was found at all).
"""
import ast
import json
import subprocess
import sys
import threading
import time
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
import torch

from hybrid_core.rewards.math import (Grade, extract_answer, grade, grade_batch, normalise_answer,
                                      quick_verdict)
from hybrid_core.rewards.reward_func import load_reward_func, score_samples

REPO_ROOT = Path(__file__).resolve().parents[3]
CASES = [json.loads(line) for line in (Path(__file__).parent / "math_cases.jsonl").read_text().splitlines()]
TOWER = "Multiplying out: $\\boxed{9^{9^{9^{9}}}}$"  # 9^(9^387420489): sympy would compute for hours
LIMIT_S = 1.0
CASE_LIMIT_S = 10.0  # the verdicts are checked with room to spare: a loaded 2-core machine is not a wrong answer
SLACK_S = 1.5  # pipe round trips and, after an earlier timeout, the replacement child's imports


def test_the_case_file_is_large_and_its_ids_are_unique():
    assert len(CASES) >= 200
    assert len({case["id"] for case in CASES}) == len(CASES)
    assert sum(case["expected"] for case in CASES) > 50 and sum(not case["expected"] for case in CASES) > 50


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case(case):
    is_meant_to_time_out = case["id"].startswith("huge-") and not case["expected"]
    result = grade(case["response"], case["label"], timeout_s=LIMIT_S if is_meant_to_time_out else CASE_LIMIT_S)
    assert result.is_correct == case["expected"], result
    if "format_ok" in case:
        assert result.is_format_ok == case["format_ok"], result


def test_the_last_box_is_extracted_with_nested_braces():
    assert extract_answer("$\\boxed{5}$ then $\\boxed{\\frac{\\sqrt{3}}{2}}$.") == "\\frac{\\sqrt{3}}{2}"
    assert extract_answer("$\\boxed{\\{1,2\\}}$") == "\\{1,2\\}"  # escaped braces do not close the box
    assert extract_answer("The answer is 7. I hope this helps!") == "7"
    assert extract_answer("**Answer:** $\\frac{1}{2}$") == "\\frac{1}{2}"
    assert extract_answer("so $\\boxed{3") is None  # truncated: no answer, even though "answer" is absent
    assert extract_answer("") is None


def test_normalisation_erases_presentation_only():
    assert normalise_answer("\\left( 1, 2 \\right)") == "(1,2)"
    assert normalise_answer("\\dfrac{1}{2}") == normalise_answer("\\frac12") == "\\frac{1}{2}"
    assert normalise_answer("1,000") == "1000" and normalise_answer("(1,000)") == "(1,000)"
    assert normalise_answer("12 \\mbox{ meters}^2") == "12"
    assert normalise_answer("x = 5.50") == "5.5"
    assert normalise_answer("\\pi r^2") == "\\pi r^2"  # the space after a command stays: not \pir
    assert normalise_answer("0.1\\overline{6}") == "\\frac{1}{6}"  # 0.1 + 6/90


def test_plain_numbers_are_decided_without_sympy():
    assert quick_verdict("\\frac{1}{2}", "0.5") is True
    assert quick_verdict("0.333", "1/3") is False  # relative error 1e-3, far above 1e-9
    assert quick_verdict("0.3333333333", "1/3") is True  # relative error 1e-10
    assert quick_verdict("12", "1.2") is False
    assert quick_verdict("\\sqrt{4}", "2") is None  # needs sympy


def test_grade_is_a_frozen_keyword_only_record():
    result = grade("$\\boxed{7}$", "7")
    assert result == Grade(is_correct=True, is_format_ok=True, is_timeout=False, extracted="7")
    with pytest.raises(FrozenInstanceError):
        result.is_correct = False
    with pytest.raises(TypeError):
        Grade(True, True, False, "7")


def test_grade_batch_pairs_responses_with_labels():
    results = grade_batch(["\\boxed{1}", "\\boxed{2}", "nothing"], ["1", "3", "3"])
    assert [(r.is_correct, r.is_format_ok) for r in results] == [(True, True), (False, True), (False, False)]
    with pytest.raises(ValueError, match="got 2 and 1"):
        grade_batch(["a", "b"], ["1"])


def _timed_grade(response: str, label: str) -> tuple[Grade, float]:
    grade("$\\boxed{\\sqrt{8}}$", "2\\sqrt{2}", timeout_s=60)  # the child is up and warm before the clock starts
    start = time.perf_counter()
    result = grade(response, label, timeout_s=LIMIT_S)
    return result, time.perf_counter() - start


def test_a_power_tower_times_out_instead_of_hanging():
    result, elapsed_s = _timed_grade(TOWER, "1")
    assert result.is_timeout and not result.is_correct and result.is_format_ok
    assert elapsed_s < LIMIT_S + SLACK_S, elapsed_s
    assert grade("$\\boxed{\\sqrt{8}}$", "2\\sqrt{2}").is_correct  # the replacement child answers


def test_the_time_limit_holds_off_the_main_thread():
    results = []
    worker = threading.Thread(target=lambda: results.append(_timed_grade(TOWER, "1")))
    worker.start()
    worker.join(timeout=60)
    (result, elapsed_s), = results
    assert result.is_timeout and elapsed_s < LIMIT_S + SLACK_S, (result, elapsed_s)


def _chat(prompt: str, response: str) -> tuple[str, str]:
    templated = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    return templated + response + "<|im_end|>", templated


@pytest.mark.parametrize("path", ["data/rewards/math_reward_func.py", "data/math_reward_func.py"])
def test_the_reward_file_follows_the_seed_interface(path):
    func = load_reward_func(str(REPO_ROOT / path))
    prompt = "What is 7 * 8? Put the final answer in \\boxed{}."
    pairs = [_chat(prompt, "7 * 8 = 56, so $\\boxed{56}$."), _chat(prompt, "I think 54."), _chat(prompt, TOWER)]
    queries = [query for query, _ in pairs]
    prompts = [templated for _, templated in pairs]
    out = func(queries, prompts, ["56", "56", "56"])
    assert out["rewards"].dtype == torch.float32 and out["rewards"].shape == (3,)
    assert out["rewards"].tolist() == [1.0, 0.0, 0.0] and torch.equal(out["scores"], out["rewards"])
    assert set(out["extra_logs"]) == {"format_ok", "timeout"}
    assert out["extra_logs"]["format_ok"].tolist() == [1.0, 0.0, 1.0]
    assert out["extra_logs"]["timeout"].tolist() == [0.0, 0.0, 1.0]
    assert score_samples(func, path, queries, prompts, ["56", "56", "56"]).rewards == [1.0, 0.0, 0.0]


def test_the_prompt_box_is_not_read_as_the_answer():
    func = load_reward_func(str(REPO_ROOT / "data/rewards/math_reward_func.py"))
    prompt = "Compute 81 / 9. Put the final answer in \\boxed{}. Answer: 9"
    out = func([prompt + " I do not know."], [prompt], ["9"])  # no chat template: the prompt is a prefix
    assert out["rewards"].tolist() == [0.0] and out["extra_logs"]["format_ok"].tolist() == [0.0]


def test_importing_the_grader_loads_neither_sympy_nor_torch():
    code = "import sys, hybrid_core.rewards.math; print(sorted({'sympy', 'torch', 'math_verify'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


ALLOWED_IMPORTS = {"torch", "numpy", "sympy", "math_verify", "hybrid_core.types", "hybrid_core.rewards"}


@pytest.mark.parametrize("module", ["math", "math_checker", "math_symbolic"])
def test_the_grader_imports_only_what_the_rewards_layer_may(module):
    tree = ast.parse((REPO_ROOT / "hybrid_core" / "rewards" / f"{module}.py").read_text())
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    outside = [name for name in names if name.split(".")[0] not in sys.stdlib_module_names
               and not any(name == allowed or name.startswith(allowed + ".") for allowed in ALLOWED_IMPORTS)]
    assert outside == []
