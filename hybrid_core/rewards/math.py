"""Grading a math response against its label: the final answer's extraction, LaTeX normalisation and the comparison.

Owns the text rules (which answer counts, what normalisation erases) and the fast exact/numeric comparison done
in this process; what needs sympy (expressions, sets, intervals, tuples) goes to `math_checker`'s child process,
which enforces the per-sample time limit. Knows nothing of tensors, prompts or chat templates: `reward_func` files
do. The measured comparison with math-verify alone is in README.md, "Math rewards".
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache

from hybrid_core.rewards.math_checker import SymbolicChecker
from hybrid_core.rewards.math_forms import (MAX_EXACT_DIGITS, inequalities_as_intervals, joined_answers_as_list,
                                            mixed_numbers_as_fractions)

DEFAULT_TIMEOUT_S = 1.0  # per sample, for the sympy comparison only; warm checks take 0.1-300 ms
REL_TOL = 1e-9  # numbers closer than this (relative) are equal: 1/3 vs 0.3333333333 yes, vs 0.333 no

_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])\s*")
_PHRASE = re.compile(r"\banswer\s*(?:is\b|:)[\s:*]*", re.IGNORECASE)
# GSM8K's final line, `#### 72`: only as the last line, and a value, since "#### Step 2" is a markdown heading
_HASHES = re.compile(r"^[ \t]*####[ \t]*([-+$\\\d.(\[{][^\n]*?)\s*\Z", re.MULTILINE)
_WORD = re.compile(r"[a-zA-Z]{2,}")
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")  # one way to split the digits: linear, not quadratic
_SLASH = re.compile(r"([+-]?\d+)/(\d+)")
_FRAC = re.compile(r"([+-]?)\\frac\{([+-]?\d+(?:\.\d+)?)\}\{(\d+(?:\.\d+)?)\}")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_GREEK = "alpha|beta|gamma|delta|theta|lambda|mu|phi|psi|omega|rho|sigma|tau"
# x =, a_1 =, \theta =, (x,y) =, and a function's name: f(x) =, f^{-1}(x) =
_ASSIGNMENT = re.compile(rf"(?:[a-zA-Z](?:_\{{?\w+\}}?)?|\\(?:{_GREEK})|\([a-z](?:,[a-z])+\)|"
                         rf"[a-zA-Z](?:\^\{{?-1\}}?)?\([a-z](?:,[a-z])*\))(?:=|\\in\b)(?=[^=]+$)")
_REPEATING = re.compile(r"(?<!\d)(\d*)\.(\d*)\\overline\{(\d+)\}")
_NOT_DIGITS = str.maketrans("", "", "0123456789")
_UNIT_WORDS = ("units?|square units|cm|centimeters?|mm|m|meters?|km|kilometers?|inch|inches|in|feet|foot|ft|"
               "miles?|degrees?|dollars?|cents?|seconds?|minutes?|hours?|days?|years?|kg|grams?|g")
_REWRITES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    # degrees inside a trig function are an angle to convert, not a sign to erase: \tan 45^\circ is 1
    (r"(\\(?:sin|cos|tan|sec|csc|cot))\s*\(?\s*(\d+(?:\.\d+)?)\s*\^\s*\{?\\circ\}?\s*\)?", r"\1(\\frac{\2\\pi}{180})"),
    (r"\\(?:left|right)(?![a-zA-Z])", ""),
    (r"(?<!\\)(?:\\[!,;:](?![a-zA-Z])|\\ )|~|\\q?quad\b|\\displaystyle\b", " "),
    # "2 or 3", "x<3 \text{ or } x>5", "1, 2, and 3": joiners, before a \text after a number is taken for a unit
    (r",\s*(?:and|or)\s+|,\s*\\(?:text|mbox|textrm|mathrm)\{\s*(?:and|or)\s*\}", ","),
    (r"\\(?:text|mbox|textrm|mathrm)\{\s*or\s*\}|(?<=\S)\s+or\s+(?=\S)", r" \\lor "),
    (r"\\(?:text|mbox|textrm|mathrm)\{\s*and\s*\}|(?<=\S)\s+and\s+(?=\S)", r" \\land "),
    (r"\\\$|\$|\\%|%|\^\{?\\circ\}?|°|\\degree\b", ""),
    (r"\u2212", "-"),
    (r"π", r"\\pi "),
    (r"∞", r"\\infty "),
    (r"\\[dtc]frac\b", r"\\frac"),
    (r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}"),
    (r"\\sqrt\s*(\d)", r"\\sqrt{\1}"),
    # a \text{...} right after a number (or a closing brace) is a unit: 5\text{ cm}^2 -> 5
    (r"(?<=[\d}])\s*\\(?:text|mbox|textrm|mathrm)\{[^{}]*\}(?:\^\{?\d\}?)?", ""),
    (r"\\(?:mathbf|textbf|boldsymbol|text|mbox|textrm|mathrm)\{([^{}]*)\}", r"\1"),
    (rf"(?<=\d)\s+(?:{_UNIT_WORDS})(?:\^\{{?\d\}}?)?\s*$", ""),
    (r"\\(?:emptyset|varnothing)\b|\\\{\s*\\\}", r"\\emptyset"),
    (r"\{,\}", ""),
))


@dataclass(frozen=True, kw_only=True)
class Grade:
    """One response's verdict. `extracted` is the final answer's text as written (None when there is none)."""
    is_correct: bool
    is_format_ok: bool
    is_timeout: bool
    extracted: str | None


def extract_answer(response: str) -> str | None:
    """The final answer: the last \\boxed{...} or \\fbox{...} (nested braces handled), else whichever comes last
    of an "answer is ..." / "Answer: ..." phrase and a GSM8K line "#### ...", else None. A truncated last box
    (unbalanced braces) is no answer."""
    starts = [match.end() for match in _BOX.finditer(response)]
    if starts:
        answer = _box_content(response, starts[-1])
    else:
        answer = _marked_answer(response)
    return answer.strip() if answer and answer.strip() else None


def _marked_answer(response: str) -> str | None:
    """The text after the last answer marker ("The final answer is $6$" inside "Final Answer: ..." counts), or the
    GSM8K last line when it comes after every phrase."""
    phrases = list(_PHRASE.finditer(response))
    hashes = _HASHES.search(response)
    if hashes and (not phrases or hashes.start() > phrases[-1].start()):
        return hashes.group(1)
    if not phrases:
        return None
    return _phrase_content(response[phrases[-1].end():].split("\n", 1)[0])


def _box_content(text: str, start: int) -> str | None:
    if not text.startswith("{", start):
        bare = re.match(r"[^\s$]+", text[start:])  # \boxed 7
        return bare.group() if bare else None
    depth = 0
    i = start
    while i < len(text):
        if text[i] == "\\":
            i += 2  # \{ and \} are set braces, not grouping
            continue
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i]
        i += 1
    return None


def _phrase_content(tail: str) -> str:
    tail = tail.strip()
    if tail.startswith("$"):
        return tail.strip("$").split("$")[0]
    return _SENTENCE_END.split(tail)[0].rstrip("*. ")


def _repeating_as_fraction(match: re.Match) -> str:
    """0.1\\overline{6} = 0.1 + 6/90 = 1/6."""
    whole, fixed, repeat = match.groups()
    if len(whole) + len(fixed) + len(repeat) > MAX_EXACT_DIGITS:
        return match.group()
    value = (int(whole or 0) + Fraction(int(fixed or 0), 10 ** len(fixed))
             + Fraction(int(repeat), (10 ** len(repeat) - 1) * 10 ** len(fixed)))
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


@lru_cache(maxsize=65536)
def normalise_answer(answer: str, keep_assignment: bool = False) -> str:
    """The answer with presentation erased: \\left/\\right, spacing commands, $, %, degrees, units in \\text,
    thousands separators, trailing zeros, \\dfrac/\\tfrac and \\frac12, a leading `x =` or `x \\in` (unless
    `keep_assignment`); repeating decimals and mixed numbers become fractions, one-variable inequalities intervals,
    answers joined by "and" / "or" lists (`math_forms`). Cached: labels repeat."""
    for pattern, replacement in _REWRITES:
        answer = pattern.sub(replacement, answer)
    answer = _REPEATING.sub(_repeating_as_fraction, answer)
    # spaces go, except one between a command and a letter (\pi r must not become \pir)
    answer = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])", "\\1\x00", answer)
    answer = re.sub(r"\s+", "", answer).replace("\x00", " ")
    answer = mixed_numbers_as_fractions(answer)
    answer = joined_answers_as_list(inequalities_as_intervals(answer))
    if not keep_assignment and (assignment := _ASSIGNMENT.match(answer)):
        answer = answer[assignment.end():]
    answer = answer.rstrip(".").removeprefix("+")
    if _THOUSANDS.fullmatch(answer):
        answer = answer.replace(",", "")
    if re.fullmatch(r"[+-]?\d*\.\d*", answer) and "." in answer:
        answer = answer.rstrip("0").rstrip(".") or "0"
    return answer


def _number_parts(answer: str) -> tuple[str, str] | None:
    """A plain number's numerator and denominator as written (a decimal's denominator is "1"), else None."""
    if _DECIMAL.fullmatch(answer):
        return answer, "1"
    if match := _SLASH.fullmatch(answer):
        return match.group(1), match.group(2)
    if match := _FRAC.fullmatch(answer):
        sign, numerator, denominator = match.groups()
        return (sign + numerator if not numerator.startswith(("+", "-")) else numerator), denominator
    return None


def as_number(answer: str) -> Fraction | None:
    """A normalised answer written as a plain number (integer, decimal, a/b or \\frac{a}{b}), else None.
    Powers are never evaluated here: 9^{9^{9}} is not a plain number."""
    parts = _number_parts(answer)
    if parts is None:
        return None
    numerator, denominator = (Fraction(part) for part in parts)
    return numerator / denominator if denominator != 0 else None


def digit_count(text: str) -> int:
    """How many of the characters are the digits 0-9."""
    return len(text) - len(text.translate(_NOT_DIGITS))


def long_number_verdict(answer: str, label: str) -> bool:
    """The verdict when either side has more than MAX_EXACT_DIGITS digits: two plain numbers are compared by
    cross-multiplying in exact decimal arithmetic (linear-time parsing, fast products; no Python int is made),
    within REL_TOL when one is written as a decimal; anything else with that many digits is wrong, never sent to
    sympy (a 10,000-digit polynomial is no answer to grade within a second)."""
    a = _number_parts(answer)
    b = _number_parts(label)
    if a is None or b is None:
        return False
    with localcontext() as exact:
        exact.prec = len(answer) + len(label) + 8  # room for every digit of a product: nothing rounds
        a_num, a_den = (Decimal(part) for part in a)
        b_num, b_den = (Decimal(part) for part in b)
        if a_den == 0 or b_den == 0:
            return False
        left = a_num * b_den
        right = b_num * a_den
        if "." not in answer + label:
            return left == right
        return abs(left - right) <= Decimal(str(REL_TOL)) * max(abs(left), abs(right))


def numbers_close(a: Fraction, b: Fraction) -> bool:
    """A relative difference within REL_TOL (for answers written with a decimal point)."""
    return a == b or abs(a - b) <= REL_TOL * max(abs(a), abs(b))


def quick_verdict(answer: str, label: str) -> bool | None:
    """Decide without sympy where that is safe (both normalised): equal text, or two plain numbers, compared
    exactly unless one is written as a decimal (…891 and …890 differ by less than REL_TOL, yet differ)."""
    if answer == label:
        return True
    if _WORD.fullmatch(answer) and _WORD.fullmatch(label) and answer.casefold() == label.casefold():
        return True  # Monday and monday; words that differ go on to sympy, where xy is yx
    if max(digit_count(answer), digit_count(label)) > MAX_EXACT_DIGITS:
        return long_number_verdict(answer, label)
    a = as_number(answer)
    b = as_number(label)
    if a is None or b is None:
        return None
    return numbers_close(a, b) if "." in answer + label else a == b


_default_checker = SymbolicChecker()  # one child process per Python process, started on first need


def grade(response: str, label: str, timeout_s: float = DEFAULT_TIMEOUT_S,
          checker: SymbolicChecker | None = None) -> Grade:
    """Grade one response against its label (an answer string such as "5/6" or "\\frac{\\sqrt{3}}{2}");
    `timeout_s` bounds the sympy work of the sample, both comparisons together when an equation is compared again."""
    checker = checker or _default_checker
    deadline = time.monotonic() + timeout_s

    def is_equal(answer: str, gold: str) -> bool | None:
        left_s = deadline - time.monotonic()
        return checker.is_equal(answer, gold, timeout_s=left_s) if left_s > 0 else None
    return grade_with(response, label, is_equal)


def grade_with(response: str, label: str, is_equal: Callable[[str, str], bool | None]) -> Grade:
    """`grade`, with `is_equal` comparing the normalised answers that `quick_verdict` leaves undecided (None: it ran
    out of time). `benchmarks/bench_math_grader.py` passes other comparers through the same steps."""
    extracted = extract_answer(response)
    if extracted is None:
        return Grade(is_correct=False, is_format_ok=False, is_timeout=False, extracted=None)
    label = str(label).strip()
    answer = normalise_answer(extracted)
    gold = normalise_answer(label)
    if not answer or not gold:
        return Grade(is_correct=False, is_format_ok=bool(answer), is_timeout=False, extracted=extracted)
    verdict = _verdict(answer, gold, is_equal)
    if verdict is False:  # y=-2x+3 and 2x+y=3: one line once neither loses its `y =`
        whole = (normalise_answer(extracted, keep_assignment=True), normalise_answer(label, keep_assignment=True))
        if whole != (answer, gold):
            verdict = _verdict(*whole, is_equal) or False  # out of time: the values were judged unequal already
    return Grade(is_correct=bool(verdict), is_format_ok=True, is_timeout=verdict is None, extracted=extracted)


def _verdict(answer: str, gold: str, is_equal: Callable[[str, str], bool | None]) -> bool | None:
    verdict = quick_verdict(answer, gold)
    return is_equal(answer, gold) if verdict is None else verdict


def grade_batch(responses: list[str], labels: list[str], timeout_s: float = DEFAULT_TIMEOUT_S,
                checker: SymbolicChecker | None = None) -> list[Grade]:
    """Grade responses[i] against labels[i]; each sample has its own time limit."""
    if len(responses) != len(labels):
        raise ValueError(f"responses and labels must pair up: got {len(responses)} and {len(labels)}")
    return [grade(response, label, timeout_s=timeout_s, checker=checker) for response, label in zip(responses, labels)]
