"""`hybrid rollouts RUN_DIR [--step K] [--stage STAGE] [--head N]`: a run's datasets at a glance.

Prints one summary line per committed step (rows, reward, response length, KL and eval pass@1 from the metrics rows,
step 0 being the initial evaluation), then the first N rows of one stage of one step (default: the rollouts of the
last step); an agent's rollout rows are followed by their episodes, turn by turn. Reads the Arrow datasets with pyarrow and fsspec directly (through the run store, which refuses a
damaged manifest clearly), locally or on s3://, so it works on a run whose workers are long gone.
"""
from __future__ import annotations

import json
import sys

USAGE = "usage: hybrid rollouts RUN_DIR [--step K] [--stage rollout|reward|advantage|eval|metrics] [--head N]"
STAGES = ("rollout", "reward", "advantage", "eval", "metrics")


def _options(argv: list[str]) -> dict:
    opts, rest = {"step": None, "stage": "rollout", "head": 5}, list(argv)
    for name, kind in (("step", int), ("stage", str), ("head", int)):
        if f"--{name}" in rest:
            i = rest.index(f"--{name}")
            opts[name] = kind(rest[i + 1])
            del rest[i:i + 2]
    if len(rest) != 1 or opts["stage"] not in STAGES:
        raise ValueError(USAGE)
    return opts | {"run_dir": rest[0].rstrip("/")}


def _table(fs, root: str, step: int, stage: str):
    import pyarrow.dataset as pds

    files = sorted(p for p in fs.ls(f"{root}/steps/{step}/{stage}", detail=False) if p.endswith(".parquet"))
    return pds.dataset(files, format="parquet", filesystem=fs).to_table()


def _cell(value, width: int = 60) -> str:
    text = json.dumps(value) if isinstance(value, list) else str(value)
    return text if len(text) <= width else text[:width - 1] + "…"


def _summary_line(step: int, entries: dict, m: dict) -> str:
    """A step's line: its samples, reward, length and KL, and each data source's pass@1 when it was evaluated."""
    evaluated = " | ".join(f"{key.removeprefix('eval/')} {value:.4f}" for key, value in m.items()
                           if key.startswith("eval/") and key.endswith("_pass1"))
    if "rollout" not in entries:  # step 0 (eval.at_start): the evaluation of the initial policy alone
        return f"step {step}: initial evaluation | {evaluated}"
    line = (f"step {step}: {entries['rollout']['rows']} samples | reward {m['reward/mean']:.4f} | "
            f"response length {m['rollout/response_length_mean']:.1f} | kl {m['actor/kl']:.5f}")
    return f"{line} | {evaluated}" if evaluated else line


def rollouts_command(argv: list[str]) -> int:
    from hybrid_core.data.rollout_store import ManifestError, RolloutStore

    try:
        opts = _options(argv)
    except (ValueError, IndexError) as err:
        print(err if str(err).startswith("usage") else f"{USAGE}\n{err}", file=sys.stderr)
        return 2
    store = RolloutStore(opts["run_dir"])
    fs, root = store.fs, store.root
    if not store.exists("manifest.json"):
        print(f"no run at {opts['run_dir']!r} (no manifest.json)", file=sys.stderr)
        return 2
    try:
        steps = store.manifest()["steps"]
    except ManifestError as err:
        print(err, file=sys.stderr)
        return 2
    done = sorted(int(k) for k, v in steps.items() if "metrics" in v)
    for k in done:
        print(_summary_line(k, steps[str(k)], _table(fs, root, k, "metrics").to_pylist()[0]))
    step = opts["step"] if opts["step"] is not None else (max(int(k) for k in steps) if steps else None)
    if step is None or opts["stage"] not in steps.get(str(step), {}):
        print(f"step {step} has no committed {opts['stage']!r} dataset", file=sys.stderr)
        return 2
    table = _table(fs, root, step, opts["stage"]).slice(0, opts["head"])
    print(f"\n{opts['stage']} of step {step} (first {table.num_rows} rows):")
    for row in table.to_pylist():
        turns = row.pop("turns", None)
        print("  " + " | ".join(f"{k}={_cell(v)}" for k, v in row.items()))
        for line in _turn_lines(json.loads(turns) if turns else []):
            print("      " + line)
    return 0


def _turn_lines(turns: list[dict]) -> list[str]:
    """An agent episode turn by turn: each action and the environment's answer, with their spans of response_ids
    (the feedback as the environment gave it; `cut` when max_len cut its tokens)."""
    lines = []
    for number, turn in enumerate(turns, start=1):
        (a, b), (c, d) = turn["action"], turn["feedback"]
        cut = " (cut at max_len)" if turn.get("feedback_truncated") else ""
        lines.append(f"turn {number}: action [{a}, {b}) {_cell(turn.get('action_text', ''))!r} → reward "
                     f"{turn['reward']:.4f} score {turn['score']:.4f}{' done' if turn['done'] else ''}")
        lines.append(f"        feedback [{c}, {d}) {_cell(turn.get('feedback_text', ''))!r}{cut}")
    return lines
