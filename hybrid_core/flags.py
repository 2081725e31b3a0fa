"""Command-line flags and YAML files into a `RunConfig`, with every problem reported at once.

Flags are the dotted field paths of `config.RunConfig` (`--actor.adam.lr 5e-7`) and parse as OpenRLHF's
argparse does: booleans are store_true, 2-tuples take two values, lists take values up to the next flag;
`--flag=value` also works (`--x.enable=false`, `--x.betas=0.9,0.95`) and `--actor.muon.no_nesterov` negates.
`--config FILE.yaml` is the same tree nested; flags override it. Values stay strings until pydantic converts
them, so the config tree is the one place that knows types. This module knows nothing about running a job.
"""
from __future__ import annotations

import difflib
import functools
import reprlib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from hybrid_core.config import ConfigError, RunConfig, leaf_paths

__all__ = ["ConfigError", "parse_cli", "config_from_dict", "load_config_file", "config_to_yaml", "flag_names"]

NONE_WORDS = ("none", "null")


@dataclass(frozen=True)
class FlagSpec:
    """How one flag reads its values. `num_values` is 0 for booleans, None for lists (one or more)."""

    path: str
    num_values: int | None
    annotation: Any
    is_nullable: bool = False
    is_negated: bool = False


CONFIG_SPEC = FlagSpec("config", 1, str)


def _without_none(annotation: Any) -> tuple[Any, bool]:
    """The annotation with `| None` removed, and whether None was allowed."""
    if get_origin(annotation) not in (typing.Union, types.UnionType):
        return annotation, False
    args = tuple(arg for arg in get_args(annotation) if arg is not type(None))
    rest = args[0] if len(args) == 1 else typing.Union[args]
    return rest, len(args) < len(get_args(annotation))


def _num_values(annotation: Any) -> int | None:
    if annotation is bool:
        return 0
    if get_origin(annotation) is tuple:
        return len(get_args(annotation))
    return None if get_origin(annotation) is list else 1


@functools.cache
def _flag_specs() -> dict[str, FlagSpec]:
    """Flag name (without --) → spec; a boolean that defaults to True or to None (decided by the run) also gets a
    `no_` flag."""
    specs = {}
    for path, info in leaf_paths(RunConfig).items():
        annotation, is_nullable = _without_none(info.annotation)
        specs[path] = FlagSpec(path, _num_values(annotation), annotation, is_nullable)
        if annotation is bool and info.default in (True, None):
            head, _, name = path.rpartition(".")
            negated = f"{head}.no_{name}" if head else f"no_{name}"
            specs[negated] = FlagSpec(path, 0, bool, is_negated=True)
    return specs


def flag_names() -> list[str]:
    """Every config flag, e.g. `--actor.adam.lr` and `--actor.muon.no_nesterov` (not `--config`)."""
    return [f"--{name}" for name in _flag_specs()]


def _did_you_mean(name: str, candidates: list[str], dashes: str) -> str:
    match = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if match:
        return f"did you mean {dashes}{match[0]}?"
    namespaces = ", ".join(RunConfig.model_fields)
    return f"names start with one of: {namespaces}"


def _convert(raw: str, spec: FlagSpec) -> Any:
    """Turn the few strings pydantic would refuse into values; everything else stays a string."""
    if spec.is_nullable and raw.lower() in NONE_WORDS:
        return None
    literal_values = get_args(spec.annotation) if get_origin(spec.annotation) is Literal else ()
    if literal_values and all(isinstance(value, int) for value in literal_values):
        # pydantic does not coerce "2" to Literal[1, 2]
        return int(raw) if raw.lstrip("-").isdigit() else raw
    return raw


def _flag_value(spec: FlagSpec, flag: str, args: list[str], inline: str | None) -> tuple[Any, str | None]:
    """The value of one flag from the tokens after it (or its `=value`), or a problem message."""
    if spec.num_values == 0:
        if args or (inline is not None and spec.is_negated):
            return None, f"{flag} takes no value: got {args or inline!r}; write {flag} alone"
        return (not spec.is_negated) if inline is None else inline, None
    if inline is not None:
        args = [inline, *args] if spec.num_values == 1 else [*inline.split(","), *args]
    if spec.is_nullable and len(args) == 1 and args[0].lower() in NONE_WORDS:
        return None, None
    if spec.num_values is None:
        return (args, None) if args else (None, f"{flag} needs one or more values: got []; write {flag} A B")
    if len(args) != spec.num_values:
        placeholders = " ".join(["VALUE"] * spec.num_values)
        return None, f"{flag} needs {spec.num_values} value(s): got {args!r}; write {flag} {placeholders}"
    if spec.num_values == 1:
        return _convert(args[0], spec), None
    return tuple(args), None


