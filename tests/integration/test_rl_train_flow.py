"""The `rl-train` flow end to end on CPU (real Ray, Prefect, vLLM CPU build, DeepSpeed): the shared reference run."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.dataset as pds
import pytest

pytestmark = pytest.mark.integration

COLUMNS = {
    "rollout": {"prompt_index", "sample_index", "prompt_ids", "response_ids", "prompt_text", "response_text",
                "rollout_logprobs", "finish_reason", "label", "policy_version", "data_source"},
    "reward": {"prompt_index", "sample_index", "reward", "score", "extra_logs"},
    "advantage": {"prompt_index", "sample_index", "old_logprobs", "ref_logprobs", "advantages", "returns"},
}
METRIC_KEYS = {"reward/mean", "reward/std", "advantage/mean", "advantage/std", "actor/kl", "actor/policy_loss",
               "actor/clip_ratio", "rollout/response_length_mean", "rollout/tokens_per_s"} | \
    {f"timing_s/{s}" for s in ("rollout", "reward", "advantage", "train", "sync")}


def test_every_step_commits_its_datasets(reference_run):
    cfg, result = reference_run
    run_dir = Path(result.run_dir)
    assert result.num_steps == 3
    rows = cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt
    for step in (1, 2, 3):
        for stage, columns in COLUMNS.items():
            path = run_dir / "steps" / str(step) / stage
            assert (path / "_SUCCESS").is_file(), path
            table = pds.dataset(str(path), format="parquet").to_table()
            assert set(table.column_names) >= columns
            assert table.num_rows == rows
        metrics = pds.dataset(str(run_dir / "steps" / str(step) / "metrics"), format="parquet").to_table()
        assert metrics.num_rows == 1 and set(metrics.column_names) >= METRIC_KEYS


def test_datasets_load_with_hf_datasets(reference_run):
    import datasets

    cfg, result = reference_run
    files = sorted(str(p) for p in Path(result.run_dir).glob("steps/*/rollout/part-*.parquet"))
    ds = datasets.load_dataset("parquet", data_files=files, split="train")
    assert len(ds) == 3 * 4
    assert set(ds.unique("finish_reason")) <= {"stop", "length"}
    # nothing of this run reads the engine's logprobs (no importance-sampling correction), so none were asked for
    assert not cfg.asks_engine_logprobs and ds["rollout_logprobs"] == [None] * len(ds)
    assert set(ds.unique("data_source")) == {cfg.data.prompt_dataset}  # the dataset each prompt came from


def test_rollout_rows_follow_the_policy_version_and_sample_order(reference_run):
    _, result = reference_run
    for step in (1, 2, 3):
        table = pds.dataset(f"{result.run_dir}/steps/{step}/rollout", format="parquet").to_table()
        assert set(table.column("policy_version").to_pylist()) == {step - 1}  # step k generates with version k−1
        keys = list(zip(table.column("prompt_index").to_pylist(), table.column("sample_index").to_pylist()))
        assert [k[1] for k in keys] == [0, 1, 0, 1]  # prompt-major: a prompt's samples are contiguous
        assert all(len(r) <= 16 for r in table.column("response_ids").to_pylist())


def test_manifest_and_events_record_every_commit(reference_run):
    _, result = reference_run
    run_dir = Path(result.run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert sorted(manifest["steps"]) == ["1", "2", "3"]
    assert set(manifest["steps"]["2"]) == {"rollout", "reward", "advantage", "train", "sync", "metrics"}
    assert manifest["steps"]["3"]["sync"]["policy_version"] == 3 and manifest["steps"]["3"]["sync"]["seconds"] > 0
    for stage in ("rollout", "reward", "advantage", "metrics"):
        entry = manifest["steps"]["1"][stage]
        assert len(entry["hash"]) == 64 and entry["policy_version"] == 0
        # the sha256 of each committed file, checked before the file is ever replayed
        part = run_dir / "steps" / "1" / stage / "part-00000.parquet"
        assert entry["files"] == {"part-00000.parquet": hashlib.sha256(part.read_bytes()).hexdigest()}
    train = manifest["steps"]["2"]["train"]["metrics"]  # what the worker measured is committed with the stage
    assert {"policy_loss", "experience_kl", "timing_s/ds_wake", "timing_s/dispatch_train"} <= set(train)
    assert manifest["config"]["rollout"]["batch_size"] == 2 and manifest["run_id"] == "reference"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    stages = ("rollout", "reward", "advantage", "train", "sync", "metrics")
    commits = [(e["step"], e["stage"]) for e in events if e["event"] == "commit"]
    assert commits == [(k, s) for k in (1, 2, 3) for s in stages]
    starts = [(e["step"], e["stage"]) for e in events if e["event"] == "start"]
    assert starts == [(k, s) for k in (1, 2, 3) for s in stages]
    assert not [e for e in events if e["event"] == "replay"]


def test_the_metrics_row_is_built_from_the_committed_records(reference_run):
    """The row holds each stage's committed seconds and figures: nothing of it came from the driver's memory."""
    _, result = reference_run
    manifest = json.loads((Path(result.run_dir) / "manifest.json").read_text())
    for step in (1, 2, 3):
        entries = manifest["steps"][str(step)]
        row = pds.dataset(f"{result.run_dir}/steps/{step}/metrics", format="parquet").to_table().to_pylist()[0]
        for stage in ("rollout", "reward", "advantage", "train", "sync"):
            assert row[f"timing_s/{stage}"] == pytest.approx(entries[stage]["seconds"], rel=1e-6)
        assert row["actor/kl"] == pytest.approx(entries["train"]["metrics"]["experience_kl"], rel=1e-6, abs=1e-12)
        assert row["actor/policy_loss"] == pytest.approx(entries["train"]["metrics"]["policy_loss"], rel=1e-6,
                                                         abs=1e-12)


def test_run_actors_are_gone_after_the_run(reference_run, ray_session):
    _, result = reference_run
    names = ray_session.util.list_named_actors(all_namespaces=True)
    assert not [n for n in names if n["name"].startswith(result.run_id + "/")]


def test_advantages_match_the_public_functions(reference_run):
    """Recompute step 1's advantages from the committed reward dataset: the estimator flag is honoured."""
    import torch

    from hybrid_core.algorithms.advantages import compute_returns, place_sequence_rewards, shape_group_rewards, whiten
    from hybrid_core.engines.sequence_batch import pad

    cfg, result = reference_run
    base = f"{result.run_dir}/steps/1"
    reward = pds.dataset(f"{base}/reward", format="parquet").to_table()
    adv = pds.dataset(f"{base}/advantage", format="parquet").to_table()
    ref = adv.column("ref_logprobs").to_pylist()
    mask = pad([[1.0] * len(r) for r in ref])
    shaped = shape_group_rewards(torch.tensor(reward.column("reward").to_pylist()), 2, "reinforce_baseline")
    assert cfg.algo.kl.use_loss  # the demo puts KL in the loss: no KL term in the reward
    expected = whiten(compute_returns(place_sequence_rewards(shaped, mask), mask, 1.0), mask)
    torch.testing.assert_close(pad(adv.column("advantages").to_pylist()), expected * mask, rtol=0, atol=1e-5)
    # one optimizer step over the step's 4 samples, and the advantages do not read the actor's old logprobs: the
    # update's own forward serves as them, so the advantage stage ran no actor forward and commits none
    assert adv.column("old_logprobs").to_pylist() == [[]] * adv.num_rows
    manifest = json.loads((Path(result.run_dir) / "manifest.json").read_text())
    assert manifest["steps"]["1"]["advantage"]["metrics"]["old_logprobs_from_update"] == 1.0
    assert manifest["steps"]["1"]["train"]["metrics"]["experience_kl"] < 1e-6  # step 1: still the reference


