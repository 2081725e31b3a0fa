"""Issue 17's two README tables: its seven targets, each at its newest measurement, and the peers side by side.

Owns the targets (step wall, orchestration, sleep + wake + sync, generation against its decode roofline in every
step, training MFU, DeepSpeed's wake, the speed-up over the fastest peer), how each is judged, and how each system's
own stages map onto the peer table's columns. Knows nothing of which results file a figure comes from
(committed_results.py picks them) or of the README (perf_table.py writes the tables into it).
"""
from __future__ import annotations

from committed_results import IterationRun

MISSING = "not measured yet"
SYSTEMS = {"hybrid": "`hybrid train` (this project)", "openrlhf": "OpenRLHF 0.11.2 `train_ppo_ray`",
           "trl": "TRL 1.16 `GRPOTrainer`"}
# each system's own stages (iteration_stage_s) summed into the table's columns; the rest of the wall is "other"
PEER_COLUMNS = {
    "hybrid": {"generation": ("rollout",), "experience": ("reward", "advantage"), "train": ("train",),
               "weight sync": ("sync",)},
    "openrlhf": {"generation": ("generation",), "experience": ("make_experience",), "train": ("ppo_train",),
                 "weight sync": ("broadcast",)},
    "trl": {"generation": ("generation",), "experience": ("reward", "logprobs", "experience"),
            "train": ("update", "optimizer"), "weight sync": ("weight_sync",)},
}
PEER_SPEEDUP_TARGET = 1.5
WALL_TARGET_S, ORCHESTRATION_TARGET_S, SLEEP_WAKE_SYNC_TARGET_S = 20.0, 0.3, 0.6
GEN_ROOFLINE_TARGET = 0.6  # generation vs its decode roofline, in every step
MFU_TARGET, DS_WAKE_TARGET_GBPS = 0.45, 50.0
# the iteration's stages that are sleep, wake and sync (ds_sleep_wait is inside the sync's seconds)
SLEEP_WAKE_SYNC = {"vllm_wake": "vLLM wake", "vllm_sleep": "vLLM sleep", "ds_wake": "DeepSpeed wake",
                   "ds_sleep": "DeepSpeed sleep", "sync": "sync"}


def met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def speedup(runs: dict[str, tuple[dict, str]]) -> tuple[str, float] | None:
    """(the fastest peer, its step wall over ours) among the systems of one session, or None without both."""
    walls = {system: figures["iteration_wall_s"] for system, (figures, _) in runs.items()
             if "iteration_wall_s" in figures}
    peers = {system: wall for system, wall in walls.items() if system != "hybrid"}
    if "hybrid" not in walls or not peers:
        return None
    fastest = min(peers, key=peers.get)
    return fastest, peers[fastest] / walls["hybrid"]


def gen_fractions(run: IterationRun) -> dict[int, float]:
    """step → its generation's fraction of the step's decode roofline (bench_iteration's per-step trials)."""
    per_step = run.trials.get("iteration_gen_fraction_of_roofline") or {}
    return {int(step): figures["fraction"] for step, figures in sorted(per_step.items(), key=lambda kv: int(kv[0]))}


def _fractions_text(fractions: dict[int, float]) -> str:
    steps = list(fractions)
    shown = " / ".join(f"{fraction:.1%}" for fraction in fractions.values())
    return f"{shown} (steps {steps[0]}–{steps[-1]})" if len(steps) > 1 else f"{shown} (step {steps[0]})"


