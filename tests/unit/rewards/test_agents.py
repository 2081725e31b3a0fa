"""Unit tests for hybrid_core.rewards.agents: checking an agent file before a run, loading its executor, and
checking each answer of an environment's `step`."""
from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch

from hybrid_core.rewards.agents import (AgentExecutorBase, AgentFileError, AgentInstanceBase, AgentStep,
                                        agent_file_problems, checked_step, load_agent_executor)
from hybrid_core.types import PermanentError

GOOD_AGENT = '''
from hybrid_core.rewards.agents import AgentExecutorBase, AgentInstanceBase


class AgentInstance(AgentInstanceBase):
    async def reset(self, states):
        self.turns = 0
        return {"observation": states["observation"] + "!"}

    async def step(self, states):
        self.turns += 1
        return {"rewards": float(len(states["action_text"])), "scores": 1.0, "environment_feedback": "ok",
                "done": self.turns == 2, "extra_logs": {"turns": self.turns}}


class AgentExecutor(AgentExecutorBase):
    def __init__(self):
        super().__init__(AgentInstance)
'''


def _write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "my_agent.py"
    path.write_text(body)
    return str(path)


def test_a_good_file_has_no_problems(tmp_path):
    assert agent_file_problems(_write(tmp_path, GOOD_AGENT)) == []


def test_a_missing_file_is_named_with_the_flag(tmp_path):
    path = str(tmp_path / "nope.py")
    assert agent_file_problems(path) == [f"train.agent_func_path {path!r} is not a file; give a .py file defining "
                                         "class AgentExecutor(AgentExecutorBase)"]


def test_a_directory_is_not_a_file(tmp_path):
    assert agent_file_problems(str(tmp_path))[0].endswith("is not a file; give a .py file defining class "
                                                          "AgentExecutor(AgentExecutorBase)")


def test_a_syntax_error_names_its_line(tmp_path):
    path = _write(tmp_path, "class AgentExecutor(AgentExecutorBase):\n    def __init__(self:\n")
    problems = agent_file_problems(path)
    assert len(problems) == 1
    assert problems[0].startswith(f"train.agent_func_path {path!r} has a syntax error at line 2: ")
    assert problems[0].endswith("; fix the file")


def test_a_file_that_is_not_text_is_refused(tmp_path):
    path = tmp_path / "binary.py"
    path.write_bytes(b"\xff\xfe\x00class")
    assert agent_file_problems(str(path))[0].startswith(f"train.agent_func_path {str(path)!r} is not a Python "
                                                        "source file: ")


def test_a_file_without_agent_executor_is_refused(tmp_path):
    path = _write(tmp_path, GOOD_AGENT.replace("class AgentExecutor(", "class MyExecutor("))
    assert agent_file_problems(path) == [f"train.agent_func_path {path!r} defines no class AgentExecutor; add class "
                                         "AgentExecutor(AgentExecutorBase) whose __init__ calls "
                                         "super().__init__(AgentInstance)"]


def test_an_agent_executor_nested_in_a_function_is_not_found(tmp_path):
    path = _write(tmp_path, "def make():\n    class AgentExecutor:\n        pass\n")
    assert "defines no class AgentExecutor" in agent_file_problems(path)[0]


@pytest.mark.parametrize("keyword", ["def", "async def"])
def test_a_custom_execute_is_refused(tmp_path, keyword):
    body = GOOD_AGENT + f"\n    {keyword} execute(self, prompt, label, sampling_params, max_length, tokenizer, llm):\n" \
                        "        return {}\n"
    path = _write(tmp_path, body)
    assert agent_file_problems(path) == [f"train.agent_func_path {path!r}: a custom AgentExecutor.execute() is not "
                                         "supported (the rollout engine runs the episodes token in, token out); "
                                         "implement AgentInstance.reset and step instead"]


def test_an_execute_elsewhere_is_allowed(tmp_path):
    path = _write(tmp_path, GOOD_AGENT + "\n\ndef execute():\n    return None\n")
    assert agent_file_problems(path) == []


def test_a_missing_import_is_named(tmp_path):
    path = _write(tmp_path, "import no_such_module_xyz\nfrom no_such_pkg_abc.sub import thing\n" + GOOD_AGENT)
    assert agent_file_problems(path) == [f"train.agent_func_path {path!r} imports no_such_module_xyz, "
                                         "no_such_pkg_abc.sub, which is not installed here; install it in the run's "
                                         "environment"]


def test_every_problem_of_a_file_is_listed(tmp_path):
    path = _write(tmp_path, "import no_such_module_xyz\n")
    problems = agent_file_problems(path)
    assert len(problems) == 2
    assert "defines no class AgentExecutor" in problems[0] and "imports no_such_module_xyz," in problems[1]


def test_load_agent_executor_builds_the_executor_and_its_instances(tmp_path):
    executor = load_agent_executor(_write(tmp_path, GOOD_AGENT))
    assert isinstance(executor, AgentExecutorBase)
    first, second = executor.new_instance(), executor.new_instance()
    assert isinstance(first, AgentInstanceBase) and first is not second
    assert asyncio.run(first.reset({"observation": "hi", "label": "x"})) == {"observation": "hi!"}
    answer = asyncio.run(first.step({"observation_text": "hi!", "action_text": "abc", "label": "x",
                                     "sampling_params": {}}))
    assert checked_step(answer) == AgentStep(reward=3.0, score=1.0, feedback="ok", done=False,
                                             extra_logs={"turns": 1.0})


