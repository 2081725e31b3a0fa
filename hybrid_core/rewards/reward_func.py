"""Loading and calling a user reward function: `reward_func(queries, prompts, labels, **kwargs)`.

Owns the seed's interface contract (returns {"rewards", "scores", "extra_logs"}) and its validation: a function that
raises, returns the wrong length, a wrong type or a NaN fails with a message naming the file and the sample. Such a
failure is a `RewardFunctionError` (not retried) when calling again cannot help: bad output, or a raise that repeats
on the failing sample alone. `reward_file_problems` checks a file before a run starts, without running it. It knows
nothing of Ray or the store.
"""
from __future__ import annotations

import ast
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hybrid_core.types import PermanentError


class RewardFunctionError(PermanentError, ValueError):
    """The reward function returned what the interface does not allow, or raised again on the sample alone."""


@dataclass(frozen=True)
class RewardBatch:
    rewards: list[float]
    scores: list[float]
    extra_logs: list[dict]


def load_reward_func(path: str) -> Callable:
    """Import `reward_func` from a Python file given as `--reward.remote_url path/to/file.py`."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"reward.remote_url points to a missing file: got {path!r}; give a .py file "
                                f"defining reward_func(queries, prompts, labels, **kwargs)")
    spec = importlib.util.spec_from_file_location(f"reward_module_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "reward_func", None)):
        raise ValueError(f"reward.remote_url file defines no reward_func: got {path!r}; add "
                         f"def reward_func(queries, prompts, labels, **kwargs)")
    return module.reward_func


def _is_array(value) -> bool:
    """A torch tensor or numpy array (told by duck typing, so checking a file needs neither imported)."""
    return hasattr(value, "reshape") and hasattr(value, "tolist")


def _as_floats(value, name: str, n: int, source: str, keys: list | None = None) -> list[float]:
    if _is_array(value):
        value = value.reshape(-1)
    try:
        values = value.tolist() if _is_array(value) else list(value)
    except TypeError:
        raise RewardFunctionError(f"reward_func in {source} returned {name} of type {type(value).__name__}; "
                                  f"return a tensor or list with one value per sample") from None
    if isinstance(value, (str, bytes)) or len(values) != n:
        raise RewardFunctionError(f"reward_func in {source} returned {len(values)} {name} for {n} samples "
                                  f"({type(value).__name__}); return a tensor or list with one number per sample")
    floats = [_as_float(v, i, name, source, keys) for i, v in enumerate(values)]
    bad = [i for i, v in enumerate(floats) if math.isnan(v) or math.isinf(v)]
    if bad:
        raise RewardFunctionError(f"reward_func in {source} returned a non-finite {name[:-1]} {floats[bad[0]]} for "
                                  f"sample "
                         f"{_sample_name(bad[0], keys)} ({len(bad)} of {n} samples); return finite numbers")
    return floats


def _as_float(value, i: int, name: str, source: str, keys: list | None) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RewardFunctionError(f"reward_func in {source} returned {name[:-1]} {value!r} for sample "
                                  f"{_sample_name(i, keys)}; return numbers") from None


def _sample_name(i: int, keys: list | None) -> str:
    return f"#{i}" if keys is None else f"#{i} (prompt_index, sample_index) = {tuple(keys[i])}"


def _first_failing(func: Callable, queries, prompts, labels) -> tuple[int, Exception] | None:
    """Which sample makes the function raise: call it on one sample at a time."""
    for i in range(len(queries)):
        try:
            func(queries[i:i + 1], prompts[i:i + 1], labels[i:i + 1])
        except Exception as err:  # the user's code: any exception
            return i, err
    return None


def score_samples(func: Callable, source: str, queries: list[str], prompts: list[str],
                  labels: list[str], keys: list | None = None) -> RewardBatch:
    """Call the function once on the whole batch and check what it returns; errors name the sample."""
    try:
        out = func(queries, prompts, labels)
    except Exception as err:
        failing = _first_failing(func, queries, prompts, labels)
        i, cause = failing if failing else (None, err)
        where = f"on sample {_sample_name(i, keys)}" if i is not None else f"on a batch of {len(queries)} samples"
        # raising again on one sample alone: a retry would fail the same way; otherwise it may have been transient
        error = RewardFunctionError if failing else RuntimeError
        raise error(f"reward_func in {source} raised {type(cause).__name__}: {cause} {where}; fix the "
                    f"reward function, then resume the run (committed stages are kept)") from err
    if not isinstance(out, dict) or "rewards" not in out:
        raise RewardFunctionError(f"reward_func in {source} must return a dict with 'rewards': got "
                                  f"{type(out).__name__}{'' if not isinstance(out, dict) else ' without rewards'}")
    n = len(queries)
    rewards = _as_floats(out["rewards"], "rewards", n, source, keys)
    scores = _as_floats(out["scores"], "scores", n, source, keys) if "scores" in out else list(rewards)
    extra = _checked_extra_logs(out.get("extra_logs") or {}, n, source)
    per_sample = [{k: _item(v, i) for k, v in extra.items()} for i in range(n)]
    return RewardBatch(rewards, scores, per_sample)


def _checked_extra_logs(extra, n: int, source: str) -> dict:
    """extra_logs as {key: values}, each value one per sample (a list, tuple or tensor of n) or one for the batch
    (a scalar, or a tensor of one); any other length is refused naming the key, since it cannot be split."""
    if not isinstance(extra, dict):
        raise RewardFunctionError(f"reward_func in {source} returned extra_logs of type {type(extra).__name__}; "
                                  "return a dict of {name: one value per sample}")
    for key, value in extra.items():
        if _is_array(value):
            length, allowed = value.reshape(-1).shape[0], (1, n)
        elif isinstance(value, (list, tuple)):
            length, allowed = len(value), (n,)
        else:
            continue  # one scalar for the batch
        if length not in allowed:
            raise RewardFunctionError(f"reward_func in {source} returned extra_logs[{key!r}] with {length} values "
                                      f"for {n} samples; return one value per sample, or one number for the batch")
    return extra


def _item(value, i: int):
    """extra_logs values may be per-sample sequences/tensors or one scalar for the batch."""
    if _is_array(value):
        flat = value.reshape(-1).tolist()
        return flat[i] if len(flat) > 1 else flat[0]
    if isinstance(value, (list, tuple)):
        return value[i]
    return value


def _binds_reward_func(tree: ast.Module) -> bool:
    """A top-level `def reward_func`, `reward_func = …` or `from … import reward_func`."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "reward_func":
            return True
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "reward_func" for t in node.targets):
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == "reward_func" for a in node.names):
            return True
    return False