def _iteration_rows(run: IterationRun | None) -> list[tuple[str, str, str, str, str]]:
    names = ("`iteration_wall_s`, steps 2–3, default flags", "orchestration per step (wall − stages)",
             "sleep + wake + sync per step", "generation vs its decode roofline, every step")
    targets = (f"≤ {WALL_TARGET_S:.0f} s", f"≤ {ORCHESTRATION_TARGET_S} s", f"≤ {SLEEP_WAKE_SYNC_TARGET_S} s",
               f"≥ {GEN_ROOFLINE_TARGET:.0%}")
    if run is None:
        return [(name, MISSING, target, "—", "") for name, target in zip(names, targets)]
    wall, stages, where = run.figures["iteration_wall_s"], run.figures["iteration_stage_s"], f"`{run.source}`"
    parts = {label: stages.get(key, 0.0) for key, label in SLEEP_WAKE_SYNC.items()}
    overhead = sum(parts.values())
    fractions = gen_fractions(run)
    rows = [(names[0], f"{wall:.2f} s", targets[0], met(wall <= WALL_TARGET_S), where),
            (names[1], f"{stages['orchestration']:.2f} s", targets[1],
             met(stages["orchestration"] <= ORCHESTRATION_TARGET_S), where),
            (names[2], f"{overhead:.2f} s (" + ", ".join(f"{label} {s:.2f}" for label, s in parts.items()) + ")",
             targets[2], met(overhead <= SLEEP_WAKE_SYNC_TARGET_S), where)]
    if not fractions:
        return rows + [(names[3], MISSING, targets[3], "—", where)]
    return rows + [(names[3], _fractions_text(fractions), targets[3],
                    met(min(fractions.values()) >= GEN_ROOFLINE_TARGET), where)]


def judged_row(figures: dict, name: str, target: str, show, judge, *needed: str) -> tuple[str, str, str, str, str]:
    """(name, measured, target, met, its files) from `figures` ({figure: (value, "file @ sha")}): `show` and `judge`
    take {figure: value} of the `needed` figures; a missing one makes the row say it is not measured yet."""
    if not all(key in figures for key in needed):
        return name, MISSING, target, "—", ""
    values = {key: figures[key][0] for key in needed}
    sources = "; ".join(f"`{source}`" for source in dict.fromkeys(figures[key][1] for key in needed))
    return name, show(values), target, met(judge(values)), sources


def _figure_rows(figures: dict) -> list[tuple[str, str, str, str, str]]:
    """Training MFU on the default CUDA path and DeepSpeed's wake, from the newest files that have them."""
    return [judged_row(figures, "`train_mfu_1p7b` / `train_mfu_4b`, default CUDA path", f"≥ {MFU_TARGET:.0%}",
                       lambda v: f"{v['train_mfu_1p7b']:.1%} / {v['train_mfu_4b']:.1%}",
                       lambda v: min(v.values()) >= MFU_TARGET, "train_mfu_1p7b", "train_mfu_4b"),
            judged_row(figures, "`ds_wake_gbps`, slowest of 4 calls", f"≥ {DS_WAKE_TARGET_GBPS:.0f} GB/s",
                       lambda v: f"{v['ds_wake_gbps']:.1f} GB/s", lambda v: v["ds_wake_gbps"] >= DS_WAKE_TARGET_GBPS,
                       "ds_wake_gbps")]


def _peer_target_row(tag: str | None, runs: dict[str, tuple[dict, str]]) -> tuple[str, str, str, str, str]:
    name, target = "`hybrid train` against the fastest peer, back to back", f"≥ {PEER_SPEEDUP_TARGET}× faster"
    found = speedup(runs)
    if found is None:
        return name, MISSING, target, "—", ""
    fastest, ratio = found
    ours, theirs = runs["hybrid"][0]["iteration_wall_s"], runs[fastest][0]["iteration_wall_s"]
    return (name, f"{ratio:.2f}× ({ours:.1f} s a step against {SYSTEMS[fastest]}'s {theirs:.1f} s)", target,
            met(ratio >= PEER_SPEEDUP_TARGET), f"session `{tag}` (the peer table below)")


def _variant_lines(variants: list[IterationRun]) -> list[str]:
    """The same commit's runs at other flags: layouts measured beside the default, not the default."""
    lines = []
    for run in variants:
        fractions = gen_fractions(run)
        generation = f", generation {_fractions_text(fractions)}" if fractions else ""
        lines.append(f"- `{' '.join(run.flags)}` (`{run.source}`): {run.figures['iteration_wall_s']:.2f} s a step"
                     f"{generation}.")
    return ["", "Beside the default at the same commit, with other flags:", *lines] if lines else []


