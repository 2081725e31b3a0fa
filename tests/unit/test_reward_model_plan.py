"""The reward model in the plan and the preflight: its ranks in each placement (colocated, beside the critic, alone),
its memory terms, the refusals (no reward at all, a model beside a remote URL, a missing path, no value head) and
the settings its workers and the rollout worker get. No Ray is started."""
from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import pytest

from hybrid_core.flags import parse_cli
from hybrid_core.plan.memory import GIB, estimate_memory
from hybrid_core.plan.placement import make_placement
from hybrid_core.plan.run_plan import role_bundles
from hybrid_core.plan.refusals import preflight_problems
from hybrid_core.plan.report import render_plan
from hybrid_core.plan.preflight import input_problems, value_head_problems
from hybrid_core.workers.worker_args import reward_model_settings, role_ranks, rollout_args

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO = ["--config", str(REPO_ROOT / "data" / "demo.yaml")]


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rm") / "tiny-qwen3-rm"
    runpy.run_path(str(REPO_ROOT / "data" / "build_tiny_model.py"))["build_reward_model"](out)
    return out


def with_model(reward_dir: Path, *flags: str):
    return parse_cli([*DEMO, "--reward.remote_url", "none", "--reward.model_name_or_path", str(reward_dir), *flags])


def test_colocated_the_reward_model_ranks_beside_every_role(reward_dir):
    cfg = with_model(reward_dir)
    assert [g.roles for g in make_placement(cfg).groups] == [("actor", "ref", "reward", "rollout")]
    assert role_ranks(cfg) == {"actor": 1, "ref": 1, "reward": 1}
    # four roles on the one CPU bundle: 0.25 of it each
    assert role_bundles(cfg) == (1, {"actor": (0, 0.25), "ref": (0, 0.25), "reward": (0, 0.25), "rollout": (0, 0.25)})
    assert f"reward model: {reward_dir}, 1 ranks in group 1 (beside actor, ref, rollout), rewards raw" in \
        render_plan(cfg).splitlines()
    assert preflight_problems(cfg, num_gpus_found=0) == []


def test_beside_the_critic_and_alone_in_distributed_mode(reward_dir):
    split = ["--train.device", "cuda", "--ds.param_dtype", "bf16", "--train.colocate_all=false",
             "--vllm.enable_sleep=false", "--algo.advantage.estimator", "gae", "--critic.num_gpus_per_node", "2",
             "--reward.num_gpus_per_node", "2"]
    beside = with_model(reward_dir, *split, "--train.colocate_critic_reward", "--reward.normalize_enable")
    groups = [(g.roles, g.num_bundles) for g in make_placement(beside).groups]
    assert groups == [(("critic", "reward"), 2), (("actor",), 1), (("ref",), 1), (("rollout",), 1)]
    assert role_ranks(beside)["reward"] == 2
    assert (f"reward model: {reward_dir}, 2 ranks in group 1 (beside critic), rewards normalized by its config's "
            "mean/std") in render_plan(beside)
    alone = with_model(reward_dir, *split, "--reward.offload")
    assert [(g.roles, g.num_bundles) for g in make_placement(alone).groups][3] == (("reward",), 2)
    assert (f"reward model: {reward_dir}, 2 ranks in group 4 (alone), rewards raw; weights in host memory outside "
            "the reward stage") in render_plan(alone)
    assert make_placement(alone).num_gpus == 1 + 1 + 2 + 2 + 1


def test_the_memory_plan_counts_the_reward_model_where_it_sits(reward_dir):
    gpu = ["--train.device", "cuda", "--ds.param_dtype", "bf16"]
    cfg = with_model(reward_dir, *gpu)
    roles = make_placement(cfg).group_of("actor").roles
    plan = estimate_memory(cfg, 139.8, roles)
    phases = {phase.name: {term.name: term.gib for term in phase.terms} for phase in plan.phases}
    assert list(phases) == ["rollout", "reward", "experience", "train"]
    # embedding 128·128 + 2 layers of 128·128 + 2·128·64 + 128·128 (q, k, v, o: 2 heads of 64, 1 kv head) +
    # 3·128·256 (MLP) + 2·128 + 2·64 (norms) = 180,608 each, final norm 128, value head 128; 2 bytes each (bf16)
    weights = (128 * 128 + 2 * (128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 256 + 2 * 128 + 2 * 64) + 256) * 2
    assert all(p["reward model weights"] == pytest.approx(weights / GIB, abs=1e-12) for p in phases.values())
    assert "reward model forward" in phases["reward"] and "reward model forward" not in phases["experience"]
    offloaded = estimate_memory(with_model(reward_dir, *gpu, "--reward.offload"), 139.8, roles)
    held = {phase.name: [t.name for t in phase.terms if t.name.startswith("reward model")] for phase in
            offloaded.phases}
    assert held == {"rollout": [], "reward": ["reward model weights", "reward model forward"], "experience": [],
                    "train": []}
    assert any(note.startswith("reward.offload: the reward model's weights wait in host memory") for note in
               offloaded.notes)


