"""Agent files (`--train.agent_func_path FILE.py`) in OpenRLHF 0.11's shape: the base classes a file subclasses, its
loading, and its check before a run starts.

A file defines `class AgentExecutor(AgentExecutorBase)`, built with no arguments, whose `__init__` passes its
environment class (`super().__init__(AgentInstance)`); the rollout makes one `AgentInstance()` per sample and calls
its async `reset({"observation", "label"}) → {"observation"}` once, then its async
`step({"observation_text", "action_text", "label", "sampling_params"}) → {"rewards", "scores",
"environment_feedback", "done", "sampling_params"?, "extra_logs"}` after every generated turn. A custom `execute()`
is refused: the episodes are run by the rollout engine, token in and token out (`engines/agent_rollout.py`), so an
executor's own generation loop would never be called. It knows nothing of engines, Ray or the store.
"""
from __future__ import annotations

import ast
import importlib.util
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from hybrid_core.rewards.reward_func import missing_modules
from hybrid_core.types import PermanentError

FIELD = "train.agent_func_path"


class AgentFileError(PermanentError, ValueError):
    """The agent file cannot give an executor: missing, not Python, no AgentExecutor, or a custom execute()."""


class AgentInstanceBase(ABC):
    """One sample's environment: `reset` sees the prompt, `step` each generated turn."""

    @abstractmethod
    async def reset(self, states: dict) -> dict:
        """`states`: {"observation": the prompt text, "label": its label} → {"observation": the text to start from}."""

    @abstractmethod
    async def step(self, states: dict) -> dict:
        """`states`: {"observation_text", "action_text", "label", "sampling_params"} → {"rewards", "scores",
        "environment_feedback", "done", "sampling_params" (optional), "extra_logs"}."""


class AgentExecutorBase:
    """What an agent file's `AgentExecutor` subclasses: it names the environment class, one instance per sample."""

    def __init__(self, agent_instance_cls: type[AgentInstanceBase]):
        if not (isinstance(agent_instance_cls, type) and issubclass(agent_instance_cls, AgentInstanceBase)):
            raise AgentFileError(f"AgentExecutorBase.__init__ takes the environment class, a subclass of "
                                 f"AgentInstanceBase: got {agent_instance_cls!r}; call "
                                 "super().__init__(AgentInstance)")
        self.agent_instance_cls = agent_instance_cls

    def new_instance(self) -> AgentInstanceBase:
        return self.agent_instance_cls()


@dataclass(frozen=True)
class AgentStep:
    """One `step` answer, checked: the turn's reward and score, the feedback text, whether the episode ended."""

    reward: float
    score: float
    feedback: str
    done: bool
    sampling_params: dict | None = None
    extra_logs: dict = field(default_factory=dict)


def _scalar(value, name: str) -> float:
    """A turn's reward or score: a number, or a one-element tensor or list (OpenRLHF's examples give tensors)."""
    if hasattr(value, "reshape") and hasattr(value, "tolist"):
        value = value.reshape(-1).tolist()
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AgentFileError(f"AgentInstance.step returned {name} of type {type(value).__name__}: return one "
                             "number (or a one-element tensor) a turn")
    if not math.isfinite(value):
        raise AgentFileError(f"AgentInstance.step returned {name} {value}: return a finite number")
    return float(value)


def checked_step(answer) -> AgentStep:
    """`step`'s dict as an AgentStep; a missing key or a wrong type is an AgentFileError naming it."""
    if not isinstance(answer, dict):
        raise AgentFileError(f"AgentInstance.step returned {type(answer).__name__}, not a dict with rewards, "
                             "scores, environment_feedback, done and extra_logs")
    missing = [key for key in ("rewards", "environment_feedback", "done") if key not in answer]
    if missing:
        raise AgentFileError(f"AgentInstance.step returned no {', '.join(missing)}: got keys {sorted(answer)}")
    feedback = answer["environment_feedback"]
    if not isinstance(feedback, str):
        raise AgentFileError(f"AgentInstance.step returned environment_feedback of type {type(feedback).__name__}: "
                             "return a string ('' for none)")
    reward = _scalar(answer["rewards"], "rewards")
    score = _scalar(answer["scores"], "scores") if answer.get("scores") is not None else reward
    extra = answer.get("extra_logs") or {}
    extra = {key: _scalar(value, f"extra_logs[{key!r}]") for key, value in extra.items()}
    return AgentStep(reward=reward, score=score, feedback=feedback, done=bool(answer["done"]),
                     sampling_params=answer.get("sampling_params"), extra_logs=extra)


def load_agent_executor(path: str) -> AgentExecutorBase:
    """Import the file and build its `AgentExecutor()`."""
    if problems := agent_file_problems(path):
        raise AgentFileError("\n".join(problems))
    file = Path(path)
    spec = importlib.util.spec_from_file_location(f"agent_module_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    executor_cls = getattr(module, "AgentExecutor", None)
    if not (isinstance(executor_cls, type) and issubclass(executor_cls, AgentExecutorBase)):
        raise AgentFileError(f"{FIELD} {path!r}: AgentExecutor is not a subclass of AgentExecutorBase; write "
                             "class AgentExecutor(AgentExecutorBase) with "
                             "`from hybrid_core.rewards.agents import AgentExecutorBase`")
    return executor_cls()


def _executor_class(tree: ast.Module) -> ast.ClassDef | None:
    return next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "AgentExecutor"),
                None)


def agent_file_problems(path: str) -> list[str]:
    """Why `train.agent_func_path` cannot give an executor, found without running the file (empty when it can)."""
    file = Path(path)
    if not file.is_file():
        return [f"{FIELD} {path!r} is not a file; give a .py file defining class AgentExecutor(AgentExecutorBase)"]
    try:
        tree = ast.parse(file.read_text(), filename=str(file))
    except SyntaxError as err:
        return [f"{FIELD} {path!r} has a syntax error at line {err.lineno}: {err.msg}; fix the file"]
    except (UnicodeDecodeError, ValueError) as err:
        return [f"{FIELD} {path!r} is not a Python source file: {err}"]
    executor = _executor_class(tree)
    problems = []
    if executor is None:
        problems.append(f"{FIELD} {path!r} defines no class AgentExecutor; add class AgentExecutor("
                        "AgentExecutorBase) whose __init__ calls super().__init__(AgentInstance)")
    elif any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "execute"
             for node in executor.body):
        problems.append(f"{FIELD} {path!r}: a custom AgentExecutor.execute() is not supported (the rollout engine "
                        "runs the episodes token in, token out); implement AgentInstance.reset and step instead")
    if missing := missing_modules(tree):
        problems.append(f"{FIELD} {path!r} imports {', '.join(missing)}, which is not installed here; install it "
                        "in the run's environment")
    return problems
