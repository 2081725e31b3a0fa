"""Reading the committed benchmark results (benchmarks/results/*.json) for the README's tables.

Owns which file a figure comes from: for the engine and training figures the newest file that has it (by the date in
its name, then by name); for issue 17's side-by-side runs the session TAG of h200-peers-TAG-SYSTEM.json
(benchmarks/peers/run_peers.sh), sessions ordered by the numbers in their tags. Knows nothing of how a table looks
or what a target is (perf_table.py).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PEER_FILE = re.compile(r"h200-peers-(?P<tag>.+)-(?P<system>hybrid|openrlhf|trl)\.json")


def _measured_order(path: Path) -> tuple[str, str]:
    """A results file's place in time: the date in its name, then its name."""
    found = re.search(r"\d{4}-\d{2}-\d{2}", path.name)
    return (found.group() if found else "", path.name)


def _source(path: Path, data: dict) -> str:
    return f"{path.name} @ {data['meta']['git_sha'][:7]}"


def load_figures(*patterns: str, results_dir: Path = RESULTS) -> dict[str, tuple[object, str]]:
    """figure → (value, "file @ git sha") from the files matching any of `patterns`; later files override earlier
    ones."""
    figures = {}
    paths = {path for pattern in patterns for path in results_dir.glob(pattern)}
    for path in sorted(paths, key=_measured_order):
        data = json.loads(path.read_text())
        figures |= {name: (value, _source(path, data)) for name, value in data["figures"].items()}
    return figures


def session_order(tag: str) -> tuple:
    """Sorts session tags by their numbers as numbers: s9 < s38 < s100, 2026-12-05 < 2026-12-11."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", tag) if part)


def _peer_files(results_dir: Path):
    """(TAG, system, path, its data) for every h200-peers-TAG-SYSTEM.json file."""
    for path in sorted(results_dir.glob("h200-peers-*.json")):
        found = PEER_FILE.fullmatch(path.name)
        if found:
            yield found["tag"], found["system"], path, json.loads(path.read_text())


def peer_sessions(results_dir: Path = RESULTS) -> dict[str, dict[str, tuple[dict, str]]]:
    """{TAG: {system: (its figures, "file @ git sha")}} from the h200-peers-TAG-SYSTEM.json files."""
    sessions: dict[str, dict] = {}
    for tag, system, path, data in _peer_files(results_dir):
        sessions.setdefault(tag, {})[system] = (data["figures"], _source(path, data))
    return sessions


def walled(runs: dict[str, tuple[dict, str]]) -> set[str]:
    """The systems of a session that measured a step wall (a run cut off before its steps 2–3 did not)."""
    return {system for system, (figures, _) in runs.items() if "iteration_wall_s" in figures}


def peer_session(results_dir: Path = RESULTS) -> tuple[str | None, dict[str, tuple[dict, str]]]:
    """(the newest session TAG, {system: (its figures, "file @ git sha")}) from h200-peers-TAG-SYSTEM.json files. A
    session counts once it measured a comparison: a step wall of `hybrid train` and of a peer (one of either alone,
    or one whose `hybrid train` was cut off before its steps 2–3, compares with nothing)."""
    sessions = {tag: runs for tag, runs in peer_sessions(results_dir).items()
                if "hybrid" in walled(runs) and walled(runs) - {"hybrid"}}
    if not sessions:
        return None, {}
    tag = max(sessions, key=session_order)
    return tag, sessions[tag]


def earlier_peers(tag: str | None, runs: dict, results_dir: Path = RESULTS) -> dict[str, tuple[dict, str, str]]:
    """{peer: (figures, source, its TAG)}: for each peer that did not measure a step wall in session TAG, its newest
    earlier session that did. Shown for reference only: not side by side with ours, so not in the speed-up."""
    if tag is None:
        return {}
    earlier: dict[str, tuple[dict, str, str]] = {}
    sessions = peer_sessions(results_dir)
    for other in sorted((t for t in sessions if session_order(t) < session_order(tag)), key=session_order):
        for system in walled(sessions[other]) - {"hybrid"} - walled(runs):
            earlier[system] = (*sessions[other][system], other)  # a newer session overwrites an older one
    return earlier


@dataclass(frozen=True, kw_only=True)
class IterationRun:
    """One `hybrid train` iteration benchmark (h200-peers-TAG-hybrid.json) that measured a step wall."""
    tag: str
    flags: tuple[str, ...]  # the extra `hybrid train` flags it ran with; () is the benchmark config's defaults
    git_sha: str
    figures: dict
    trials: dict
    source: str


def iteration_runs(results_dir: Path = RESULTS) -> list[IterationRun]:
    """Every iteration benchmark with a step wall, oldest session first."""
    runs = [IterationRun(tag=tag, flags=tuple(data["meta"].get("iteration_flags", ())),
                         git_sha=data["meta"]["git_sha"][:7], figures=data["figures"], trials=data.get("trials", {}),
                         source=_source(path, data))
            for tag, system, path, data in _peer_files(results_dir)
            if system == "hybrid" and "iteration_wall_s" in data["figures"]]
    return sorted(runs, key=lambda run: session_order(run.tag))


def newest_default_iteration(results_dir: Path = RESULTS) -> tuple[IterationRun | None, list[IterationRun]]:
    """(the newest iteration at the default flags, the runs at other flags of the same commit): the layouts that
    were measured beside it."""
    runs = iteration_runs(results_dir)
    defaults = [run for run in runs if not run.flags]
    if not defaults:
        return None, []
    newest = defaults[-1]
    return newest, [run for run in runs if run.flags and run.git_sha == newest.git_sha]
