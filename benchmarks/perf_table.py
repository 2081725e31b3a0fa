"""The README's GPU performance table, generated from the committed benchmark results.

Reads benchmarks/results/h200-hybrid-*.json (a figure comes from the newest file that has it, by file name), checks
each target of issue #6 and prints a Markdown table; `--write` replaces the table between the README's markers.
Usage: python benchmarks/perf_table.py [--write]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"


def load_figures(pattern: str = "h200-hybrid-*.json") -> dict[str, tuple[object, str]]:
    """figure → (value, "file @ git sha"); later files (by name) override earlier ones."""
    figures = {}
    for path in sorted(RESULTS.glob(pattern)):
        data = json.loads(path.read_text())
        source = f"{path.name} @ {data['meta']['git_sha']}"
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
    return rows + [(name, value, "", "") for name, value in beside]


def _met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def render(figures: dict) -> str:
    sources = sorted({source for _, source in figures.values()})
    lines = ["| figure (Qwen3-1.7B shape, one H200) | measured | target | met |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _rows(figures)]
    lines.append("")
    lines.append("From " + "; ".join(f"`{s}`" for s in sources) + " (raw per-trial timings and logs beside them).")
    return "\n".join(lines)


def replace_block(readme: str, table: str) -> str:
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"


if __name__ == "__main__":
    table = render(load_figures())
    if "--write" in sys.argv:
        readme = REPO_ROOT / "README.md"
        readme.write_text(replace_block(readme.read_text(), table))
    print(table)
