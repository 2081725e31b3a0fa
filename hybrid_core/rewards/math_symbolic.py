"""When two normalised LaTeX answers are equal by sympy: expressions, tuples, sets, intervals and equations.

Runs only inside `math_checker`'s child process (sympy may not return; the parent enforces the time limit).
Two comparers, layered: our own (a small LaTeX-to-sympy translation; structures compared element-wise; exact
numbers exactly, others at 30 digits within a 1e-9 relative tolerance; expressions with free symbols at random
points), and math-verify's `verify` for LaTeX our translation does not cover. Knows nothing of responses,
extraction or time limits.
"""
from __future__ import annotations

import logging
import random
import re
from functools import lru_cache

import sympy
from math_verify import parse, verify
from sympy.parsing.sympy_parser import (convert_xor, factorial_notation, implicit_multiplication_application,
                                        parse_expr, standard_transformations)

REL_TOL = 1e-9
NUM_RANDOM_POINTS = 4
_FUNCTIONS = ("sin", "cos", "tan", "sec", "csc", "cot", "log", "exp")
_NAMES = frozenset(_FUNCTIONS + ("sqrt", "pi", "oo", "binomial", "factorial"))
# parse_expr evaluates text: only these names (and single-letter symbols) are reachable from an answer
_GLOBALS = {name: getattr(sympy, name) for name in _NAMES | {"E", "Integer", "Float", "Rational", "Symbol"}}
_TRANSFORMS = standard_transformations + (factorial_notation, convert_xor, implicit_multiplication_application)
_TRIG_POWER = re.compile(r"\\(sin|cos|tan|sec|csc|cot)\^\{?(\d+)\}?([a-zA-Z]|\d+|\([^()]*\))")
_FUNCTION_ARG = re.compile(rf"\\({'|'.join(_FUNCTIONS)}|ln)\s*([a-zA-Z]|\d+(?:\.\d+)?)(?![a-zA-Z(])")
_LOG_BASE = re.compile(r"\\log_\{?([^{}]+?)\}?\s*([a-zA-Z]|\d+|\([^()]*\))")
_REWRITES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    (r"\\(?:cdot|times)(?![a-zA-Z])", "*"),
    (r"\\div(?![a-zA-Z])", "/"),
    (r"\\pi(?![a-zA-Z])", " pi "),
    (r"\\infty(?![a-zA-Z])", " oo "),
    (r"\\ln(?![a-zA-Z])", "log"),
    (r"(?<![a-zA-Z\\])e(?![a-zA-Z])", "E"),  # a lone e is Euler's number: e^{\ln 3} is 3
    (rf"\\({'|'.join(_FUNCTIONS)})(?![a-zA-Z])", r"\1"),
    (r"\{", "("),
    (r"\}", ")"),
))
_COMMAND = re.compile(r"\\(frac|sqrt|binom)(?![a-zA-Z])")
_UNORDERED = {"list": "set"}  # the kinds compared as one
_SAFE_TEXT = re.compile(r"[0-9a-zA-Z+\-*/^().,! ]*")


def _group(text: str, start: int, opening: str, closing: str) -> tuple[str, int]:
    """The text inside the bracket that opens at `start`, and the index after its closing bracket."""
    if not text.startswith(opening, start):
        raise ValueError(f"expected {opening!r} at {start} in {text!r}")
    depth = 0
    for i in range(start, len(text)):
        depth += 1 if text[i] == opening else -1 if text[i] == closing else 0
        if depth == 0:
            return text[start + 1:i], i + 1
    raise ValueError(f"unbalanced {opening!r} in {text!r}")


def _call(name: str, args: list[str], index: str | None) -> str:
    # a leading space keeps a command before it whole: \cdot\sqrt{3} must not read as \cdotsqrt
    if name == "frac":
        return f" (({args[0]})/({args[1]}))"
    if name == "binom":
        return f" binomial({args[0]},{args[1]})"
    return f" sqrt({args[0]})" if index is None else f" (({args[0]})**(1/({index})))"


