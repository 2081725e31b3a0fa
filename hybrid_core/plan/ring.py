"""Ring attention's rules (`--ds.ring_attn_size N`, `--ds.ring_attn_head_stride S`), as `hybrid train` checks them
before anything starts (the groups themselves are `layout.ring_group_ranks`, listed in the run's plan).

Owns which roles split their samples over rings (a role of W ranks has W ÷ N rings of N consecutive ranks, each
sharing every sample it trains on) (the policy, the
reference and the critic: the reward model scores whole samples), and the refusals: a ring over padded rows
(`unpacked_ring`: a gap the plan lists as not implemented), a ring size that does not divide a role's ranks, a
head stride that does not divide the model's K/V heads or is set without a ring.
Pure functions of a `RunConfig` and the ranks of each role (the run's plan's, passed in: the plan sits above this
module): no torch, no Ray.
"""
from __future__ import annotations

from hybrid_core.config import RunConfig
from hybrid_core.plan.memory import model_shape

RING_ROLES = ("actor", "ref", "critic")  # the roles whose forwards split a sample over a ring


def ring_problems(cfg: RunConfig, role_ranks: dict[str, int]) -> list[str]:
    """Why the ring settings cannot run over the run's ranks of each role (`role_ranks`), naming both values and the
    fix (empty when they can)."""
    ds = cfg.ds
    size, stride = ds.ring_attn_size, ds.ring_attn_head_stride
    if size == 1:
        if stride == 1:
            return []
        return [f"ds.ring_attn_head_stride {stride} does nothing without ring attention: got ds.ring_attn_size 1; "
                "set --ds.ring_attn_size to a divisor of the actor's ranks, or drop --ds.ring_attn_head_stride"]
    problems = []
    for role in RING_ROLES:
        ranks = role_ranks.get(role)
        if ranks is not None and ranks % size:
            problems.append(f"ds.ring_attn_size {size} must divide the {role}'s ranks: got {ranks} {role} ranks; "
                            f"use --ds.ring_attn_size among {_divisors(ranks)}, or give the {role} a multiple of "
                            f"{size} ranks")
    return problems + _head_stride_problems(cfg, role_ranks)


def unpacked_ring(cfg: RunConfig) -> list[str]:
    """Ring attention over padded rows, which has no code path: a ring splits one packed row (none without a ring)."""
    size = cfg.ds.ring_attn_size
    if size == 1 or cfg.ds.packing_samples:
        return []
    return [f"ds.ring_attn_size {size} splits packed samples: got ds.packing_samples False; add --ds.packing_samples, "
            "or drop --ds.ring_attn_size"]


def _head_stride_problems(cfg: RunConfig, role_ranks: dict[str, int]) -> list[str]:
    """The stride against each ringed model's K/V heads, where its shape is known (an unknown one is the memory
    plan's to report)."""
    stride = cfg.ds.ring_attn_head_stride
    models = {"actor.model_name_or_path": cfg.actor.model_name_or_path}
    if "critic" in role_ranks:
        models["critic.model_name_or_path"] = cfg.critic.model_name_or_path or cfg.reward.model_name_or_path \
            or cfg.actor.model_name_or_path
    problems = []
    for field, path in models.items():
        try:
            heads = model_shape(path, field).num_key_value_heads
        except ValueError:
            continue
        if heads % stride:
            problems.append(f"ds.ring_attn_head_stride {stride} must divide the K/V heads of {field} {path!r}: "
                            f"got {heads} K/V heads; use --ds.ring_attn_head_stride among {_divisors(heads)}")
    return problems


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
