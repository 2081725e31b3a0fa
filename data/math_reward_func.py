"""The seed's path for the math reward (deployments/qwen3-4b-math-hybrid.yaml, README): the implementation is
`data/rewards/math_reward_func.py`, loaded here the way `--reward.remote_url` loads any reward file."""
from pathlib import Path

from hybrid_core.rewards.reward_func import load_reward_func

reward_func = load_reward_func(str(Path(__file__).resolve().parent / "rewards" / "math_reward_func.py"))
