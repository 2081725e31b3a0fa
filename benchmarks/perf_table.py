"""The README's GPU performance tables, generated from the committed benchmark results (committed_results.py says
which file each figure comes from).

Four tables: issue 17's targets, each at its newest measurement (the iteration's at the newest run of the benchmark
config's default flags, the runs of other flags at the same commit named beneath); issue #6's engines
(h200-hybrid-*.json and h200-bench-*.json); issue #7's training and the whole iteration (h200-train-*.json and
h200-bench-*.json); issue 17's peers side by side, from the newest session in which `hybrid train` and a peer both
measured a step wall (same machine, back to back; a peer that session lacks shows its newest earlier run, marked as
not side by side and left out of the speed-up). Checks each target and prints Markdown tables; `--write` replaces
each table between its README markers. A figure not measured yet says so.
Usage: python benchmarks/perf_table.py [--write]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # committed_results beside this script, however it is run
from committed_results import earlier_peers, load_figures, newest_default_iteration, peer_session  # noqa: E402
from iteration_tables import MISSING, judged_row, met, render_peers, render_targets  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
TRAIN_START, TRAIN_END = "<!-- train-table:start -->", "<!-- train-table:end -->"
PEERS_START, PEERS_END = "<!-- peers-table:start -->", "<!-- peers-table:end -->"
TARGETS_START, TARGETS_END = "<!-- targets-table:start -->", "<!-- targets-table:end -->"


def _rows(f: dict) -> list[tuple[str, str, str, str]]:
    """(figure, measured, target, met) for every target, then the figures beside them."""
    v = lambda name: f[name][0]  # noqa: E731
    rows = [
        ("ds_sleep_gbps / ds_wake_gbps (slowest of 4 calls)", f"{v('ds_sleep_gbps'):.1f} / {v('ds_wake_gbps'):.1f} GB/s",
         "≥ 45 / ≥ 45", met(v("ds_sleep_gbps") >= 45 and v("ds_wake_gbps") >= 45)),
        ("ds_first_sleep_s vs ds_offload_states_first_s", f"{v('ds_first_sleep_s'):.2f} s vs "
         f"{v('ds_offload_states_first_s'):.2f} s", "≤ 1/10",
         met(v("ds_first_sleep_s") <= v("ds_offload_states_first_s") / 10)),
        ("vllm_sleep_s_l2 + vllm_wake_s_l2", f"{v('vllm_sleep_s_l2'):.3f} + {v('vllm_wake_s_l2'):.3f} s", "≤ 0.5 s",
         met(v("vllm_sleep_s_l2") + v("vllm_wake_s_l2") <= 0.5)),
        ("sync_1p7b_s vs sync_1p7b_per_param_s", f"{v('sync_1p7b_s'):.3f} s vs {v('sync_1p7b_per_param_s'):.3f} s",
         "≤ 0.05 s and ≤ ¼", met(v("sync_1p7b_s") <= 0.05 and v("sync_1p7b_s") <= v("sync_1p7b_per_param_s") / 4)),
        ("gen_tok_s vs gen_roofline_tok_s", f"{v('gen_tok_s'):,.0f} vs {v('gen_roofline_tok_s'):,.0f} tok/s "
         f"({v('gen_tok_s') / v('gen_roofline_tok_s'):.1%})", "≥ 40%",
         met(v("gen_tok_s") >= 0.4 * v("gen_roofline_tok_s"))),
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


def _train_rows(f: dict) -> list[tuple[str, str, str, str]]:
    """Issue #7's targets; each row reads its figures or says they are not measured yet."""
    def row(name: str, target: str, show, judge, *needed: str):
        return judged_row(f, name, target, show, judge, *needed)[:4]  # the table names its files once, beneath

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
        row("iteration_overhead_s vs iteration_wall_s (issue #7's runs; issue 17's newest is above)", "≤ 10%",
            lambda v: f"{v['iteration_overhead_s']:.1f} s of {v['iteration_wall_s']:.1f} s "
                      f"({v['iteration_overhead_s'] / v['iteration_wall_s']:.1%})",
            lambda v: v["iteration_overhead_s"] <= 0.1 * v["iteration_wall_s"], "iteration_overhead_s",
            "iteration_wall_s"),
    ]
    padded = f"{f['train_mfu_1p7b_padded'][0]:.1%}" if "train_mfu_1p7b_padded" in f else MISSING
    stages = f.get("iteration_stage_s", (None,))[0]
    shown = ", ".join(f"{k} {v:.1f} s" for k, v in stages.items()) if stages else MISSING
    return rows + [("train_mfu_1p7b_padded (4 padded samples a micro-batch)", padded, "", ""),
                   ("iteration_stage_s (mean of steps 2–3, issue #7's runs)", shown, "", "")]


def render(figures: dict, rows=_rows, title: str = "figure (Qwen3-1.7B shape, one H200)") -> str:
    sources = sorted({source for _, source in figures.values()})
    lines = [f"| {title} | measured | target | met |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows(figures)]
    lines.append("")
    lines.append("From " + "; ".join(f"`{s}`" for s in sources) + " (raw per-trial timings and logs beside them).")
    return "\n".join(lines)


def render_train(figures: dict) -> str:
    return render(figures, _train_rows, "figure (Qwen3-1.7B and -4B shapes, one H200)")


def replace_block(readme: str, table: str, start: str = START, end: str = END) -> str:
    head, rest = readme.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{table}\n{end}{tail}"


def tables() -> tuple[str, str, str, str]:
    """(issue 17's targets, issue #6's table, issue #7's table, issue 17's peer table) from the committed results."""
    tag, runs = peer_session()
    iteration, variants = newest_default_iteration()
    targets = render_targets(iteration, variants, load_figures("h200-train-*.json", "h200-hybrid-*.json",
                                                               "h200-bench-*.json"), tag, runs)
    return (targets, render(load_figures("h200-hybrid-*.json", "h200-bench-*.json")),
            render_train(load_figures("h200-train-*.json", "h200-bench-*.json")),
            render_peers(tag, runs, earlier_peers(tag, runs)))


def readme_with_tables(readme: str) -> str:
    targets, engines, training, peers = tables()
    readme = replace_block(readme, targets, TARGETS_START, TARGETS_END)
    readme = replace_block(replace_block(readme, engines), training, TRAIN_START, TRAIN_END)
    return replace_block(readme, peers, PEERS_START, PEERS_END)


if __name__ == "__main__":
    path = REPO_ROOT / "README.md"
    if "--write" in sys.argv:
        path.write_text(readme_with_tables(path.read_text()))
    print("\n\n".join(tables()))
