"""plan.refusals: what `hybrid plan` lists as not implemented is what `hybrid train` refuses as not implemented, flag
by flag of the parser, and the setups without a code path (TP engines on their own GPUs, a ring over padded rows)
are in both."""
import types
import typing

import pytest

from hybrid_core.config import ConfigError, leaf_paths
from hybrid_core.flags import flag_names, parse_cli
from hybrid_core.plan.refusals import preflight_problems
from hybrid_core.plan.report import render_plan
from test_flags import SEED_ARGV  # the spec's launch recipe, verbatim
from test_plan import INPUT_FLAGS

BASES = {"defaults": INPUT_FLAGS, "seed": SEED_ARGV}


def listed_as_not_implemented(text: str) -> list[str]:
    """The lines under `hybrid plan`'s "not implemented yet:" (none without a memory estimate after them)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("not implemented yet:"))
    return [line[2:] for line in lines[start + 1:] if line.startswith("  ")]


def values_of(flag: str) -> list[str]:
    """Values that move the flag off its default (none for a boolean or a `no_` flag)."""
    path = flag[2:]
    info = leaf_paths().get(path)
    if info is None:  # --x.no_y
        return []
    kind = info.annotation
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # `X | None`: the X
        kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
    if kind is bool:
        return []
    if typing.get_origin(kind) is typing.Literal:
        options = typing.get_args(kind)
        return [str(next((o for o in options if o != info.default), options[0]))]
    if typing.get_origin(kind) is tuple:
        return [str(v) for v in (info.default or (0.5, 2.0))]
    if typing.get_origin(kind) is list:
        return ["x"]
    if kind is int:
        return [str(info.default + 1 if isinstance(info.default, int) else 2)]
    if kind is float:
        return [str(info.default / 2 if info.default else 2.0)]
    return ["x"]


@pytest.mark.parametrize("base", sorted(BASES))
def test_every_flag_the_plan_lists_as_not_implemented_is_what_train_refuses_and_back(base):
    checked = 0
    for flag in flag_names():
        try:
            cfg = parse_cli([*BASES[base], flag, *values_of(flag)])
        except (ConfigError, ValueError):  # a value a cross-field rule refuses: the parser's business, not the plan's
            continue
        listed = listed_as_not_implemented(render_plan(cfg))
        refused = preflight_problems(cfg, num_gpus_found=None)
        assert [line for line in listed if not any(p.endswith(line) for p in refused)] == [], flag
        unlisted = [p for p in refused if "not implemented" in p and not any(p.endswith(line) for line in listed)]
        assert unlisted == [], flag
        checked += 1
    assert checked > len(flag_names()) * 2 // 3  # most flags parse beside the base: the loop is not vacuous


def test_tp_engines_on_their_own_gpus_are_listed_and_refused_in_the_same_words():
    apart = parse_cli(["--train.device", "cuda", "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "2",
                       "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", *INPUT_FLAGS])
    listed = listed_as_not_implemented(render_plan(apart))
    assert len(listed) == 1 and listed[0].startswith("vLLM tensor parallelism (vllm.tensor_parallel_size 2) on engines'")
    assert f"not implemented yet: {listed[0]}" in preflight_problems(apart, num_gpus_found=None)


def test_a_ring_over_padded_rows_is_listed_and_refused_in_the_same_words():
    unpacked = parse_cli([*SEED_ARGV, "--ds.packing_samples=false"])
    line = ("ds.ring_attn_size 2 splits packed samples: got ds.packing_samples False; add --ds.packing_samples, or "
            "drop --ds.ring_attn_size")
    assert listed_as_not_implemented(render_plan(unpacked)) == [line]
    assert line in preflight_problems(unpacked, num_gpus_found=None)
