"""The answer-form rewrites (`hybrid_core.rewards.math_forms`) and how normalisation and extraction use them.

Expected strings are written out by hand; each rewrite must also leave alone what it cannot be sure of.
"""
import time

import pytest

from hybrid_core.rewards.math import extract_answer, grade, normalise_answer, quick_verdict
from hybrid_core.rewards.math_checker import SymbolicChecker
from hybrid_core.rewards.math_forms import (inequalities_as_intervals, joined_answers_as_list,
                                            mixed_numbers_as_fractions)


@pytest.mark.parametrize(("answer", "interval"), [
    ("x>2", "(2,\\infty)"),
    ("2<x", "(2,\\infty)"),
    ("x\\geq-1", "[-1,\\infty)"),
    ("x\\le\\sqrt{2}", "(-\\infty,\\sqrt{2}]"),
    ("-2<x\\leq4", "(-2,4]"),
    ("5>x\\ge1", "[1,5)"),  # read from the right: 1 ≤ x < 5
    ("x<-2\\lor x\\geqslant1", "(-\\infty,-2)\\cup[1,\\infty)"),
    ("x<3\\cup x>5", "(-\\infty,3)\\cup(5,\\infty)"),
    ("x>2\\land x<5", "(2,5)"),
    ("x\\le5\\land x\\ge-5", "[-5,5]"),
    ("x\\neq2", "(-\\infty,2)\\cup(2,\\infty)"),
    ("x\\ne -\\frac{1}{2}", "(-\\infty,-\\frac{1}{2})\\cup(-\\frac{1}{2},\\infty)"),
    ("x≠0", "(-\\infty,0)\\cup(0,\\infty)"),
])
def test_one_variable_inequalities_become_intervals(answer, interval):
    assert inequalities_as_intervals(answer) == interval


@pytest.mark.parametrize("answer", [
    "a<b",  # two letters: no bound is a number
    "x>a",  # a parameter bound stays an inequality
    "x<2\\land x<5",  # two upper bounds
    "x>2\\lor y<1",  # two variables
    "1<x>0",  # a chain that turns back
    "x<y<z",
    "x>2\\lor 7",  # one part is no inequality
    "\\left(x\\right)",
    "(2,5)",
    "x\\neq a",  # a parameter
    "x\\neq2,3",  # two excluded points: not one bound
])
def test_what_is_not_a_one_variable_inequality_stays(answer):
    assert inequalities_as_intervals(answer) == answer


@pytest.mark.parametrize(("answer", "fraction"), [
    ("2\\frac{1}{4}", "\\frac{9}{4}"),
    ("-1\\frac{1}{3}", "-\\frac{4}{3}"),
    ("12\\frac{3}{5}", "\\frac{63}{5}"),
    ("2\\frac{5}{4}", "2\\frac{5}{4}"),  # not a proper fraction: a product
    ("2\\frac{0}{4}", "2\\frac{0}{4}"),
    ("x^2\\frac{1}{4}", "x^2\\frac{1}{4}"),  # an exponent, then a product
    ("1.5\\frac{1}{2}", "1.5\\frac{1}{2}"),
    ("\\sqrt{2}\\frac{1}{2}", "\\sqrt{2}\\frac{1}{2}"),
    ("2\\frac{x}{4}", "2\\frac{x}{4}"),
])
def test_a_whole_number_before_a_proper_fraction_is_a_mixed_number(answer, fraction):
    assert mixed_numbers_as_fractions(answer) == fraction


def test_answers_joined_by_and_or_or_become_a_list():
    assert joined_answers_as_list("2\\lor3") == "2,3"
    assert joined_answers_as_list("4\\land 5") == "4,5"
    assert joined_answers_as_list("x=2\\lor x=-3") == "2,-3"
    assert joined_answers_as_list("x=2\\lor y=3") == "x=2,y=3"  # two names: each keeps its own
    assert joined_answers_as_list("(1,2)\\cup(3,4)") == "(1,2)\\cup(3,4)"
    assert joined_answers_as_list("7") == "7"