def missing_modules(tree: ast.Module) -> list[str]:
    """Top-level imports of the file that are not installed (found without importing them)."""
    names = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module and not node.level]
    return sorted({name for name in names if importlib.util.find_spec(name.split(".")[0]) is None})


def reward_file_problems(path: str) -> list[str]:
    """Why `reward.remote_url FILE.py` cannot be loaded, found without running it (empty when it can): a syntax
    error, no `reward_func`, or an import that is not installed."""
    file = Path(path)
    if not file.is_file():
        return []  # a missing input is reported where every input's existence is checked
    try:
        tree = ast.parse(file.read_text(), filename=str(file))
    except SyntaxError as err:
        return [f"reward.remote_url {path!r} has a syntax error at line {err.lineno}: {err.msg}; fix the file"]
    except (UnicodeDecodeError, ValueError) as err:
        return [f"reward.remote_url {path!r} is not a Python source file: {err}"]
    problems = []
    if not _binds_reward_func(tree):
        problems.append(f"reward.remote_url {path!r} defines no reward_func; add def reward_func(queries, prompts, "
                        "labels, **kwargs) returning {'rewards': …}")
    if missing := missing_modules(tree):
        problems.append(f"reward.remote_url {path!r} imports {', '.join(missing)}, which is not installed here; "
                        "install it in the run's environment")
    return problems