def _commands_to_calls(text: str) -> str:
    """\\frac{a}{b}, \\sqrt[n]{a}, \\binom{a}{b} as sympy calls, arguments translated recursively."""
    out = []
    i = 0
    while (match := _COMMAND.search(text, i)) is not None:
        out.append(text[i:match.start()])
        name = match.group(1)
        i = match.end()
        index = None
        if name == "sqrt" and text.startswith("[", i):
            index, i = _group(text, i, "[", "]")
            index = _commands_to_calls(index)
        args = []
        for _ in range(1 if name == "sqrt" else 2):
            arg, i = _group(text, i, "{", "}")
            args.append(_commands_to_calls(arg))
        out.append(_call(name, args, index))
    return "".join(out) + text[i:]


def _split_letters(match: re.Match) -> str:
    word = match.group()
    return word if word in _NAMES else "*".join(word)  # xy is x*y; input() is i*n*p*u*t, never a call


@lru_cache(maxsize=16384)
def to_sympy(latex: str):
    """A normalised scalar LaTeX answer as a sympy expression, or None when it is outside what we translate."""
    try:
        text = _commands_to_calls(latex)
    except (ValueError, RecursionError):  # unbalanced braces, or \frac nested past Python's stack
        return None
    text = _TRIG_POWER.sub(r"(\\\1(\3))^\2", text)
    text = _LOG_BASE.sub(r"log(\2,\1)", text)
    text = _FUNCTION_ARG.sub(r"\\\1(\2)", text)
    for pattern, replacement in _REWRITES:
        text = pattern.sub(replacement, text)
    if not text.strip() or not _SAFE_TEXT.fullmatch(text):
        return None  # an unknown command, or characters no answer needs
    text = re.sub(r"[a-zA-Z]{2,}", _split_letters, text)
    try:
        return parse_expr(text, global_dict=dict(_GLOBALS), local_dict={}, transformations=_TRANSFORMS)
    except Exception:  # sympy's parser raises a dozen kinds on malformed text; all mean "not an expression"
        return None


def _values_close(a: complex, b: complex) -> bool:
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b), 1e-30)


def _as_complex(expr, subs: dict | None = None) -> complex | None:
    try:
        value = complex(expr.evalf(30, subs=subs))
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        return None
    return None if value != value or abs(value) == float("inf") else value


def scalars_equal(answer: str, label: str) -> bool:
    """Equal as numbers (30 digits, relative 1e-9) or, with free symbols, at NUM_RANDOM_POINTS random points."""
    a = to_sympy(answer)
    b = to_sympy(label)
    if a is None or b is None:
        return False
    if a == b or (a.is_Rational and b.is_Rational):
        return a == b  # exact numbers stay exact: 2^{100} and 2^{100}+1 differ by less than REL_TOL
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    rng = random.Random(0)
    points = [{s: sympy.Float(rng.uniform(0.5, 3.5), 30) for s in symbols} for _ in range(NUM_RANDOM_POINTS)]
    for subs in points if symbols else [None]:
        value_a = _as_complex(a, subs)
        value_b = _as_complex(b, subs)
        if value_a is None or value_b is None or not _values_close(value_a, value_b):
            return False
    return True


def _split_top(text: str, separator: str) -> list[str]:
    """Split at `separator` where no bracket is open."""
    parts = []
    depth = 0
    start = 0
    for i, char in enumerate(text):
        depth += 1 if char in "([{" else -1 if char in ")]}" else 0
        if depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i + len(separator)
    return parts + [text[start:]]


def _is_wrapped(text: str) -> bool:
    """The first bracket closes at the last character: (1,2) yes, (x-1)(x+1) no."""
    depth = 0
    for i, char in enumerate(text):
        depth += 1 if char in "([{" else -1 if char in ")]}" else 0
        if depth == 0:
            return i == len(text) - 1
    return False