def test_normalisation_reads_the_joiners_before_units_and_spaces():
    assert normalise_answer("4 \\text{ and } 5") == "4,5"  # not the unit of 4, and not 45
    assert normalise_answer("x < 3 \\text{ or } x > 5") == "(-\\infty,3)\\cup(5,\\infty)"
    assert normalise_answer("1, 2, and 3") == "1,2,3"
    assert normalise_answer("2 or 3") == "2,3"
    assert normalise_answer("x = 1 \\text{ or } x = -1") == "1,-1"
    assert normalise_answer("2\\dfrac{1}{4}") == "\\frac{9}{4}"
    assert normalise_answer("\\text{even and odd}") == "even,odd"
    assert normalise_answer("y = 2x+1") == "2x+1"
    assert normalise_answer("y = 2x+1", keep_assignment=True) == "y=2x+1"
    assert normalise_answer("f(x) = 2x+1") == normalise_answer("f^{-1}(x)=2x+1") == "2x+1"
    assert normalise_answer("g(x,y)=xy") == "xy"
    assert normalise_answer("f(2)=5") == "f(2)=5"  # a value of f, not its definition


def test_words_differing_only_in_case_are_equal_and_other_words_go_on():
    assert quick_verdict("monday", "Monday") is True
    assert quick_verdict("NO", "no") is True
    assert quick_verdict("odd", "even") is None  # sympy decides (products of letters: xy is yx)
    assert quick_verdict("a", "A") is None  # one letter: a variable, not a word


def test_the_last_marker_gives_the_answer():
    assert extract_answer("Final Answer: The final answer is $6$. I hope it is correct.") == "6"
    assert extract_answer("so 3 * 24 = 72.\n#### 72") == "72"
    assert extract_answer("The answer is 5, I thought.\n#### 7") == "7"
    assert extract_answer("#### 7\nOn reflection, the answer is 5.") == "5"
    assert extract_answer("#### 7\nthen $\\boxed{9}$") == "9"  # a box still comes first
    assert extract_answer("The answer is 5.\n#### Checking\nIt holds.") == "5"  # a markdown heading, not GSM8K's
    assert extract_answer("So:\n#### 7  \n\n") == "7"
    assert extract_answer("The answer is 5.\n#### Checking") == "5"
    assert extract_answer("#### $\\frac{1}{2}$") == "$\\frac{1}{2}$"  # normalisation drops the dollars
    assert extract_answer("####\n") is None


def test_an_equation_is_compared_whole_when_its_value_alone_differs():
    assert grade("$\\boxed{y=-2x+3}$", "2x+y=3").is_correct
    assert not grade("$\\boxed{y=3x+2}$", "3x-y=2").is_correct
    assert grade("$\\boxed{2x+1}$", "y=2x+1").is_correct  # the value of y, as before
    assert not grade("$\\boxed{x=3}$", "x=4").is_correct


class SlowChecker(SymbolicChecker):
    """The real checker, 0.3 s slower a question; keeps the time limit each question was given."""
    def __init__(self) -> None:
        super().__init__()
        self.limits: list[float] = []

    def is_equal(self, answer: str, label: str, timeout_s: float) -> bool | None:
        self.limits.append(timeout_s)
        time.sleep(0.3)
        return super().is_equal(answer, label, timeout_s)


def test_the_second_comparison_shares_the_samples_time_limit():
    checker = SlowChecker()
    try:
        checker.is_equal("\\sqrt{8}", "2\\sqrt{2}", timeout_s=60)  # the child is up before the clocks start
        checker.limits.clear()
        result = grade("$\\boxed{y=3x+2}$", "3x-y=2", timeout_s=5.0, checker=checker)
        assert not result.is_correct and not result.is_timeout
        first_s, second_s = checker.limits
        assert 4.9 < first_s <= 5.0 and second_s < first_s - 0.3
        checker.limits.clear()
        result = grade("$\\boxed{y=3x+2}$", "3x-y=2", timeout_s=0.25, checker=checker)
        assert len(checker.limits) == 1  # no time left: no second question
        assert not result.is_correct and not result.is_timeout  # the values were judged unequal in time
    finally:
        checker.close()
