"""The README's GPU performance tables, generated from the committed benchmark results.

Reads benchmarks/results/h200-hybrid-*.json (issue #6: engines) and h200-train-*.json (issue #7: training and the
whole iteration), and for both the h200-bench-*.json files of runs that measured some of each; a figure comes from the
newest file that has it, by the date in its name (then by name). The peer table (issue 17) reads one
session's h200-peers-TAG-{hybrid,openrlhf,trl}.json (benchmarks/peers/run_peers.sh), the newest TAG (numbers in it
compared as numbers) in which `hybrid train` and a peer both measured a step wall, so the systems it sets side by side
ran on the same machine, back to back; a peer that session lacks shows its newest earlier run, marked as not side by
side and left out of the speed-up. Checks each target and
prints Markdown tables; `--write` replaces each table between its README markers. A figure not measured yet says so.
Usage: python benchmarks/perf_table.py [--write]
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
TRAIN_START, TRAIN_END = "<!-- train-table:start -->", "<!-- train-table:end -->"
PEERS_START, PEERS_END = "<!-- peers-table:start -->", "<!-- peers-table:end -->"
MISSING = "not measured yet"
PEER_FILE = re.compile(r"h200-peers-(?P<tag>.+)-(?P<system>hybrid|openrlhf|trl)\.json")
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
GEN_ROOFLINE_TARGET = 0.6  # issue 17: generation vs its decode roofline, every step


def _measured_order(path: Path) -> tuple[str, str]:
    """A results file's place in time: the date in its name, then its name."""
    found = re.search(r"\d{4}-\d{2}-\d{2}", path.name)
    return (found.group() if found else "", path.name)


def load_figures(*patterns: str) -> dict[str, tuple[object, str]]:
    """figure → (value, "file @ git sha") from the files matching any of `patterns`; later files override earlier
    ones."""
    figures = {}
    paths = {path for pattern in patterns for path in RESULTS.glob(pattern)}
    for path in sorted(paths, key=_measured_order):
        data = json.loads(path.read_text())
        source = f"{path.name} @ {data['meta']['git_sha'][:7]}"
        figures |= {name: (value, source) for name, value in data["figures"].items()}
    return figures


