"""Answer forms that write one value in another shape: inequalities as intervals, mixed numbers as fractions, and
answers joined by "and" / "or" as lists.

Pure text rewrites of an answer that `math.normalise_answer` has already stripped of spaces and presentation; each
leaves the answer unchanged where its form is not certain. Knows nothing of extraction, sympy or time limits.
"""
from __future__ import annotations

import re

# "and" / "or" between two answers, as normalisation writes them (from "\text{ or }" or a spaced word), and unions
_JOINER = re.compile(r"\\(lor|land|cup)(?![a-zA-Z])\s?")
_OPERATOR = re.compile(r"(\\(?:leqslant|geqslant|leq|geq|le|ge|lt|gt)(?![a-zA-Z])|<=|>=|≤|≥|<|>)\s?")
_CANONICAL = {"\\leqslant": "≤", "\\leq": "≤", "\\le": "≤", "<=": "≤", "≤": "≤", "\\lt": "<", "<": "<",
              "\\geqslant": "≥", "\\geq": "≥", "\\ge": "≥", ">=": "≥", "≥": "≥", "\\gt": ">", ">": ">"}
_MIRROR = {">": "<", "≥": "≤"}
_VARIABLE = re.compile(r"[a-zA-Z]")
_EXCLUDED = re.compile(r"[a-zA-Z](?:\\neq?(?![a-zA-Z])|≠)\s?(.+)")  # x \neq 2: every real but one
_NAMED_VALUE = re.compile(r"([a-zA-Z])=([^=]+)")
_BARE_LETTER = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]")
# 2\frac{1}{4} is two and a quarter, when the whole number stands alone and the fraction is proper
_MIXED = re.compile(r"(?<![\w.^_}\\])(\d+)\\frac\{(\d+)\}\{(\d+)\}")

Bound = tuple[str, bool]  # a bound's text and whether it is included
# Python refuses str <-> int conversions past 4,300 digits (CVE-2020-10735) and they are quadratic before that:
# numbers longer than this are never turned into integers by text rewrites
MAX_EXACT_DIGITS = 4000


def mixed_numbers_as_fractions(answer: str) -> str:
    """2\\frac{1}{4} → \\frac{9}{4} (a sign before it stays: -2\\frac{1}{4} is -9/4); 2\\frac{5}{4} and
    x^2\\frac{1}{4} are products and stay."""
    def improper(match: re.Match) -> str:
        if sum(len(group) for group in match.groups()) > MAX_EXACT_DIGITS:
            return match.group()
        whole, numerator, denominator = (int(group) for group in match.groups())
        if not 0 < numerator < denominator:
            return match.group()
        return f"\\frac{{{whole * denominator + numerator}}}{{{denominator}}}"
    return _MIXED.sub(improper, answer)


def _is_bound(text: str) -> bool:
    """A number-valued bound: no bare letter (\\sqrt, \\pi and \\infty are commands, not variables)."""
    return bool(text) and not _BARE_LETTER.search(text)


def _half_lines(part: str) -> tuple[str, Bound | None, Bound | None] | None:
    """`x>2`, `2<x`, `-1\\le x<4` as (variable, lower bound, upper bound); None when the part is not one of them."""
    pieces = [piece.strip() for piece in _OPERATOR.split(part)]
    texts = pieces[0::2]
    operators = [_CANONICAL[op] for op in pieces[1::2]]
    if len(operators) not in (1, 2):
        return None
    if all(op in _MIRROR for op in operators):  # 5 > x ≥ 1 reads as 1 ≤ x < 5
        texts = texts[::-1]
        operators = [_MIRROR[op] for op in operators[::-1]]
    if not all(op in ("<", "≤") for op in operators):
        return None
    closed = [op == "≤" for op in operators]
    if len(operators) == 2:
        lower, variable, upper = texts
        bounds = ((lower, closed[0]), (upper, closed[1]))
    elif _VARIABLE.fullmatch(texts[0]):
        variable, bounds = texts[0], (None, (texts[1], closed[0]))
    else:
        variable, bounds = texts[1], ((texts[0], closed[0]), None)
    if not _VARIABLE.fullmatch(variable) or not all(_is_bound(b[0]) for b in bounds if b is not None):
        return None
    return variable, bounds[0], bounds[1]


def _interval(lower: Bound | None, upper: Bound | None) -> str:
    left = f"[{lower[0]}" if lower and lower[1] else f"({lower[0]}" if lower else "(-\\infty"
    right = f"{upper[0]}]" if upper and upper[1] else f"{upper[0]})" if upper else "\\infty)"
    return f"{left},{right}"


def _both_sides(halves: list) -> tuple[Bound, Bound] | None:
    """`x>2 \\land x\\le 5` (one variable, already checked): its one lower and one upper bound."""
    lowers = [lower for _, lower, upper in halves if lower is not None and upper is None]
    uppers = [upper for _, lower, upper in halves if upper is not None and lower is None]
    return (lowers[0], uppers[0]) if len(halves) == 2 and len(lowers) == len(uppers) == 1 else None


def inequalities_as_intervals(answer: str) -> str:
    """`x>2` → `(2,\\infty)`, `-2<x\\le4` → `(-2,4]`, `x<3 \\lor x>5` → `(-\\infty,3)\\cup(5,\\infty)`,
    `x>2 \\land x<5` → `(2,5)`, `x\\neq2` → `(-\\infty,2)\\cup(2,\\infty)`: one variable, bounds without variables.
    Anything else is returned unchanged."""
    if (excluded := _EXCLUDED.fullmatch(answer)) and _is_bound(excluded.group(1)) and "," not in excluded.group(1):
        point = excluded.group(1)
        return f"(-\\infty,{point})\\cup({point},\\infty)"
    if not _OPERATOR.search(answer):
        return answer
    parts = _JOINER.split(answer)
    texts, joiners = parts[0::2], set(parts[1::2])
    halves = [_half_lines(text) for text in texts]
    if None in halves or len({half[0] for half in halves}) != 1:
        return answer
    if joiners == {"land"}:
        both = _both_sides(halves)
        return _interval(*both) if both else answer
    if joiners - {"lor", "cup"}:
        return answer
    return "\\cup".join(_interval(lower, upper) for _, lower, upper in halves)


def joined_answers_as_list(answer: str) -> str:
    """`2\\lor 3` and `4\\land 5` (from "2 or 3", "4 and 5") → `2,3` and `4,5`, and `x=2\\lor x=3` → `2,3` (one
    variable named in every part); run after the inequalities, which read these joiners first."""
    parts = _JOINER.split(answer)
    if len(parts) == 1 or "cup" in parts[1::2]:
        return answer
    values = parts[0::2]
    named = [_NAMED_VALUE.fullmatch(value) for value in values]
    if all(named) and len({match.group(1) for match in named}) == 1:
        values = [match.group(2) for match in named]
    return ",".join(values)
