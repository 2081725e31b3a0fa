"""The demo environments of data/agents answer handcrafted actions with exactly the documented feedback and
rewards."""
import asyncio
import importlib.util

import pytest

from tests.conftest import REPO_ROOT


def demo(name: str):
    spec = importlib.util.spec_from_file_location(f"demo_{name}", REPO_ROOT / "data" / "agents" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def play(name: str, label: str, actions: list[str]) -> list[dict]:
    instance = demo(name).AgentExecutor().new_instance()

    async def episode():
        start = await instance.reset({"observation": "prompt", "label": label})
        assert start == {"observation": "prompt", "sampling_params": {"max_tokens": demo(name).TURN_TOKENS}}
        return [await instance.step({"observation_text": "", "action_text": a, "label": label,
                                     "sampling_params": {}}) for a in actions]

    return asyncio.run(episode())


def test_guess_answers_higher_lower_and_rewards_the_last_turn():
    answers = play("guess", "7", ["x2ab", "9", "77"])
    assert [a["environment_feedback"] for a in answers] == [" higher", " lower", ""]
    assert [a["done"] for a in answers] == [False, False, True]
    assert [a["rewards"] for a in answers[:2]] == [0.0, 0.0]
    # digits 1 + 1 + 2 of 4 + 1 + 2 characters; the best guess 9 (|9 - 7| = 2 beats |2 - 7| = 5)... then 7: exact
    assert answers[2]["rewards"] == pytest.approx(0.5 * 4 / 7 + 0.5 * 1.0)
    assert answers[2]["extra_logs"] == {"solved": 1.0}


def test_guess_without_a_digit_asks_for_one_and_ends_after_three_turns():
    answers = play("guess", "0", ["ab", "cd", "e9"])
    assert [a["environment_feedback"] for a in answers] == [" a digit, please", " a digit, please", ""]
    assert answers[2]["rewards"] == pytest.approx(0.5 * 1 / 6 + 0.5 * (1 - 9 / 9))


def test_calc_evaluates_with_ast_only():
    calc = demo("calc")
    assert calc.evaluate("3*4+1") == 13 and calc.evaluate("8/0") is None
    assert calc.evaluate("__import__('os')") is None and calc.evaluate("2**99") is None
    answers = play("calc", "12", ["<calc>3*4</calc>", "12"])
    assert answers[0]["environment_feedback"] == " 12" and not answers[0]["done"]
    assert answers[1]["done"] and answers[1]["extra_logs"] == {"correct": 1.0, "calls": 1.0}
    counted = sum(ch in calc.CALC_CHARS for ch in "<calc>3*4</calc>12")
    assert answers[1]["rewards"] == pytest.approx(0.6 + 0.4 * counted / len("<calc>3*4</calc>12"))


def test_calc_grades_the_last_number_of_the_final_answer():
    assert play("calc", "12", ["x 5"])[0]["extra_logs"]["correct"] == 0.0
    assert play("calc", "12", ["ab12"])[0]["extra_logs"]["correct"] == 1.0