def render_targets(run: IterationRun | None, variants: list[IterationRun], figures: dict, peers_tag: str | None,
                   peer_runs: dict[str, tuple[dict, str]]) -> str:
    """Issue 17's targets at the Qwen3-1.7B rollout shape: the iteration's from `run` (the newest at the default
    flags), MFU and DeepSpeed's wake from `figures`, the speed-up from the newest peer session."""
    lines = ["| issue 17 target (Qwen3-1.7B stand-in, 32 prompts × 8 samples × 1,024 tokens, one H200) | measured "
             "| target | met | from |", "|---|---|---|---|---|"]
    rows = [*_iteration_rows(run), *_figure_rows(figures), _peer_target_row(peers_tag, peer_runs)]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines + _variant_lines(variants))


def _peer_row(system: str, figures: dict | None, earlier_tag: str | None = None) -> str:
    label = SYSTEMS[system] if earlier_tag is None else f"{SYSTEMS[system]}, earlier session `{earlier_tag}`"
    if not figures or "iteration_wall_s" not in figures:
        return f"| {label} | {MISSING} |  |  |  |  |  |"
    wall, stages = figures["iteration_wall_s"], figures.get("iteration_stage_s", {})
    columns = [sum(stages.get(name, 0.0) for name in names) for names in PEER_COLUMNS[system].values()]
    cells = [f"{seconds:.1f} s" for seconds in (wall, *columns, wall - sum(columns))]
    return f"| {label} | " + " | ".join(cells) + " |"


def _system_row(system: str, runs: dict, earlier: dict) -> str:
    if system in earlier:  # earlier_peers holds only the peers this session has no step wall of
        return _peer_row(system, earlier[system][0], earlier[system][2])
    return _peer_row(system, runs.get(system, (None, ""))[0])


def _earlier_lines(runs: dict, earlier: dict) -> list[str]:
    """Each earlier session's peer against this session's `hybrid train`, said to be no side-by-side figure."""
    hybrid = runs.get("hybrid", ({}, ""))[0].get("iteration_wall_s")
    if not earlier or hybrid is None:
        return []
    parts = [f"{SYSTEMS[system]} in `{other}`, {figures['iteration_wall_s']:.1f} s a step "
             f"({figures['iteration_wall_s'] / hybrid:.2f}× ours)"
             for system, (figures, _, other) in sorted(earlier.items())]
    return [f"From earlier sessions, not side by side, so not in the speed-up: {'; '.join(parts)}.", ""]


def render_peers(tag: str | None, runs: dict[str, tuple[dict, str]], earlier: dict | None = None) -> str:
    """Issue 17's side-by-side table and its target: `hybrid train` ≥ 1.5× faster a step than the fastest peer of
    the same session. A peer that session lacks shows its newest earlier run (`earlier_peers`), marked as such."""
    earlier = earlier or {}
    lines = ["| system (Qwen3-1.7B stand-in, 32 prompts × 8 samples × 1,024 tokens, one H200) | step wall (steps 2–3) "
             "| generation | experience | train | weight sync | other |", "|---|---|---|---|---|---|---|"]
    lines += [_system_row(system, runs, earlier) for system in SYSTEMS]
    found = speedup(runs)
    if found is None:
        verdict = f"{MISSING} (target ≥ {PEER_SPEEDUP_TARGET}× the fastest peer)"
    else:
        fastest, ratio = found
        verdict = (f"{ratio:.2f}× the fastest peer ({SYSTEMS[fastest]}); target ≥ {PEER_SPEEDUP_TARGET}×: "
                   f"{met(ratio >= PEER_SPEEDUP_TARGET)}")
    lines += ["", f"Speed-up of `hybrid train`: {verdict}.", ""]
    lines += _earlier_lines(runs, earlier)
    if tag is None:
        lines.append("No peer session in benchmarks/results yet (`benchmarks/peers/run_peers.sh`).")
    else:
        sources = [source for _, source in runs.values()] + [source for _, source, _ in earlier.values()]
        sources = "; ".join(f"`{source}`" for source in sources)
        lines.append(f"Session `{tag}`: {sources} (each file's meta says how its system ran; logs beside them).")
    return "\n".join(lines)