def test_metrics_reach_tensorboard_and_offline_wandb(reference_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg, result = reference_run
    events = EventAccumulator(str(Path(cfg.logger.tensorboard_dir) / "reference"))
    events.Reload()
    first = {}  # each step's first value: a resumed copy of the reference run (test_step_contract_runs) adds more
    for event in sorted(events.Scalars("train/reward/mean"), key=lambda e: e.wall_time):
        first.setdefault(event.step, event.value)
    rewards = [first.get(k) for k in (1, 2, 3)]
    metrics = [pds.dataset(f"{result.run_dir}/steps/{k}/metrics", format="parquet").to_table()
               .column("reward/mean")[0].as_py() for k in (1, 2, 3)]
    assert rewards == pytest.approx(metrics, abs=1e-6)
    offline_runs = list((Path(result.run_dir) / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline_runs) == 1 and offline_runs[0].stat().st_size > 0


def test_hybrid_rollouts_prints_summaries_and_samples(reference_run):
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    _, result = reference_run
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "rollouts", result.run_dir, "--step", "2",
                           "--stage", "reward", "--head", "3"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == ["step 1", "step 2", "step 3"]
    assert "4 samples" in lines[0]
    assert lines[4] == "reward of step 2 (first 3 rows):" and len(lines) == 8
    assert lines[5].startswith("  prompt_index=")


def test_the_flow_run_carries_the_run_tag_and_its_task_runs_do_not(reference_run, prefect_server):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags, TaskRunFilter, TaskRunFilterTags

    with get_client(sync_client=True) as client:
        tagged = FlowRunFilter(tags=FlowRunFilterTags(all_=["run:reference"]))
        flow_runs = client.read_flow_runs(flow_run_filter=tagged)
        tagged_tasks = TaskRunFilter(tags=TaskRunFilterTags(all_=["run:reference"]))
        task_runs = client.read_task_runs(task_run_filter=tagged_tasks)
    # the reference run's completed flow run is tagged (with its copies' runs when test_step_contract_runs ran first)
    assert any(run.state.is_completed() for run in flow_runs)
    # a tagged task run asks for concurrency slots first: on the embedded server a 2 s retry after each long stage
    assert task_runs == []


def test_metrics_rows_carry_each_stages_dispatch_and_gc_seconds(reference_run):
    _, result = reference_run
    for step in (1, 2, 3):
        row = pds.dataset(f"{result.run_dir}/steps/{step}/metrics", format="parquet").to_table().to_pylist()[0]
        for stage in ("rollout", "reward", "advantage", "train", "sync"):
            assert 0.0 <= row[f"timing_s/dispatch_{stage}"] < 1.0, (step, stage)
            assert 0.0 <= row[f"timing_s/gc_{stage}"] < 1.0, (step, stage)
        # the rollout's parts: the engine's wake, its generation and its sleep, within the stage's seconds
        parts = [row[f"timing_s/{part}"] for part in ("vllm_wake", "generate", "vllm_sleep")]
        assert parts[1] > 0.0 and sum(parts) <= row["timing_s/rollout"], (step, parts)


def test_the_iteration_benchmark_judges_a_real_runs_generation(reference_run, tiny_model, monkeypatch):
    """bench_iteration's generation figure from what a run commits (its metrics rows carry no token count)."""
    import runpy

    import pyarrow.compute as pc

    _, result = reference_run
    benchmarks = Path(__file__).resolve().parents[2] / "benchmarks"
    monkeypatch.syspath_prepend(str(benchmarks))  # the scripts import their shared modules, as run_all.py does
    bench = runpy.run_path(str(benchmarks / "bench_iteration.py"))
    rows = bench["step_rows"](Path(result.run_dir))
    figures = bench["generation_vs_roofline"](Path(result.run_dir), rows, tiny_model, copy_gbps=4000.0)
    assert sorted(figures) == [1, 2, 3]
    for step, figure in figures.items():
        rollout = pds.dataset(f"{result.run_dir}/steps/{step}/rollout", format="parquet").to_table()
        responses = pc.list_value_length(rollout.column("response_ids")).to_pylist()
        prompts = pc.list_value_length(rollout.column("prompt_ids")).to_pylist()
        assert figure["tok_s"] == sum(responses) / rows[step]["timing_s/generate"]
        assert figure["mean_context"] == sum(prompts) / 4 + sum(responses) / 4 / 2
        assert figure["sequences"] == 4 and figure["fraction"] == figure["tok_s"] / figure["roofline_tok_s"]


def test_the_flow_logs_no_disassembly_of_the_prompt_loader(reference_run, prefect_server):
    """Loading the prompts hashes them with `datasets`' dill, which reads a function's globals off `dis.dis` output
    it means to capture; with the flow's print capture on in start-workers those lines went to the run's log."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags, LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        tagged = FlowRunFilter(tags=FlowRunFilterTags(all_=["run:reference"]))
        run_ids = [run.id for run in client.read_flow_runs(flow_run_filter=tagged)]
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=run_ids)))
    messages = [log.message for log in logs]
    assert any("steps 1..3 of 3" in m for m in messages)  # the flow's own printed lines still reach its log
    assert not [m for m in messages if "LOAD_GLOBAL" in m or "RESUME" in m]


def test_the_reference_forward_runs_beside_the_reward_stage(reference_run):
    """The advantage stage's reference forward starts as the reward stage begins (events.jsonl: after the rollout's
    commit, before the reward's), and the stage commits that forward's result: the frozen reference's logprobs of
    the step's committed rollout, recomputed here."""
    import torch

    from hybrid_core.engines.frozen_model import FrozenModel, load_tokenizer
    from hybrid_core.engines.sequence_batch import pad
    from hybrid_core.workers.worker_args import ref_settings

    cfg, result = reference_run
    events = [json.loads(line) for line in (Path(result.run_dir) / "events.jsonl").read_text().splitlines()]
    when = {(e["step"], e["stage"], e["event"]): e["time"] for e in events}
    reference = FrozenModel(ref_settings(cfg), load_tokenizer(cfg.actor.model_name_or_path).pad_token_id)
    for step in (1, 2, 3):
        started = when[(step, "advantage", "forwards-started")]
        assert when[(step, "rollout", "commit")] <= started <= when[(step, "reward", "commit")]
        rollout = pds.dataset(f"{result.run_dir}/steps/{step}/rollout", format="parquet").to_table()
        committed = pds.dataset(f"{result.run_dir}/steps/{step}/advantage", format="parquet").to_table()
        expected = reference.logprobs(rollout.column("prompt_ids").to_pylist(),
                                      rollout.column("response_ids").to_pylist())
        assert [len(row) for row in expected] == [len(row) for row in rollout.column("response_ids").to_pylist()]
        torch.testing.assert_close(pad(committed.column("ref_logprobs").to_pylist()), pad(expected), rtol=0,
                                   atol=1e-6)
