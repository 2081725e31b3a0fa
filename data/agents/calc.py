"""Demo agent: a calculator tool. The prompt asks for a sum or product of small numbers; the label is its value.
An action holding `<calc>EXPR</calc>` gets the value of EXPR back as feedback (numbers and + - * / only, evaluated
with `ast`, never `eval`); an action without a tag is the final answer: its last number, graded by the project's math verifier
(`hybrid_core.rewards.math.grade` of "The answer is N" against the label). At most 3 turns of at most 6 tokens each.

Rewards (a 0-1 scale on the last turn, 0 before it, so that a tiny random character-level model can climb): 0.6 for
a right final answer, plus 0.4 times the share of the actions' characters that a calculation is written with
(digits, + - * / and the tag's characters `<calc>/`; a random policy's ~0.1). `extra_logs`: `correct`, `calls`.
"""
import ast
import operator
import re

from hybrid_core.rewards.agents import AgentExecutorBase, AgentInstanceBase
from hybrid_core.rewards.math import grade

MAX_TURNS = 3
TURN_TOKENS = 6
CALC = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
CALC_CHARS = set("0123456789+-*/<>calc")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expression: str) -> float | None:
    """The value of an arithmetic expression of numbers and + - * /, or None for anything else."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return None
    return _value(tree.body)


def _value(node: ast.AST) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _value(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if left is None or right is None or (isinstance(node.op, ast.Div) and right == 0):
            return None
        if max(abs(left), abs(right)) > 1e12:
            return None
        return OPERATORS[type(node.op)](left, right)
    return None


def shown(value: float | None) -> str:
    if value is None:
        return " error"
    return f" {int(value)}" if float(value).is_integer() else f" {value:g}"


class AgentInstance(AgentInstanceBase):
    async def reset(self, states: dict) -> dict:
        self.label, self.turns, self.calls, self.calc_chars, self.chars = states["label"], 0, 0, 0, 0
        return {"observation": states["observation"], "sampling_params": {"max_tokens": TURN_TOKENS}}

    async def step(self, states: dict) -> dict:
        action = states["action_text"]
        self.turns += 1
        self.calc_chars += sum(ch in CALC_CHARS for ch in action)
        self.chars += max(len(action), 1)
        call = CALC.search(action)
        if call is not None and self.turns < MAX_TURNS:
            self.calls += 1
            return {"rewards": 0.0, "scores": 0.0, "environment_feedback": shown(evaluate(call.group(1))),
                    "done": False, "extra_logs": {"correct": 0.0, "calls": float(self.calls)}}
        numbers = NUMBER.findall(action)
        correct = bool(numbers) and grade(f"The answer is {numbers[-1]}", self.label).is_correct
        reward = 0.6 * float(correct) + 0.4 * self.calc_chars / self.chars
        return {"rewards": reward, "scores": reward, "environment_feedback": "", "done": True,
                "extra_logs": {"correct": float(correct), "calls": float(self.calls)}}


class AgentExecutor(AgentExecutorBase):
    def __init__(self):
        super().__init__(AgentInstance)
