"""Demo reward for `data/demo_prompts.jsonl`: the share of the response made of the letters the label allows.

Dense partial credit on a 0-1 scale: reward = (characters of the response that are in the label's letter set) / 16,
capped at 1. A pure function of (query, label); the response is the query's text after the last assistant header.
"""
import torch

RESPONSE_BUDGET = 16  # the demo's rollout.max_new_tokens; one character is one token for the tiny tokenizer
ASSISTANT_HEADER = "<|im_start|>assistant\n"


def response_of(query: str) -> str:
    text = query.rsplit(ASSISTANT_HEADER, 1)[-1]
    return text.replace("<|im_end|>", "").replace("<|endoftext|>", "")


def letters_score(response: str, allowed: str) -> float:
    hits = sum(1 for ch in response if ch in allowed)
    return min(hits, RESPONSE_BUDGET) / RESPONSE_BUDGET


def reward_func(queries, prompts, labels, **kwargs):
    scores = [letters_score(response_of(q), label) for q, label in zip(queries, labels)]
    rewards = torch.tensor(scores, dtype=torch.float32)
    hit_all = [float(s >= 1.0) for s in scores]
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": {"full_marks": torch.tensor(hit_all)}}
