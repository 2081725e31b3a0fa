"""Math answer verification for RLVR (the seed recipe's `--reward.remote_url`): 1 when the last \\boxed{...} of the
response equals the label (as numbers when both parse, else as normalised strings), 0 otherwise.

A pure function of (query, label) with the seed's interface; `scores` equal `rewards` (0/1) for dynamic filtering.
"""
import re
from fractions import Fraction

import torch


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, with nested braces."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth < 0:
            return text[i:j]
    return None


def normalise(answer: str) -> str:
    answer = answer.strip().strip("$").replace(" ", "").replace("\\!", "").rstrip(".")
    answer = re.sub(r"\\(?:text|mathrm)\{([^}]*)\}", r"\1", answer)
    return re.sub(r"\\[dt]?frac\{([^}]*)\}\{([^}]*)\}", r"\1/\2", answer)


def as_number(answer: str) -> Fraction | None:
    try:
        return Fraction(answer.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def is_correct(response: str, label: str) -> bool:
    boxed = last_boxed(response)
    if boxed is None:
        return False
    got, want = normalise(boxed), normalise(label)
    got_n, want_n = as_number(got), as_number(want)
    return got_n == want_n if got_n is not None and want_n is not None else got == want


def reward_func(queries, prompts, labels, **kwargs):
    responses = [q[len(p):] if q.startswith(p) else q for q, p in zip(queries, prompts)]
    rewards = torch.tensor([float(is_correct(r, str(y))) for r, y in zip(responses, labels)])
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": {"has_boxed": torch.tensor(
        [float(last_boxed(r) is not None) for r in responses])}}
