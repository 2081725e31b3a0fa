"""Math reward for `data/math_prompts.jsonl` (the seed's `--reward.remote_url`): 1 when the response's final answer
equals the label, 0 otherwise, graded by `hybrid_core.rewards.math` (last \\boxed{...}, LaTeX normalisation, exact,
numeric and sympy comparison, a per-sample time limit).

A pure function of (query, prompt, label). The response is the query after its prompt or, where the prompt is not a
prefix, the text after the last assistant header (as in data/letters_reward.py): the prompt's own "Put the final
answer in \\boxed{}" must not be read as the answer. `scores` equal `rewards` (0/1) for dynamic filtering;
`extra_logs` has per-sample `format_ok` (an answer was found) and `timeout` (the comparison ran past its limit,
graded 0).
"""
import torch

from hybrid_core.rewards.math import grade_batch

ASSISTANT_HEADER = "<|im_start|>assistant\n"  # Qwen's chat template, as in data/letters_reward.py
END_MARKERS = ("<|im_end|>", "<|endoftext|>")


def response_of(query: str, prompt: str) -> str:
    text = query[len(prompt):] if prompt and query.startswith(prompt) else query.rsplit(ASSISTANT_HEADER, 1)[-1]
    for marker in END_MARKERS:
        text = text.replace(marker, "")
    return text


def reward_func(queries, prompts, labels, **kwargs):
    responses = [response_of(query, prompt) for query, prompt in zip(queries, prompts)]
    grades = grade_batch(responses, [str(label) for label in labels])
    rewards = torch.tensor([float(g.is_correct) for g in grades], dtype=torch.float32)
    format_ok = torch.tensor([float(g.is_format_ok) for g in grades], dtype=torch.float32)
    timeout = torch.tensor([float(g.is_timeout) for g in grades], dtype=torch.float32)
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": {"format_ok": format_ok, "timeout": timeout}}
