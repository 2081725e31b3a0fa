"""plan.run_plan: the run's one plan, its rows by hand for the seed recipe, and that a start makes it once: `hybrid
plan` and `hybrid train` build it once, and the workers' arguments are read from it without placing the roles
again. No Ray is started."""
from __future__ import annotations

import pytest

import flows.cli as cli
from hybrid_core.flags import parse_cli
from hybrid_core.plan import run_plan as run_plan_module
from hybrid_core.plan.run_plan import RoleRow, SleepModes, run_plan
from hybrid_core.workers import worker_args
from test_flags import SEED_ARGV  # the spec's launch recipe, verbatim

from tests.conftest import REPO_ROOT


@pytest.fixture
def placements(monkeypatch) -> list[int]:
    """Counts the placements made (each plan makes one, and nothing else makes any)."""
    made: list[int] = []
    make = run_plan_module.make_placement

    def counted(cfg):
        made.append(1)
        return make(cfg)
    monkeypatch.setattr(run_plan_module, "make_placement", counted)
    return made


def demo_argv(root) -> list[str]:
    return ["--config", str(REPO_ROOT / "data" / "demo.yaml"), "--store.root", str(root)]


def test_the_seed_plan_has_a_row_per_role_and_its_rings():
    # 4 GPUs shared by actor, ref and two engines of TP 2: rings of 2 over the actor's and the ref's 4 ranks
    plan = run_plan(parse_cli(SEED_ARGV))
    rings = ((0, 1), (2, 3))
    assert plan.rows == (RoleRow(role="actor", num_ranks=4, first_bundle=0, share=0.2, ring_groups=rings),
                         RoleRow(role="ref", num_ranks=4, first_bundle=0, share=0.2, ring_groups=rings),
                         RoleRow(role="rollout", num_ranks=2, first_bundle=0, share=0.2))
    assert plan.role_ranks == {"actor": 4, "ref": 4}
    assert (plan.engines.num_engines, plan.engines.tensor_parallel_size) == (2, 2)
    assert (plan.sync_transport, plan.sleep) == ("cuda_ipc", SleepModes(vllm_level=1, deepspeed=True))
    assert plan.memory is None and plan.gpu_total_gib is None  # no GPU size given: no estimate


def test_a_plan_made_for_a_gpu_holds_the_memory_estimate_or_why_not():
    plan = run_plan(parse_cli(SEED_ARGV), gpu_total_gib=139.8)
    assert plan.memory is not None and plan.memory.gpu_total_gib == 139.8
    unknown = run_plan(parse_cli([*SEED_ARGV, "--actor.model_name_or_path", "nobody/unknown-model"]), 139.8)
    assert unknown.memory is None and "nobody/unknown-model" in unknown.memory_error


def test_a_plan_places_the_roles_once(placements):
    run_plan(parse_cli(SEED_ARGV), gpu_total_gib=139.8)
    assert placements == [1]


def test_hybrid_plan_builds_the_plan_once(placements, capsys):
    assert cli.plan_command(SEED_ARGV) == 0
    assert "2 vLLM engines × TP 2" in capsys.readouterr().out
    assert placements == [1]


def test_hybrid_train_builds_the_plan_once_before_the_flow(placements, monkeypatch, tmp_path):
    started = []
    monkeypatch.chdir(REPO_ROOT)  # the demo's paths are relative to the checkout
    monkeypatch.setattr(cli, "_run_flow", lambda cfg, run_id, is_resume: started.append(run_id) or 0)
    assert cli.train_command(demo_argv(tmp_path)) == 0
    assert len(started) == 1 and placements == [1]


def test_every_workers_arguments_are_read_from_the_plan_without_placing_again(placements, tmp_path):
    cfg = parse_cli([*demo_argv(tmp_path), "--algo.advantage.estimator", "gae"])
    plan = run_plan(cfg)
    run = worker_args.run_ref(cfg, "r1")
    rollout = worker_args.rollout_args(cfg, plan=plan)
    actor = worker_args.actor_args(cfg, num_steps=2, run=run, extensions_dir="/x", plan=plan)
    critic = worker_args.critic_args(cfg, num_steps=2, run=run, extensions_dir="/x", plan=plan)
    assert placements == [1]  # the plan's own
    assert (rollout.num_engines, actor.engines, actor.sync_transport) == (1, plan.engines, "object_store")
    assert actor.role_ranks == (("actor", 1), ("ref", 1), ("critic", 1)) and critic.num_ranks == 1
