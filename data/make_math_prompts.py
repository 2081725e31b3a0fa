"""Writes data/math_prompts.jsonl: arithmetic prompts in the seed's format ({"prompt": ..., "label": ...}) for the
math reward (data/rewards/math_reward_func.py), with every label computed exactly.

Kinds, in equal shares: integer arithmetic (+, -, * and parentheses), fractions (sums, differences, products and
quotients of proper fractions, parenthesised where `/` would otherwise bind first; labels in lowest terms as `p/q`,
which the grader in hybrid_core/rewards/math.py reads as a number), and powers (integer and fraction bases,
exponents 0-6, and sums of powers). Each question is an expression Python's grammar reads once `^` is `**`; values
come from fractions.Fraction and int arithmetic only.
Deterministic: the same --seed and --rows give the same file, byte for byte.

    python data/make_math_prompts.py                # 320 rows, seed 0, into data/math_prompts.jsonl
    python data/make_math_prompts.py --rows 1000 --seed 1 --out /tmp/more.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
from fractions import Fraction
from pathlib import Path

INSTRUCTION = "Put the final answer in \\boxed{}."
FRACTION_NOTE = "Give the answer as a fraction in lowest terms."
OPENERS = ("What is {}?", "Compute {}.", "Evaluate {}.", "Calculate {}.")
DEFAULT_OUT = Path(__file__).resolve().parent / "math_prompts.jsonl"


def label_of(value: Fraction) -> str:
    """`7`, `-3`, `19/12` or `-5/6`: an integer, or a fraction in lowest terms (Fraction keeps it reduced)."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _fraction(rng: random.Random) -> Fraction:
    denominator = rng.randint(2, 12)
    return Fraction(rng.randint(1, denominator - 1), denominator)


def _text(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def integer_question(rng: random.Random) -> tuple[str, Fraction]:
    a, b, c = rng.randint(2, 999), rng.randint(2, 999), rng.randint(2, 30)
    shape = rng.randrange(5)
    if shape == 0:
        return f"{a} + {b}", Fraction(a + b)
    if shape == 1:
        return f"{a} - {b}", Fraction(a - b)
    if shape == 2:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        return f"{a} * {b}", Fraction(a * b)
    if shape == 3:
        return f"{a} + {b} * {c}", Fraction(a + b * c)
    return f"({a} - {b}) * {c}", Fraction((a - b) * c)


def fraction_question(rng: random.Random) -> tuple[str, Fraction]:
    x, y = _fraction(rng), _fraction(rng)
    op = rng.choice("+-*/")
    value = {"+": x + y, "-": x - y, "*": x * y, "/": x / y}[op]
    if op in "*/":  # 1/2 / 1/2 would read as ((1/2)/1)/2
        return f"({_text(x)}) {op} ({_text(y)})", value
    return f"{_text(x)} {op} {_text(y)}", value


def power_question(rng: random.Random) -> tuple[str, Fraction]:
    shape = rng.randrange(3)
    if shape == 0:
        base, exponent = rng.randint(2, 12), rng.randint(0, 6)
        return f"{base}^{exponent}", Fraction(base) ** exponent
    if shape == 1:
        base, exponent = _fraction(rng), rng.randint(2, 4)
        return f"({_text(base)})^{exponent}", base ** exponent
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    m, n = rng.randint(2, 5), rng.randint(2, 5)
    return f"{a}^{m} + {b}^{n}", Fraction(a ** m + b ** n)


KINDS = (integer_question, fraction_question, power_question)


def make_rows(num_rows: int, seed: int) -> list[dict[str, str]]:
    """`num_rows` distinct questions, the kinds taking turns, each with its exact label."""
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < num_rows:
        kind = KINDS[len(rows) % len(KINDS)]
        expression, value = kind(rng)
        if expression in seen:
            continue
        seen.add(expression)
        question = rng.choice(OPENERS).format(expression)
        note = f" {FRACTION_NOTE}" if value.denominator != 1 else ""
        rows.append({"prompt": f"{question}{note} {INSTRUCTION}", "label": label_of(value)})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=320)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    lines = [json.dumps(row) + "\n" for row in make_rows(args.rows, args.seed)]
    args.out.write_text("".join(lines))
    print(f"wrote {len(lines)} rows to {args.out}")


if __name__ == "__main__":
    main()
