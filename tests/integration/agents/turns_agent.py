"""A test environment: three turns of at most 5 generated tokens, each answered " ok! " (the last one ""); the
turn's reward is its action's length / 10. Label "boom" raises at turn 2, label "hang" never answers turn 1, and
every call is appended to the file AGENT_CALLS names (when set), so a test can count them."""
import asyncio
import json
import os

from hybrid_core.rewards.agents import AgentExecutorBase, AgentInstanceBase

FEEDBACK = " ok! "
NUM_TURNS = 3


def _record(call: str, states: dict) -> None:
    if path := os.environ.get("AGENT_CALLS"):
        with open(path, "a") as calls:
            calls.write(json.dumps({"call": call, "label": states["label"]}) + "\n")


class AgentInstance(AgentInstanceBase):
    async def reset(self, states):
        _record("reset", states)
        self.turn = 0
        return {"observation": states["observation"], "sampling_params": {"max_tokens": 5}}

    async def step(self, states):
        _record("step", states)
        self.turn += 1
        if states["label"] == "boom" and self.turn == 2:
            raise ValueError("the environment broke")
        if states["label"] == "hang":
            await asyncio.sleep(3600)
        done = self.turn >= NUM_TURNS
        return {"rewards": len(states["action_text"]) / 10, "scores": float(self.turn), "done": done,
                "environment_feedback": "" if done else FEEDBACK, "extra_logs": {"turn": self.turn}}


class AgentExecutor(AgentExecutorBase):
    def __init__(self):
        super().__init__(AgentInstance)
