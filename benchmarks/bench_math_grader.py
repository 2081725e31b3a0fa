"""Grading speed of the math reward on one CPU core: 10,000 responses of a realistic mix; prints one JSON line.

The mix (seeded): 60% integer and fraction answers in the seed's prompt style, right or off by a little, written in
the forms models use (\\boxed{N}, 1,234, N.0, \\frac{a}{b}, "The answer is N."); 30% drawn from the unit tests'
hand-written cases (expressions, tuples, sets, intervals, units), the adversarial ones left out; 5% fresh symbolic
pairs (\\sqrt{4k} vs 2\\sqrt{k}, (x+k)^2 vs its expansion); 5% truncated responses with no answer. Each response
carries 1-4k characters of reasoning text. The child process is started and warmed before the clock starts; the
process and its child are pinned to one core.

`--compare` instead grades the test cases with our grader alone, math-verify alone and the layered grader used by
`hybrid_core.rewards.math`, and prints how many each gets right (the figures in README.md, "Math rewards").
Usage: python benchmarks/bench_math_grader.py [--out FILE.json] [--num-responses N] [--compare [--cases FILE]]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from datetime import date
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from run_all import git_sha  # noqa: E402
CASES_FILE = REPO_ROOT / "tests" / "unit" / "rewards" / "math_cases.jsonl"
# cases written after the grader, one batch per round of fixes; each batch was graded once before its fixes
HELDOUT_BATCHES = ("heldout-", "heldout2-", "heldout3-", "heldout4-")
TARGET_S = 10.0  # issue 19: 10,000 responses in under 10 s on one core
FILLER = ("We expand the product and collect like terms. ", "Substituting back into the equation gives ",
          "Checking the boundary cases, ", "so the two expressions agree. ", "Now $3 + 4 = 7$ and $7 \\cdot 2 = 14$. ")


def load_cases(path: Path = CASES_FILE) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def reasoning(rng: random.Random) -> str:
    text = ""
    target_chars = rng.randint(1000, 4000)
    while len(text) < target_chars:
        text += rng.choice(FILLER)
    return text + "\n\n"


def numeric_pair(rng: random.Random) -> tuple[str, str]:
    """(final line, label): an integer or a fraction, right or wrong, in one of the forms models write."""
    if rng.random() < 0.25:
        numerator = rng.randint(1, 50)
        denominator = rng.randint(2, 12)
        got = numerator + rng.choice([0, 1])
        final = rng.choice([f"$\\boxed{{\\frac{{{got}}}{{{denominator}}}}}$", f"$\\boxed{{{got}/{denominator}}}$"])
        return final, f"{numerator}/{denominator}"
    label = rng.randint(0, 20000)
    got = label if rng.random() < 0.5 else label + rng.choice([-10, -1, 1, 2, 100])
    forms = [f"$\\boxed{{{got}}}$", f"$\\boxed{{{got:,}}}$", f"$\\boxed{{{got}.0}}$", f"The answer is {got}.",
             f"$\\boxed{{x = {got}}}$", f"$\\boxed{{{got}\\text{{ cm}}}}$"]
    return rng.choice(forms), str(label)


def symbolic_pair(rng: random.Random) -> tuple[str, str]:
    k = rng.randint(2, 400)
    if rng.random() < 0.5:
        return f"$\\boxed{{\\sqrt{{{4 * k}}}}}$", f"2\\sqrt{{{k + rng.choice([0, 0, 1])}}}"
    return f"$\\boxed{{(x+{k})^2}}$", f"x^2+{2 * k}x+{k * k + rng.choice([0, 0, 1])}"


def build_mix(num_responses: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """(kind, response, label) for each response."""
    rng = random.Random(seed)
    cases = [case for case in load_cases() if not case["id"].startswith("huge-")]
    mix = []
    for _ in range(num_responses):
        draw = rng.random()
        if draw < 0.60:
            kind, (final, label) = "numeric", numeric_pair(rng)
        elif draw < 0.90:
            case = rng.choice(cases)
            kind, final, label = "case", case["response"], case["label"]
        elif draw < 0.95:
            kind, (final, label) = "symbolic", symbolic_pair(rng)
        else:
            kind, final, label = "truncated", "so the total is $\\boxed{12", "12"
        mix.append((kind, reasoning(rng) + final, label))
    return mix


def bench(num_responses: int) -> dict:
    from hybrid_core.rewards.math import DEFAULT_TIMEOUT_S, grade_batch
    from hybrid_core.rewards.math_checker import SymbolicChecker

    class CountingChecker(SymbolicChecker):
        """Keeps each pair the fast path left undecided: those went to the child process."""
        def __init__(self) -> None:
            super().__init__()
            self.pairs: list[tuple[str, str]] = []

        def is_equal(self, answer: str, label: str, timeout_s: float) -> bool | None:
            self.pairs.append((answer, label))
            return super().is_equal(answer, label, timeout_s)

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # the child inherits the one core
    mix = build_mix(num_responses)
    checker = CountingChecker()
    start = time.perf_counter()
    checker.is_equal("\\sqrt{8}", "2\\sqrt{2}", timeout_s=60.0)
    startup_s = time.perf_counter() - start
    start = time.perf_counter()
    grades = grade_batch([response for _, response, _ in mix], [label for _, _, label in mix], checker=checker)
    seconds = time.perf_counter() - start
    checker.close()
    counts = {kind: sum(1 for k, _, _ in mix if k == kind) for kind in ("numeric", "case", "symbolic", "truncated")}
    to_sympy = checker.pairs[1:]  # the first is the warm-up before the clock
    return {"benchmark": "math-grader", "date": date.today().isoformat(), "git_sha": git_sha(),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, pinned to 1",
            "num_responses": num_responses, "mix": counts, "seconds": round(seconds, 3),
            "responses_per_s": round(num_responses / seconds, 1), "target_s": TARGET_S * num_responses / 10_000,
            "meets_target": seconds < TARGET_S * num_responses / 10_000, "startup_s": round(startup_s, 3),
            "num_correct": sum(g.is_correct for g in grades), "num_format_ok": sum(g.is_format_ok for g in grades),
            "num_timeouts": sum(g.is_timeout for g in grades), "timeout_s": DEFAULT_TIMEOUT_S,
            "num_sympy_checks": len(to_sympy), "num_distinct_sympy_checks": len(set(to_sympy))}


def graders() -> dict:
    """The graders compared: each maps (response, label) to a verdict."""
    import logging

    from math_verify import parse, verify

    from hybrid_core.rewards import math_symbolic
    from hybrid_core.rewards.math import grade_with

    logging.getLogger("math_verify").setLevel(logging.ERROR)

    def ours_then(symbolic):  # the shipped extraction, normalisation and steps, with this comparer, in this process
        return lambda response, label: grade_with(response, label, symbolic).is_correct

    def ours_alone(answer: str, label: str) -> bool:
        return math_symbolic.structures_equal(math_symbolic.structure(answer), math_symbolic.structure(label))

    def math_verify_alone(response: str, label: str) -> bool:  # its documented use: gold and response parsed
        return verify(parse(f"${label}$", parsing_timeout=None), parse(response, parsing_timeout=None),
                      timeout_seconds=None)

    return {"ours": ours_then(ours_alone), "math_verify": math_verify_alone,
            "ours_extraction_math_verify_comparison": ours_then(math_symbolic.math_verify_equal),
            "layered": ours_then(math_symbolic.symbolic_equal)}


def _verdict_in_fork(grader, case: dict, timeout_s: float = 3.0) -> bool:
    """The grader's verdict, computed in a forked process: a hang or a crash counts as False."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    process = context.Process(target=lambda: child.send(bool(grader(case["response"], case["label"]))))
    process.start()
    verdict = parent.recv() if parent.poll(timeout_s) else False
    process.kill()
    process.join()
    return verdict


