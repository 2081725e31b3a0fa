"""The behaviour switches that are config fields (`--ds.logprob_kernel`, `--ds.packed_attention`, `--ds.wake_copy`)
and, for scripts written before they were, the environment variables that stand in for a field left unset.

Owns each switch's choices (the first is the default), its variable, and the one function that reads it: a set
field wins, then the variable, then the default. It knows nothing about what a switch changes (the engines that
ask) or about the run's configuration, which declares the fields with these choices.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, get_args

LogprobKernel = Literal["triton", "torch"]  # the vocabulary head's maths on CUDA: fused Triton kernels or torch ops
PackedAttention = Literal["varlen", "flex"]  # packed rows' attention on CUDA: the varlen flash kernel or flex
WakeCopy = Literal["auto", "sm", "engine"]  # DeepSpeed's wake copy: kernel right after a free, always, or never


@dataclass(frozen=True, kw_only=True)
class Switch:
    """One switch: its environment variable and its choices, the default first."""

    env: str
    choices: tuple[str, ...]


SWITCHES = {"logprob_kernel": Switch(env="HYBRID_LOGPROB_KERNEL", choices=get_args(LogprobKernel)),
            "packed_attention": Switch(env="HYBRID_PACKED_ATTENTION", choices=get_args(PackedAttention)),
            "wake_copy": Switch(env="HYBRID_WAKE_COPY", choices=get_args(WakeCopy))}


def switch_value(name: str, configured: str | None = None) -> str:
    """Switch `name` as it applies: `configured` (its config field) when set, else its environment variable, else
    its default."""
    if configured is not None:
        return configured
    switch = SWITCHES[name]
    default = switch.choices[0]
    choice = os.environ.get(switch.env, default)
    if choice not in switch.choices:
        raise ValueError(f"{switch.env} must be one of {list(switch.choices)}: got {choice!r}; unset it for the "
                         f"default ({default}), or set --ds.{name}")
    return choice


def switch_values(configured: dict[str, str | None]) -> dict[str, str]:
    """Every switch as it applies, given the config fields by name (None: unset)."""
    return {name: switch_value(name, configured.get(name)) for name in SWITCHES}
