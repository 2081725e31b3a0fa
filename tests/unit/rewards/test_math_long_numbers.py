"""Answers with thousands of digits (issue 43): graded, never raised on, and inside the grader's time limit.

Python refuses str <-> int conversions past 4,300 digits, and a regex that can split a digit run two ways is
quadratic in it; a 10,000-digit answer once raised ValueError and a 100,000-digit fraction took minutes.
"""
import time

import pytest

from hybrid_core.rewards.math import DEFAULT_TIMEOUT_S, grade, long_number_verdict, normalise_answer
from hybrid_core.rewards.math_forms import MAX_EXACT_DIGITS

SEVENS = "7" * 10_000
THIRDS = "3" * 5_000

# (id, response, label, expected): each verdict worked out by hand
LONG_CASES = [
    ("10k-integer-wrong", f"\\boxed{{{SEVENS}}}", "5", False),
    ("10k-integer-equal", f"\\boxed{{{SEVENS}}}", SEVENS, True),
    ("10k-integer-leading-zero", f"\\boxed{{0{SEVENS}}}", SEVENS, True),  # 0777… is 777…
    ("10k-integer-one-digit-off", f"\\boxed{{{SEVENS[:-1]}8}}", SEVENS, False),
    ("5k-fraction-wrong", f"\\boxed{{\\frac{{{THIRDS}}}{{7}}}}", "1/2", False),
    # 333…3/333…30 = 1/10 = 111…1/111…10: equal by cross-multiplication
    ("5k-fraction-equal", f"\\boxed{{\\frac{{{THIRDS}}}{{{THIRDS[:-1]}0}}}}", f"\\frac{{{'1' * 5000}}}{{{'1' * 4999}0}}",
     True),
    ("5k-decimal-third", f"\\boxed{{0.{THIRDS}}}", "1/3", True),  # within REL_TOL 1e-9 of 1/3
    ("5k-decimal-quarter", f"\\boxed{{0.{THIRDS}}}", "1/4", False),
    ("5k-decimal-exact-length", f"The answer is 0.{THIRDS}", f"0.{THIRDS}0", True),  # a trailing zero
    ("100k-fraction-equal", "\\boxed{" + "3" * 100_000 + "/" + "7" * 100_000 + "}", "3/7", True),
    ("100k-fraction-wrong", "\\boxed{" + "3" * 100_000 + "/" + "7" * 100_000 + "}", "3/8", False),
    ("100k-label", "\\boxed{5}", "9" * 100_000, False),
    ("10k-digits-in-an-expression", f"\\boxed{{{SEVENS}x}}", "x", False),  # not a plain number: wrong, no sympy
    ("5k-mixed-number", "\\boxed{2\\frac{" + "1" * 3000 + "}{" + "2" * 3000 + "}}", "5/2", False),
    ("5k-repeating-decimal", f"\\boxed{{0.\\overline{{{THIRDS}}}}}", "1/2", False),
    ("1m-integer-equal", "The answer is " + "9" * 1_000_000, "9" * 1_000_000, True),
]


@pytest.mark.parametrize("response, label, expected", [case[1:] for case in LONG_CASES],
                         ids=[case[0] for case in LONG_CASES])
def test_a_long_answer_is_graded_within_the_time_limit(response, label, expected):
    start = time.monotonic()
    result = grade(response, label)
    elapsed_s = time.monotonic() - start
    assert result.is_correct is expected, result.is_correct
    assert result.is_format_ok and not result.is_timeout
    assert elapsed_s < DEFAULT_TIMEOUT_S, elapsed_s


def test_the_long_path_starts_past_the_exact_limit_only():
    at_limit = "9" * MAX_EXACT_DIGITS
    # at the limit the exact Fraction comparison still runs; one digit more and the decimal cross-product does
    assert grade(f"\\boxed{{{at_limit}}}", at_limit).is_correct
    assert grade(f"\\boxed{{{at_limit}9}}", at_limit + "9").is_correct
    assert not grade(f"\\boxed{{{at_limit}9}}", at_limit + "8").is_correct


def test_long_number_verdict_compares_exactly_unless_a_decimal_is_written():
    big = "1" + "0" * 5000  # 10^5000
    assert long_number_verdict(big, f"{big[:-1]}1") is False  # 10^5000 + 1 differs, exactly
    assert long_number_verdict(f"{big}.0000000001", big) is True  # relative difference 1e-5010 < 1e-9
    assert long_number_verdict(f"{big}/0", big) is False  # a zero denominator is no number
    assert long_number_verdict(f"-{big}", big) is False


def test_text_rewrites_leave_long_digit_runs_as_they_are():
    repeating = f"0.\\overline{{{THIRDS}}}"
    assert normalise_answer(repeating) == repeating
    mixed = "2\\frac{" + "1" * 3000 + "}{" + "2" * 3000 + "}"
    assert normalise_answer(mixed) == mixed
    assert normalise_answer("0.1\\overline{6}") == "\\frac{1}{6}"  # short ones are still rewritten
    assert normalise_answer("2\\frac{1}{4}") == "\\frac{9}{4}"


def test_the_served_math_reward_answers_a_long_answer_instead_of_500():
    """`hybrid serve-reward data/math_reward_func.py`'s app on a real uvicorn: a 10,000-digit answer once made the
    function raise, which the server answered 500 and the client retried as a transient failure."""
    from hybrid_core.rewards.remote_http import RemoteRewardClient
    from tests.conftest import REPO_ROOT
    from tests.unit.rewards.reward_servers import AppInThread

    queries = [f"q0 \\boxed{{{SEVENS}}}", f"q1 \\boxed{{{SEVENS}}}", "q2 \\boxed{3}"]
    with AppInThread(REPO_ROOT / "data" / "math_reward_func.py") as server:
        client = RemoteRewardClient(urls=server.url, timeout_s=30.0, max_retries=0)
        batch = client.score(queries, ["q0", "q1", "q2"], ["5", SEVENS, "3"])
    assert batch.rewards == [0.0, 1.0, 1.0]
    assert [logs["timeout"] for logs in batch.extra_logs] == [0.0, 0.0, 0.0]