def _parse_flags(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """`argv` into {dotted path: value} and the problems found; each flag owns the tokens up to the next one."""
    specs = {**_flag_specs(), "config": CONFIG_SPEC}
    starts = [i for i, token in enumerate(argv) if token.startswith("--")] + [len(argv)]
    if argv[:starts[0]]:
        return {}, [f"arguments must start with a --flag: got {argv[:starts[0]]!r}; e.g. --actor.num_nodes 1"]
    values, problems = {}, []
    for start, end in zip(starts, starts[1:]):
        name, has_inline, inline = argv[start][2:].partition("=")
        spec = specs.get(name)
        if spec is None:
            problems.append(f"--{name} is not a flag: got {argv[start]!r}; "
                            + _did_you_mean(name, list(specs), "--"))
            continue
        value, problem = _flag_value(spec, f"--{name}", argv[start + 1:end], inline if has_inline else None)
        if problem:
            problems.append(problem)
        else:
            values[spec.path] = value
    return values, problems


def _yaml_keys() -> list[str]:
    """Every dotted key a YAML file may hold: leaves and the blocks above them."""
    keys = set()
    for path in leaf_paths(RunConfig):
        parts = path.split(".")
        keys.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(keys)


def _is_block(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _known_keys(data: dict, model: type[BaseModel], prefix: str = "") -> tuple[dict, list[str]]:
    """`data` without the keys `model` lacks, and one problem (with a suggestion) per such key."""
    clean, problems = {}, []
    for key, value in data.items():
        path = f"{prefix}{key}"
        info = model.model_fields.get(key) if isinstance(key, str) else None
        if info is None:
            problems.append(f"{path} is not a config key: got {reprlib.repr(value)}; "
                            + _did_you_mean(path, _yaml_keys(), ""))
        elif isinstance(value, dict) and _is_block(info.annotation):
            clean[key], sub_problems = _known_keys(value, info.annotation, f"{path}.")
            problems += sub_problems
        else:
            clean[key] = value
    return clean, problems


def _set_path(data: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        if not isinstance(data.get(part), dict):
            data[part] = {}
        data = data[part]
    data[leaf] = value


def _validation_problems(err: ValidationError) -> list[str]:
    """One template message per pydantic error; cross-field rules arrive as a ConfigError inside."""
    problems = []
    for error in err.errors():
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, ConfigError):
            problems += cause.problems
            continue
        path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
        message = error["msg"][:1].lower() + error["msg"][1:]
        problems.append(f"{path.lstrip('.') or 'config'} is invalid: got {error['input']!r}; {message}")
    return problems


def config_from_dict(data: dict, problems: list[str] | None = None) -> RunConfig:
    """Validate a nested dict into a RunConfig; raise one ConfigError with `problems` and every error found."""
    data, key_problems = _known_keys(data, RunConfig)
    problems = [*(problems or []), *key_problems]
    cfg = None
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as err:
        problems += _validation_problems(err)
    if problems or cfg is None:
        raise ConfigError(problems)
    return cfg


def load_config_file(path: str | Path) -> dict:
    """Read a YAML config (the nested RunConfig tree); an empty file is an empty dict."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--config must name a YAML file: got {str(path)!r}; no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError([f"--config is not valid YAML: got {str(path)!r}; fix the syntax ({err})"]) from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"--config must hold a mapping at the top: got {reprlib.repr(data)}; "
                           "write e.g. 'actor:\\n  num_nodes: 1'"])
    return data


def config_to_yaml(cfg: RunConfig) -> str:
    """The whole tree as YAML that `--config` reads back to an equal RunConfig."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def parse_cli(argv: list[str]) -> RunConfig:
    """`[--config FILE.yaml] [--dotted.flag VALUE ...]` into a validated RunConfig; flags override the file.

    Raises:
        ConfigError: every unknown flag or key (with the closest valid name), missing value and invalid field.
        FileNotFoundError: `--config` names no file.
    """
    values, problems = _parse_flags(argv)
    config_file = values.pop("config", None)
    data = load_config_file(config_file) if config_file else {}
    for path, value in values.items():
        _set_path(data, path, value)
    return config_from_dict(data, problems)


# What a resumed run may change: how far it goes, where its directory now lives, and how its stages are waited for
# and retried (none of these changes what a step computes).
RESUME_CHANGEABLE = ("train.max_steps", "store.root", "train.stage_timeout_s", "train.stage_retries",
                     "train.retry_delay_s")


def config_differences(saved: dict, cfg: RunConfig, allowed=RESUME_CHANGEABLE) -> list[str]:
    """Dotted fields whose value in `cfg` differs from a run's saved configuration, but for `allowed` ones."""
    from hybrid_core.config import leaf_values

    before, after = leaf_values(RunConfig.model_validate(saved)), leaf_values(cfg)
    return [f"{path}: saved {before[path]!r}, now {after[path]!r}" for path in after
            if path not in allowed and before[path] != after[path]]
