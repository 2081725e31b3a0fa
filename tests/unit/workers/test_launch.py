"""Unit tests for hybrid_core.workers.launch (opening a run: the configuration saved or checked, a directory with
data but no manifest refused, the lease) and hybrid_core.workers.worker_args (each role's settings, by keyword from
the configuration). No Ray is started."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybrid_core.flags import parse_cli
from hybrid_core.workers import worker_args
from hybrid_core.engines.sequence_batch import MicroBatching
from hybrid_core.workers.launch import RunDirectoryError, lease_run_dir, open_run
from hybrid_core.workers.worker_args import run_ref

REPO_ROOT = Path(__file__).resolve().parents[3]


def _cfg(root: Path, *flags: str):
    return parse_cli(["--config", str(REPO_ROOT / "data" / "demo.yaml"), "--store.root", str(root), *flags])


def test_a_new_run_saves_its_configuration_and_a_later_one_checks_it(tmp_path):
    cfg = _cfg(tmp_path)
    run = run_ref(cfg, "r1")
    assert open_run(cfg, run) is False
    manifest = json.loads((tmp_path / "r1" / "manifest.json").read_text())
    assert manifest == {"config": cfg.model_dump(mode="json"), "run_id": "r1", "steps": {}}
    assert parse_cli(["--config", str(tmp_path / "r1" / "config.yaml")]) == cfg  # the YAML reads back equal
    assert open_run(_cfg(tmp_path, "--train.max_steps", "30"), run) is True  # extending a run is allowed
    with pytest.raises(RunDirectoryError, match=r"run r1 was started with another configuration; refusing to resume: "
                                                r"rollout\.temperature: saved 1\.0, now 0\.5"):
        open_run(_cfg(tmp_path, "--rollout.temperature", "0.5"), run)


def test_data_without_a_manifest_is_refused_and_a_damaged_manifest_is_named(tmp_path):
    cfg = _cfg(tmp_path)
    (tmp_path / "r2" / "steps" / "1").mkdir(parents=True)
    (tmp_path / "r2" / "config.yaml").write_text("old: run\n")
    with pytest.raises(RunDirectoryError, match=r"r2 holds config\.yaml, steps but no manifest\.json, so it is not a "
                                                r"run that can be resumed, and it is never overwritten"):
        open_run(cfg, run_ref(cfg, "r2"))
    assert (tmp_path / "r2" / "config.yaml").read_text() == "old: run\n"
    (tmp_path / "r3").mkdir()
    (tmp_path / "r3" / "manifest.json").write_text('{"steps": {}}')  # no configuration in it
    with pytest.raises(RunDirectoryError, match=r"manifest .*r3/manifest\.json is damaged: it holds no "
                                                r"configuration"):
        open_run(cfg, run_ref(cfg, "r3"))


def test_a_resume_never_starts_a_new_run_and_the_lease_file_is_not_data(tmp_path):
    cfg = _cfg(tmp_path)
    run = run_ref(cfg, "r4")
    with lease_run_dir(run):
        with pytest.raises(RunDirectoryError, match=r"resume: no run to resume at .*r4 \(no manifest\.json\)"):
            open_run(cfg, run, must_exist=True)
        assert not (tmp_path / "r4" / "manifest.json").exists()
        assert open_run(cfg, run) is False  # the lease alone does not make the directory "data"


def test_role_settings_come_from_the_configuration(tmp_path):
    cfg = _cfg(tmp_path, "--vllm.gpu_memory_utilization", "0.2", "--train.seed", "7", "--data.max_len", "96",
               "--reward.timeout_s", "9", "--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0.1",
               "0.9", "--ds.packing_samples", "--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", "300")
    run = run_ref(cfg, "r5")
    rollout = worker_args.rollout_args(cfg)
    assert (rollout.engine.gpu_memory_utilization, rollout.engine.seed, rollout.engine.max_model_len) == (0.2, 7, 96)
    assert (rollout.sampling.n, rollout.sampling.max_new_tokens, rollout.seed) == (4, 16, 7)
    assert (rollout.reward.remote_url, rollout.reward.timeout_s, rollout.reward.max_retries) == \
        ("data/letters_reward.py", 9.0, 5)
    assert (rollout.group_filter.low, rollout.group_filter.high, rollout.num_engines) == (0.1, 0.9, 1)
    assert rollout.prompts.batch_size == 16 and rollout.prompts.max_steps == 24
    actor = worker_args.actor_args(cfg, num_steps=24, run=run, extensions_dir="/x")
    # 16 prompts × 4 samples = 64 a step, 64 per optimizer step, 1 epoch: one optimizer step per step
    assert actor.total_optimizer_steps == 24 and actor.sync_bucket_bytes == 1024 * 2**20
    assert (actor.advantage.estimator, actor.advantage.kl_coef, actor.advantage.kl_estimator) == \
        ("reinforce_baseline", 0.001, "k2")
    assert (actor.loss.kl_coef, actor.loss.clip_low, actor.loss.kl_use_loss) == (0.001, 0.2, True)
    assert actor.train_batching == MicroBatching(num_samples=16, max_tokens=300, is_packed=True)
    assert actor.experience_batching.max_tokens == 300  # rollout.max_tokens_per_gpu unset: the train budget
    assert (actor.ckpt_root, actor.sinks.wandb_dir) == (f"{run.run_dir}/ckpt", run.run_dir)
    assert actor.sync_transport == "object_store" and actor.role_ranks == (("actor", 1), ("ref", 1))
    assert worker_args.model_output_uri(cfg, run) == f"{run.run_dir}/model"


def test_optimizer_steps_and_explicit_paths():
    cfg = parse_cli(["--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "3", "--train.batch_size", "10",
                     "--train.max_epochs", "2", "--ckpt.path", "/ckpt", "--ckpt.output_dir", "/out"])
    run = run_ref(cfg, "r6")
    assert worker_args.total_optimizer_steps(cfg, num_steps=5) == 5 * 2 * 3  # 24 samples → 3 optimizer steps
    assert (worker_args.ckpt_root(cfg, run), worker_args.model_output_uri(cfg, run)) == ("/ckpt", "/out")
    assert worker_args.max_new_tokens(cfg) == 2048 // 2 and worker_args.num_engines(cfg) == 1


@pytest.mark.parametrize(("flags", "share"), [
    (("--train.colocate_all", "--vllm.enable_sleep", "--vllm.gpu_memory_utilization", "0.45"), 0.45),
    (("--train.colocate_all", "--vllm.gpu_memory_utilization", "0.45"), 0.0),  # awake engines map nothing new
])
def test_the_actor_knows_what_the_engine_beside_it_maps_when_it_wakes(flags, share):
    cfg = parse_cli(list(flags))
    assert worker_args.engine_wake_share(cfg) == share
    assert worker_args.actor_args(cfg, num_steps=2, run=run_ref(cfg, "r7"), extensions_dir="/x").engine_wake_share \
        == share