def _rows(f: dict) -> list[tuple[str, str, str, str]]:
    """(figure, measured, target, met) for every target, then the figures beside them."""
    v = lambda name: f[name][0]  # noqa: E731
    rows = [
        ("ds_sleep_gbps / ds_wake_gbps (slowest of 4 calls)", f"{v('ds_sleep_gbps'):.1f} / {v('ds_wake_gbps'):.1f} GB/s",
         "≥ 45 / ≥ 45", _met(v("ds_sleep_gbps") >= 45 and v("ds_wake_gbps") >= 45)),
        ("ds_first_sleep_s vs ds_offload_states_first_s", f"{v('ds_first_sleep_s'):.2f} s vs "
         f"{v('ds_offload_states_first_s'):.2f} s", "≤ 1/10",
         _met(v("ds_first_sleep_s") <= v("ds_offload_states_first_s") / 10)),
        ("vllm_sleep_s_l2 + vllm_wake_s_l2", f"{v('vllm_sleep_s_l2'):.3f} + {v('vllm_wake_s_l2'):.3f} s", "≤ 0.5 s",
         _met(v("vllm_sleep_s_l2") + v("vllm_wake_s_l2") <= 0.5)),
        ("sync_1p7b_s vs sync_1p7b_per_param_s", f"{v('sync_1p7b_s'):.3f} s vs {v('sync_1p7b_per_param_s'):.3f} s",
         "≤ 0.05 s and ≤ ¼", _met(v("sync_1p7b_s") <= 0.05 and v("sync_1p7b_s") <= v("sync_1p7b_per_param_s") / 4)),
        ("gen_tok_s vs gen_roofline_tok_s", f"{v('gen_tok_s'):,.0f} vs {v('gen_roofline_tok_s'):,.0f} tok/s "
         f"({v('gen_tok_s') / v('gen_roofline_tok_s'):.1%})", "≥ 40%",
         _met(v("gen_tok_s") >= 0.4 * v("gen_roofline_tok_s"))),
    ]
    beside = [("ds_offload_states_gbps / ds_reload_states_gbps (DeepSpeed, calls 2–4)",
               f"{v('ds_offload_states_gbps'):.1f} / {v('ds_reload_states_gbps'):.1f} GB/s"),
              ("ds_pinned_alloc_s (at start, overlapped with model loading)", f"{v('ds_pinned_alloc_s'):.1f} s"),
              ("vllm_sleep_s_l1 / vllm_wake_s_l1 / vllm_freed_gib_l1",
               f"{v('vllm_sleep_s_l1'):.3f} s / {v('vllm_wake_s_l1'):.3f} s / {v('vllm_freed_gib_l1'):.1f} GiB"),
              ("vllm_freed_gib_l2", f"{v('vllm_freed_gib_l2'):.1f} GiB"),
              ("sync_1p7b_s_256mb (256 MiB buckets)", f"{v('sync_1p7b_s_256mb'):.3f} s"),
              ("device copy / bf16 matmul (measured here)",
               f"{v('device_copy_gbps'):,.0f} GB/s / {v('bf16_matmul_tflops'):.0f} TFLOP/s")]
    if "h2d_pinned_gbps_1_streams" in f:  # measured since s29
        beside.append(("h2d_pinned_gbps, 1 / 4 streams (4 GB pinned host to device: ds_wake_gbps's ceiling)",
                       f"{v('h2d_pinned_gbps_1_streams'):.1f} / {v('h2d_pinned_gbps_4_streams'):.1f} GB/s"))
    if "ds_wake_gbps_after_pause" in f:  # measured since s30
        beside.append(("ds_wake_gbps_after_pause (each wake 2 s after its sleep, as in an iteration)",
                       f"{v('ds_wake_gbps_after_pause'):.1f} GB/s"))
    return rows + [(name, value, "", "") for name, value in beside]


