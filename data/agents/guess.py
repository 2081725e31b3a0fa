"""Demo agent: a number-guessing game. The label is the secret digit (0-9); each turn the first digit of the
policy's action is its guess, and the environment answers " higher", " lower" or " correct!" (which ends the
episode). At most 3 turns of at most 4 tokens each.

Rewards (for a tiny random character-level model to climb, like data/letters_reward.py): every turn but the last
earns 0; the last earns, on a 0-1 scale, half the share of digit characters over all its actions (a random policy's
~0.08) plus half the best guess's closeness, 1 - |guess - secret| / 9 (0 with no guess). The score is the same, and
`extra_logs` counts a right guess (`solved`).
"""
from hybrid_core.rewards.agents import AgentExecutorBase, AgentInstanceBase

MAX_TURNS = 3
TURN_TOKENS = 4


def first_digit(text: str) -> int | None:
    return next((int(ch) for ch in text if ch.isdigit()), None)


class AgentInstance(AgentInstanceBase):
    async def reset(self, states: dict) -> dict:
        self.secret = int(states["label"])
        self.turns, self.digits, self.chars, self.best = 0, 0, 0, None
        return {"observation": states["observation"], "sampling_params": {"max_tokens": TURN_TOKENS}}

    def _final_reward(self) -> float:
        digit_share = self.digits / self.chars if self.chars else 0.0
        closeness = 1 - abs(self.best - self.secret) / 9 if self.best is not None else 0.0
        return 0.5 * digit_share + 0.5 * closeness

    async def step(self, states: dict) -> dict:
        action = states["action_text"]
        self.turns += 1
        self.digits += sum(ch.isdigit() for ch in action)
        self.chars += max(len(action), 1)
        guess = first_digit(action)
        if guess is not None and (self.best is None or abs(guess - self.secret) < abs(self.best - self.secret)):
            self.best = guess
        solved = guess == self.secret
        done = solved or self.turns >= MAX_TURNS
        if guess is None:
            feedback = " a digit, please"
        else:
            feedback = " correct!" if solved else (" higher" if guess < self.secret else " lower")
        reward = self._final_reward() if done else 0.0
        return {"rewards": reward, "scores": reward, "environment_feedback": "" if done else feedback,
                "done": done, "extra_logs": {"solved": float(solved)}}


class AgentExecutor(AgentExecutorBase):
    def __init__(self):
        super().__init__(AgentInstance)