def _by_batch(ids: list[str]) -> dict[str, int]:
    return {batch: sum(i.startswith(batch) for i in ids) for batch in HELDOUT_BATCHES}


def compare(cases: list[dict]) -> dict:
    """How many cases each grader gets right, overall and in each batch written after the grader (`heldout-*`,
    `heldout2-*`, …)."""
    num_heldout = _by_batch([case["id"] for case in cases])
    result = {"benchmark": "math-grader-compare", "date": date.today().isoformat(), "git_sha": git_sha(),
              "num_cases": len(cases), "num_heldout": num_heldout}
    for name, grader in graders().items():
        grader("$\\boxed{(x+1)^2}$", "x^2+2x+1")  # lazy imports and parser builds happen once, before the forks
        wrong = [case["id"] for case in cases if _verdict_in_fork(grader, case) != case["expected"]]
        wrong_by_batch = _by_batch(wrong)
        result[name] = {"right": len(cases) - len(wrong), "wrong": wrong,
                        "heldout_right": {batch: num_heldout[batch] - wrong_by_batch[batch] for batch in num_heldout}}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON result to this file")
    parser.add_argument("--num-responses", type=int, default=10_000)
    parser.add_argument("--compare", action="store_true", help="grade the test cases with the four graders")
    parser.add_argument("--cases", type=Path, default=CASES_FILE, help="JSONL cases for --compare (default: the "
                        "unit tests'); a new held-out batch is graded from its own file before any fix")
    args = parser.parse_args()
    if args.compare:
        result = compare(load_cases(args.cases))
    else:
        result = bench(args.num_responses)
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