def _met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _train_rows(f: dict) -> list[tuple[str, str, str, str]]:
    """Issue #7's targets; each row reads its figures or says they are not measured yet."""
    def row(name: str, target: str, show, judge, *needed: str):
        if not all(k in f for k in needed):
            return name, MISSING, target, "—"
        v = {k: f[k][0] for k in needed}
        return name, show(v), target, _met(judge(v))

    ratio = lambda v, key: v[f"plan_peak_gib_{key}"] / v[f"measured_peak_gib_{key}"] - 1  # noqa: E731
    within = lambda key: lambda v: abs(ratio(v, key)) <= 0.15  # noqa: E731
    peaks = lambda key: lambda v: (f"plan {v[f'plan_peak_gib_{key}']:.1f} vs measured "  # noqa: E731
                                   f"{v[f'measured_peak_gib_{key}']:.1f} GiB "
                                   f"({ratio(v, key):+.1%})")
    rows = [
        row("train_mfu_1p7b (packed, the default kernels: Liger on CUDA since s24, the head's Triton kernels since "
            "s30)", "≥ 40%",
            lambda v: f"{v['train_mfu_1p7b']:.1%}",
            lambda v: v["train_mfu_1p7b"] >= 0.4, "train_mfu_1p7b"),
        row("train_mfu_1p7b_no_ckpt (packed, no gradient checkpointing)", "≥ 40%",
            lambda v: f"{v['train_mfu_1p7b_no_ckpt']:.1%}", lambda v: v["train_mfu_1p7b_no_ckpt"] >= 0.4,
            "train_mfu_1p7b_no_ckpt"),
        row("train_mfu_4b (packed, the default kernels)", "≥ 40%", lambda v: f"{v['train_mfu_4b']:.1%}",
            lambda v: v["train_mfu_4b"] >= 0.4, "train_mfu_4b"),
        row("train_mfu_1p7b_liger (packed, --ds.use_liger_kernel)", "≥ 40%",
            lambda v: f"{v['train_mfu_1p7b_liger']:.1%}", lambda v: v["train_mfu_1p7b_liger"] >= 0.4,
            "train_mfu_1p7b_liger"),
        row("train_mfu_4b_liger (packed, --ds.use_liger_kernel)", "≥ 40%",
            lambda v: f"{v['train_mfu_4b_liger']:.1%}", lambda v: v["train_mfu_4b_liger"] >= 0.4,
            "train_mfu_4b_liger"),
        row("sync_4b_s vs sync_4b_per_param_s", "≤ 0.1 s and ≤ ¼",
            lambda v: f"{v['sync_4b_s']:.3f} s vs {v['sync_4b_per_param_s']:.3f} s",
            lambda v: v["sync_4b_s"] <= 0.1 and v["sync_4b_s"] <= v["sync_4b_per_param_s"] / 4,
            "sync_4b_s", "sync_4b_per_param_s"),
        row("plan_peak_gib vs measured_peak_gib, vLLM sets the peak", "within ±15%", peaks("vllm_peak"),
            within("vllm_peak"), "plan_peak_gib_vllm_peak", "measured_peak_gib_vllm_peak"),
        row("plan_peak_gib vs measured_peak_gib, DeepSpeed sets the peak", "within ±15%", peaks("ds_peak"),
            within("ds_peak"), "plan_peak_gib_ds_peak", "measured_peak_gib_ds_peak"),
        row("iteration_overhead_s vs iteration_wall_s", "≤ 10%",
            lambda v: f"{v['iteration_overhead_s']:.1f} s of {v['iteration_wall_s']:.1f} s "
                      f"({v['iteration_overhead_s'] / v['iteration_wall_s']:.1%})",
            lambda v: v["iteration_overhead_s"] <= 0.1 * v["iteration_wall_s"], "iteration_overhead_s",
            "iteration_wall_s"),
    ]
    padded = f"{f['train_mfu_1p7b_padded'][0]:.1%}" if "train_mfu_1p7b_padded" in f else MISSING
    stages = f.get("iteration_stage_s", (None,))[0]
    shown = ", ".join(f"{k} {v:.1f} s" for k, v in stages.items()) if stages else MISSING
    return rows + [("train_mfu_1p7b_padded (4 padded samples a micro-batch)", padded, "", ""),
                   ("iteration_stage_s (mean of steps 2–3)", shown, "", "")]