def test_a_run_needs_a_reward_and_a_model_does_not_sit_beside_a_remote_url(reward_dir):
    neither = parse_cli([*DEMO, "--reward.remote_url", "none"])
    assert ("reward.remote_url or reward.model_name_or_path is required: got neither; give a .py file defining "
            "reward_func, reward server URLs, or a reward model directory") in preflight_problems(neither, 0)
    both = parse_cli([*DEMO, "--reward.model_name_or_path", str(reward_dir)])
    assert "reward" not in make_placement(both).groups[0].roles  # OpenRLHF: no RewardModelActor with a remote URL
    assert preflight_problems(both, 0) == [
        f"reward.model_name_or_path {str(reward_dir)!r} is never used with reward.remote_url "
        "'data/letters_reward.py': as in OpenRLHF 0.11 the remote reward (or reward function) replaces the reward "
        "model, and nothing combines the two; drop --reward.model_name_or_path, or drop --reward.remote_url to "
        "score with the model"]
    missing = with_model(reward_dir.parent / "no-such-rm")
    assert f"reward.model_name_or_path does not exist: got {str(reward_dir.parent / 'no-such-rm')!r}; give a local " \
           "HF directory holding the reward model (a backbone and a value head; `make model` builds " \
           "data/tiny-qwen3-rm)" in preflight_problems(missing, 0)


def test_the_preflight_finds_the_value_head_by_name(reward_dir, tmp_path):
    assert input_problems(with_model(reward_dir)) == []
    assert value_head_problems(str(reward_dir), "value_head") == []  # the config's value_head_prefix wins
    policy = REPO_ROOT / "data" / "tiny-qwen3"  # a causal LM: lm_head, no value head
    shutil.copytree(policy, tmp_path / "lm", ignore=shutil.ignore_patterns("BUILT_BY"))
    assert input_problems(with_model(tmp_path / "lm")) == [
        f"reward.model_name_or_path {str(tmp_path / 'lm')!r} holds no value head 'score.weight' "
        "(ds.value_head_prefix 'score'): give a reward model (a sequence-classification checkpoint with one label, "
        "or OpenRLHF's train_rm output), or name its head with --ds.value_head_prefix"]
    renamed = tmp_path / "renamed"
    shutil.copytree(reward_dir, renamed)
    config = json.loads((renamed / "config.json").read_text())
    (renamed / "config.json").write_text(json.dumps(config | {"value_head_prefix": "value_head"}))
    assert value_head_problems(str(renamed), "score") == [
        f"reward.model_name_or_path {str(renamed)!r} holds no value head 'value_head.weight' (its config.json's "
        "value_head_prefix 'value_head'): give a reward model (a sequence-classification checkpoint with one label, "
        "or OpenRLHF's train_rm output), or name its head with --ds.value_head_prefix"]


def test_workers_get_the_reward_settings_by_keyword(reward_dir):
    cfg = with_model(reward_dir, "--reward.normalize_enable", "--reward.offload")
    settings = reward_model_settings(cfg)
    assert (settings.model_path, settings.param_dtype, settings.value_head_prefix, settings.is_normalized,
            settings.is_offloaded, settings.batching.num_samples) == (str(reward_dir), "fp32", "score", True, True, 16)
    rollout = rollout_args(cfg)
    assert (rollout.reward_model_ranks, rollout.is_reward_normalized, rollout.reward.remote_url) == (1, True, None)
    assert rollout_args(parse_cli(DEMO)).reward_model_ranks == 0  # a reward function: no reward model ranks
