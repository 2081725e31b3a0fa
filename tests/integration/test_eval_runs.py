"""The eval stage in a real run (Ray, vLLM CPU, DeepSpeed CPU, the session's Prefect server; the session's
`served_eval_run`, scored by reward servers): the initial policy and every step's synced policy evaluated, each
evaluation committed as its own dataset, its figures recomputed here from those rows (and its rewards from the reward
file itself), the best checkpoint kept through rotation to one, and an evaluation whose commit was lost regenerated
identically on resume."""
from __future__ import annotations

import json
import shutil
import statistics
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.integration.conftest import micro_config, read_metrics, read_stage
from tests.integration.served_eval_run import EVAL_K as K
from tests.integration.served_eval_run import RUN_ID, manifest_of

STEPS = (0, 1, 2, 3)


@pytest.fixture(scope="module")
def eval_run(served_eval_run):
    run = served_eval_run
    return run.cfg, run.result, run.api_url


def _letters_rewards(table) -> list[float]:
    import runpy

    reward_func = runpy.run_path(str(REPO_ROOT / "data" / "letters_reward.py"))["reward_func"]
    prompts, responses = table.column("prompt_text").to_pylist(), table.column("response_text").to_pylist()
    out = reward_func([p + r for p, r in zip(prompts, responses)], prompts, table.column("label").to_pylist())
    return out["rewards"].tolist()


def _figures_by_hand(table) -> dict[str, float]:
    rows = table.to_pylist()
    groups = defaultdict(list)
    for row in rows:
        groups[row["prompt_index"]].append(row["reward"])
    assert all(len(g) == K for g in groups.values())
    return {"eval/letters_eval_pass1": statistics.fmean(r["reward"] for r in rows),
            f"eval/letters_eval_pass{K}": statistics.fmean(max(g) for g in groups.values()),
            "eval/letters_eval_response_length": statistics.fmean(len(r["response_ids"]) for r in rows),
            "eval/letters_eval_truncated": statistics.fmean(r["finish_reason"] == "length" for r in rows)}


def test_every_evaluation_is_committed_with_figures_that_match_its_rows(eval_run):
    cfg, result, _ = eval_run
    for step in STEPS:
        table = read_stage(result.run_dir, step, "eval")
        assert table.num_rows == 3 * K
        assert set(table.column("policy_version").to_pylist()) == {step}  # the policy step `step` synced
        assert set(table.column("data_source").to_pylist()) == {"letters_eval"}
        assert table.column("reward").to_pylist() == pytest.approx(_letters_rewards(table), abs=1e-6)
        row = read_metrics(result.run_dir, step)
        for key, value in _figures_by_hand(table).items():
            assert row[key] == pytest.approx(value, abs=1e-6), key
        assert row["timing_s/eval"] > 0
    assert "reward/mean" not in read_metrics(result.run_dir, 0)  # step 0 trained nothing


def test_the_figures_the_preflight_expects_are_those_the_run_gave(eval_run):
    """`ckpt.best_metric_key` is checked before the run against eval_metric_keys: here, against a real run's rows."""
    from hybrid_core.data.eval_tables import eval_metric_keys

    cfg, result, _ = eval_run
    expected = eval_metric_keys(cfg.eval.dataset.split(","), cfg.eval.n_samples_per_prompt)
    for step in STEPS:
        assert sorted(key for key in read_metrics(result.run_dir, step) if key.startswith("eval/")) == expected


def test_eval_figures_reach_tensorboard_under_eval_and_the_prefect_eval_table(eval_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg, result, api_url = eval_run
    events = EventAccumulator(str(Path(cfg.logger.tensorboard_dir) / RUN_ID))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("eval/letters_eval_pass1")]
    expected = [(k, read_metrics(result.run_dir, k)["eval/letters_eval_pass1"]) for k in STEPS]
    assert [s for s, _ in logged] == list(STEPS)
    assert [v for _, v in logged] == pytest.approx([v for _, v in expected], abs=1e-6)
    body = json.dumps({"artifacts": {"key": {"any_": [f"rl-eval-{RUN_ID}"]}}}).encode()
    request = urllib.request.Request(f"{api_url}/artifacts/filter", data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        newest = max(json.loads(response.read()), key=lambda artifact: artifact["created"])
    table = json.loads(newest["data"]) if isinstance(newest["data"], str) else newest["data"]
    assert [(r["step"], r["data_source"]) for r in table] == [(k, "letters_eval") for k in STEPS]
    assert [r["pass1"] for r in table] == pytest.approx([v for _, v in expected], abs=1e-6)


def test_the_best_checkpoint_survives_rotation_to_one(eval_run):
    cfg, result, _ = eval_run
    manifest = manifest_of(result.run_dir)
    pass1 = {k: read_metrics(result.run_dir, k)["eval/letters_eval_pass1"] for k in (1, 2, 3)}
    best = max(sorted(pass1), key=pass1.__getitem__)  # the earlier one on a tie
    records = {k: manifest["steps"][str(k)]["checkpoint"] for k in (1, 2, 3)}
    assert {k for k, r in records.items() if r["kept"]} == {best, 3}
    assert [k for k, r in records.items() if r.get("best")] == [best]
    assert {k: r["metric"] for k, r in records.items()} == pytest.approx(pass1, abs=1e-6)
    on_disk = sorted(p.name for p in (Path(result.run_dir) / "ckpt" / "_actor").glob("global_step*"))
    assert on_disk == sorted({f"global_step{best}", "global_step3"})


def test_hybrid_rollouts_shows_the_evaluations(eval_run):
    import subprocess
    import sys

    _, result, _ = eval_run
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "rollouts", result.run_dir, "--step", "0", "--stage",
                           "eval", "--head", "2"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    pass1 = {k: read_metrics(result.run_dir, k)["eval/letters_eval_pass1"] for k in STEPS}
    assert f"step 0: initial evaluation | letters_eval_pass1 {pass1[0]:.4f}\n" in proc.stdout
    assert "| kl " in proc.stdout and f"| letters_eval_pass1 {pass1[3]:.4f}\n" in proc.stdout
    assert "eval of step 0 (first 2 rows):" in proc.stdout and "data_source=letters_eval" in proc.stdout


def test_a_lost_evaluation_is_regenerated_identically_on_resume(served_eval_run):
    from flows.rl_train import rl_train

    cfg, result, flags = served_eval_run.cfg, served_eval_run.result, served_eval_run.flags
    run_dir = Path(result.run_dir)
    before = {k: read_stage(str(run_dir), k, "eval") for k in STEPS}
    rows_before = {k: read_metrics(str(run_dir), k) for k in STEPS}
    shutil.rmtree(run_dir / "steps" / "2" / "eval")
    resumed = rl_train(micro_config(Path(cfg.store.root), *flags), run_id=RUN_ID, resume=True)
    assert resumed.num_steps == 3
    for k in STEPS:
        assert read_stage(str(run_dir), k, "eval").equals(before[k]), k
        row = read_metrics(str(run_dir), k)
        assert {key: v for key, v in row.items() if not key.startswith("timing_s/")} == \
            {key: v for key, v in rows_before[k].items() if not key.startswith("timing_s/")}
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    commits = Counter((e["step"], e["stage"]) for e in events if e["event"] == "commit")
    assert commits[(2, "eval")] == 2  # regenerated, to the same rows
    assert {commits[(k, stage)] for k in (1, 2, 3) for stage in ("rollout", "reward", "advantage")} == {1}