def structure(answer: str) -> tuple:
    """("set", elements), ("union", intervals), ("seq", brackets, elements), ("eq", lhs, rhs), ("list", elements)
    or ("scalar", text). A bracketed pair is one "seq" kind: (1,2) as a tuple and as an interval compare alike."""
    if len(parts := _split_top(answer, "\\cup")) > 1:
        return ("union", [structure(part) for part in parts])
    if answer.startswith("\\{") and answer.endswith("\\}") and _is_wrapped(answer[1:]):
        return ("set", _split_top(answer[2:-2], ","))
    if answer[:1] in "([" and answer[-1:] in ")]" and _is_wrapped(answer):
        elements = _split_top(answer[1:-1], ",")
        if len(elements) > 1:
            return ("seq", answer[0] + answer[-1], elements)
    if len(sides := _split_top(answer, "=")) == 2:
        return ("eq", sides[0], sides[1])
    if len(elements := _split_top(answer, ",")) > 1:
        return ("list", elements)
    return ("scalar", answer)


def _match_unordered(answers: list, labels: list, equal) -> bool:
    unused = list(labels)
    for answer in answers:
        found = next((label for label in unused if equal(answer, label)), None)
        if found is None:
            return False
        unused.remove(found)
    return not unused


def structures_equal(a: tuple, b: tuple) -> bool:
    """Our own comparison: same kind, then elements (unordered for sets, lists and unions). A list and a set
    compare alike: `2, 3` answers `\\{2,3\\}`, as "all solutions" are written either way."""
    if _UNORDERED.get(a[0], a[0]) != _UNORDERED.get(b[0], b[0]):
        return False
    if a[0] == "scalar":
        return scalars_equal(a[1], b[1])
    if a[0] == "seq":
        return a[1] == b[1] and len(a[2]) == len(b[2]) and all(map(scalars_equal, a[2], b[2]))
    if a[0] == "eq":  # the same equation, possibly with sides swapped
        return scalars_equal(f"({a[1]})-({a[2]})", f"({b[1]})-({b[2]})") or scalars_equal(
            f"({a[1]})-({a[2]})", f"({b[2]})-({b[1]})")
    if a[0] == "union":
        return _match_unordered(a[1], b[1], structures_equal)
    return _match_unordered(a[1], b[1], scalars_equal)


@lru_cache(maxsize=16384)
def _math_verify_parse(latex: str) -> list:
    return parse(f"${latex}$", parsing_timeout=None)  # no signal.alarm: our parent process keeps the time


def math_verify_equal(answer: str, label: str) -> bool:
    """math-verify's verdict on two normalised answers (label as gold); floats rounded at 10 places, not 6."""
    gold = _math_verify_parse(label)
    pred = _math_verify_parse(answer)
    return bool(gold and pred and verify(gold, pred, float_rounding=10, timeout_seconds=None))


def _leaves(parsed: tuple) -> list[str]:
    """The scalar texts inside a `structure`."""
    kind = parsed[0]
    if kind == "union":
        return [leaf for part in parsed[1] for leaf in _leaves(part)]
    if kind == "scalar":
        return [parsed[1]]
    if kind == "seq":
        return list(parsed[2])
    if kind == "eq":
        return [parsed[1], parsed[2]]
    return list(parsed[1])  # set, list


def symbolic_equal(answer: str, label: str) -> bool:
    """Ours when we translate every part of both answers; math-verify only for LaTeX outside our translation.
    (Asking math-verify after ours said no would add its false positives: it equates {1,2} and (1,2).)"""
    ours = structure(answer)
    gold = structure(label)
    if all(to_sympy(leaf) is not None for leaf in _leaves(ours) + _leaves(gold)):
        return structures_equal(ours, gold)
    return math_verify_equal(answer, label)


def warm_up() -> None:
    """First calls pay sympy's and math-verify's lazy imports; do it before the parent starts timing."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns once that its own timeout is off
    symbolic_equal("(x+1)^2", "x^2+2x+1")
    symbolic_equal("\\{1,2\\}", "[1,2)")