def test_load_agent_executor_refuses_what_the_check_finds(tmp_path):
    path = _write(tmp_path, "x = 1\n")
    with pytest.raises(AgentFileError, match=r"defines no class AgentExecutor") as raised:
        load_agent_executor(path)
    assert isinstance(raised.value, PermanentError) and isinstance(raised.value, ValueError)


def test_an_agent_executor_not_subclassing_the_base_is_refused(tmp_path):
    path = _write(tmp_path, "class AgentExecutor:\n    pass\n")
    with pytest.raises(AgentFileError) as raised:
        load_agent_executor(path)
    assert str(raised.value) == (f"train.agent_func_path {path!r}: AgentExecutor is not a subclass of "
                                 "AgentExecutorBase; write class AgentExecutor(AgentExecutorBase) with "
                                 "`from hybrid_core.rewards.agents import AgentExecutorBase`")


def test_an_executor_given_no_environment_class_is_refused(tmp_path):
    path = _write(tmp_path, GOOD_AGENT.replace("super().__init__(AgentInstance)", "super().__init__(object)"))
    with pytest.raises(AgentFileError, match=r"takes the environment class, a subclass of AgentInstanceBase: got "
                                             r"<class 'object'>; call super\(\).__init__\(AgentInstance\)"):
        load_agent_executor(path)


def _answer(**overrides) -> dict:
    return {"rewards": 0.5, "scores": 1.0, "environment_feedback": "higher", "done": False,
            "extra_logs": {}} | overrides


@pytest.mark.parametrize("rewards", [torch.tensor([0.25]), torch.tensor(0.25), torch.tensor([[0.25]]), [0.25],
                                     (0.25,), 0.25])
def test_checked_step_takes_a_number_or_a_one_element_tensor(rewards):
    step = checked_step(_answer(rewards=rewards))
    assert step.reward == 0.25 and type(step.reward) is float


def test_checked_step_keeps_every_field():
    answer = _answer(rewards=torch.tensor([2.0]), scores=torch.tensor([0.0]), done=1,
                     sampling_params={"max_tokens": 4}, extra_logs={"hits": torch.tensor([3]), "turn": 2})
    assert checked_step(answer) == AgentStep(reward=2.0, score=0.0, feedback="higher", done=True,
                                             sampling_params={"max_tokens": 4}, extra_logs={"hits": 3.0, "turn": 2.0})


@pytest.mark.parametrize("answer", [_answer(scores=None), {"rewards": torch.tensor([0.75]),
                                                           "environment_feedback": "", "done": True}])
def test_scores_default_to_the_rewards(answer):
    step = checked_step(answer | {"rewards": torch.tensor([0.75])})
    assert (step.reward, step.score) == (0.75, 0.75)
    assert step.extra_logs == {} and step.sampling_params is None


@pytest.mark.parametrize("drop, named", [(("rewards",), "rewards"), (("done",), "done"),
                                         (("rewards", "environment_feedback"), "rewards, environment_feedback")])
def test_missing_keys_are_named(drop, named):
    answer = {key: value for key, value in _answer().items() if key not in drop}
    with pytest.raises(AgentFileError) as raised:
        checked_step(answer)
    assert str(raised.value) == f"AgentInstance.step returned no {named}: got keys {sorted(answer)}"


@pytest.mark.parametrize("feedback, kind", [(None, "NoneType"), (3, "int"), (["higher"], "list"),
                                            (b"higher", "bytes")])
def test_feedback_that_is_not_a_string_is_refused(feedback, kind):
    with pytest.raises(AgentFileError) as raised:
        checked_step(_answer(environment_feedback=feedback))
    assert str(raised.value) == (f"AgentInstance.step returned environment_feedback of type {kind}: return a "
                                 "string ('' for none)")


@pytest.mark.parametrize("answer, kind", [(None, "NoneType"), ([0.5], "list"), ("done", "str")])
def test_an_answer_that_is_not_a_dict_is_refused(answer, kind):
    with pytest.raises(AgentFileError, match=rf"^AgentInstance.step returned {kind}, not a dict with rewards"):
        checked_step(answer)


@pytest.mark.parametrize("rewards, kind", [(torch.tensor([1.0, 2.0]), "list"), ([], "list"), ("1", "str"),
                                           (True, "bool"), (None, "NoneType")])
def test_a_reward_that_is_not_one_number_is_refused(rewards, kind):
    with pytest.raises(AgentFileError) as raised:
        checked_step(_answer(rewards=rewards))
    assert str(raised.value) == (f"AgentInstance.step returned rewards of type {kind}: return one number (or a "
                                 "one-element tensor) a turn")


@pytest.mark.parametrize("value", [math.nan, math.inf, torch.tensor([-math.inf])])
def test_a_reward_that_is_not_finite_is_refused(value):
    with pytest.raises(AgentFileError, match=r"^AgentInstance.step returned rewards -?(nan|inf): return a finite"):
        checked_step(_answer(rewards=value))


def test_a_bad_score_or_extra_log_is_named():
    with pytest.raises(AgentFileError, match=r"returned scores of type str"):
        checked_step(_answer(scores="high"))
    with pytest.raises(AgentFileError, match=r"returned extra_logs\['acc'\] nan: return a finite number"):
        checked_step(_answer(extra_logs={"acc": math.nan}))