def render(figures: dict, rows=_rows, title: str = "figure (Qwen3-1.7B shape, one H200)") -> str:
    sources = sorted({source for _, source in figures.values()})
    lines = [f"| {title} | measured | target | met |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows(figures)]
    lines.append("")
    lines.append("From " + "; ".join(f"`{s}`" for s in sources) + " (raw per-trial timings and logs beside them).")
    return "\n".join(lines)


def render_train(figures: dict) -> str:
    return render(figures, _train_rows, "figure (Qwen3-1.7B and -4B shapes, one H200)")


def session_order(tag: str) -> tuple:
    """Sorts session tags by their numbers as numbers: s9 < s38 < s100, 2026-12-05 < 2026-12-11."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", tag) if part)


def _peer_sessions(results_dir: Path) -> dict[str, dict[str, tuple[dict, str]]]:
    """{TAG: {system: (its figures, "file @ git sha")}} from the h200-peers-TAG-SYSTEM.json files."""
    sessions: dict[str, dict] = {}
    for path in sorted(results_dir.glob("h200-peers-*.json")):
        found = PEER_FILE.fullmatch(path.name)
        if found:
            data = json.loads(path.read_text())
            source = f"{path.name} @ {data['meta']['git_sha'][:7]}"
            sessions.setdefault(found["tag"], {})[found["system"]] = (data["figures"], source)
    return sessions


def _walled(runs: dict[str, tuple[dict, str]]) -> set[str]:
    return {system for system, (figures, _) in runs.items() if "iteration_wall_s" in figures}


def peer_session(results_dir: Path = RESULTS) -> tuple[str | None, dict[str, tuple[dict, str]]]:
    """(the newest session TAG, {system: (its figures, "file @ git sha")}) from h200-peers-TAG-SYSTEM.json files. A
    session counts once it measured a comparison: a step wall of `hybrid train` and of a peer (one of either alone,
    or one whose `hybrid train` was cut off before its steps 2–3, compares with nothing)."""
    sessions = {tag: runs for tag, runs in _peer_sessions(results_dir).items()
                if "hybrid" in _walled(runs) and _walled(runs) - {"hybrid"}}
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
    sessions = _peer_sessions(results_dir)
    for other in sorted((t for t in sessions if session_order(t) < session_order(tag)), key=session_order):
        for system in _walled(sessions[other]) - {"hybrid"} - _walled(runs):
            earlier[system] = (*sessions[other][system], other)  # a newer session overwrites an older one
    return earlier


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
    walls = {system: figures["iteration_wall_s"] for system, (figures, _) in runs.items()
             if "iteration_wall_s" in figures}
    peers = {system: wall for system, wall in walls.items() if system != "hybrid"}
    if "hybrid" in walls and peers:
        fastest = min(peers, key=peers.get)
        speedup = peers[fastest] / walls["hybrid"]
        met = _met(speedup >= PEER_SPEEDUP_TARGET)
        verdict = f"{speedup:.2f}× the fastest peer ({SYSTEMS[fastest]}); target ≥ {PEER_SPEEDUP_TARGET}×: {met}"
    else:
        verdict = f"{MISSING} (target ≥ {PEER_SPEEDUP_TARGET}× the fastest peer)"
    lines += ["", f"Speed-up of `hybrid train`: {verdict}.", ""]
    lines += _earlier_lines(runs, earlier)
    hybrid = runs.get("hybrid", ({}, ""))[0]
    if "iteration_gen_fraction_of_roofline" in hybrid:
        fraction = hybrid["iteration_gen_fraction_of_roofline"]
        lines += ["Generation of `hybrid train` against its decode roofline, the slowest of steps 2–3: "
                  f"{fraction:.1%}; target ≥ {GEN_ROOFLINE_TARGET:.0%} in every step: "
                  f"{_met(fraction >= GEN_ROOFLINE_TARGET)}.", ""]
    if tag is None:
        lines.append("No peer session in benchmarks/results yet (`benchmarks/peers/run_peers.sh`).")
    else:
        sources = [source for _, source in runs.values()] + [source for _, source, _ in earlier.values()]
        sources = "; ".join(f"`{source}`" for source in sources)
        lines.append(f"Session `{tag}`: {sources} (each file's meta says how its system ran; logs beside them).")
    return "\n".join(lines)


def replace_block(readme: str, table: str, start: str = START, end: str = END) -> str:
    head, rest = readme.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{table}\n{end}{tail}"


def tables() -> tuple[str, str, str]:
    """(issue #6's table, issue #7's table, issue 17's peer table) from the committed results."""
    tag, runs = peer_session()
    return (render(load_figures("h200-hybrid-*.json", "h200-bench-*.json")),
            render_train(load_figures("h200-train-*.json", "h200-bench-*.json")),
            render_peers(tag, runs, earlier_peers(tag, runs)))


def readme_with_tables(readme: str) -> str:
    engines, training, peers = tables()
    readme = replace_block(replace_block(readme, engines), training, TRAIN_START, TRAIN_END)
    return replace_block(readme, peers, PEERS_START, PEERS_END)


if __name__ == "__main__":
    path = REPO_ROOT / "README.md"
    if "--write" in sys.argv:
        path.write_text(readme_with_tables(path.read_text()))
    print("\n\n".join(tables()))
