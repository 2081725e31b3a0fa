"""switches: the three behaviour switches are config fields (`--ds.logprob_kernel`, `--ds.packed_attention`,
`--ds.wake_copy`) that win over their environment variables, are saved with the run, shown by `hybrid plan` and
carried to every worker in its arguments; a variable set on the driver stands in for an unset field there and on
every worker (Ray's runtime env). No Ray is started."""
from __future__ import annotations

import pytest

from hybrid_core.config import ConfigError
from hybrid_core.flags import config_to_yaml, parse_cli
from hybrid_core.plan.memory import runs_logprob_kernels
from hybrid_core.plan.report import render_plan
from hybrid_core.switches import SWITCHES, switch_value
from hybrid_core.workers import worker_args
from hybrid_core.workers.placement import role_env
from test_flags import SEED_ARGV  # the spec's launch recipe, verbatim

from tests.conftest import REPO_ROOT

FLAGS = ["--ds.logprob_kernel", "torch", "--ds.packed_attention", "flex", "--ds.wake_copy", "engine"]


@pytest.fixture(autouse=True)
def no_switch_variables(monkeypatch):
    for switch in SWITCHES.values():
        monkeypatch.delenv(switch.env, raising=False)


def test_a_set_field_wins_over_its_variable_which_wins_over_the_default(monkeypatch):
    assert switch_value("wake_copy") == "auto"
    monkeypatch.setenv("HYBRID_WAKE_COPY", "sm")
    assert switch_value("wake_copy") == "sm"
    assert switch_value("wake_copy", "engine") == "engine"
    with pytest.raises(ConfigError, match=r"ds\.wake_copy"):
        parse_cli(["--ds.wake_copy", "dma"])


def test_the_switches_are_saved_with_the_run(tmp_path):
    cfg = parse_cli(FLAGS)
    (tmp_path / "config.yaml").write_text(config_to_yaml(cfg))
    saved = parse_cli(["--config", str(tmp_path / "config.yaml")])
    assert (saved.ds.logprob_kernel, saved.ds.packed_attention, saved.ds.wake_copy) == ("torch", "flex", "engine")


def test_hybrid_plan_shows_the_switches_that_differ_from_their_defaults(monkeypatch):
    assert not any(line.startswith("switches:") for line in render_plan(parse_cli(SEED_ARGV)).splitlines())
    lines = render_plan(parse_cli([*SEED_ARGV, *FLAGS])).splitlines()
    assert "switches: ds.logprob_kernel torch, ds.packed_attention flex, ds.wake_copy engine" in lines
    monkeypatch.setenv("HYBRID_PACKED_ATTENTION", "flex")  # a variable stands in for the unset field
    assert "switches: ds.packed_attention flex" in render_plan(parse_cli(SEED_ARGV)).splitlines()


def test_the_memory_plan_reads_the_field(monkeypatch):
    monkeypatch.setattr("hybrid_core.plan.memory.triton_installed", lambda: True)
    assert runs_logprob_kernels(parse_cli(SEED_ARGV))
    assert not runs_logprob_kernels(parse_cli([*SEED_ARGV, "--ds.logprob_kernel", "torch"]))


def test_every_worker_gets_the_switches_in_its_arguments(tmp_path):
    cfg = parse_cli(["--config", str(REPO_ROOT / "data" / "demo.yaml"), "--store.root", str(tmp_path),
                     "--algo.advantage.estimator", "gae", *FLAGS])
    run = worker_args.run_ref(cfg, "r1")
    actor = worker_args.actor_args(cfg, num_steps=2, run=run, extensions_dir="/x")
    critic = worker_args.critic_args(cfg, num_steps=2, run=run, extensions_dir="/x")
    assert (actor.ds.wake_copy, critic.ds.wake_copy, actor.ds.packed_attention) == ("engine", "engine", "flex")
    for batching in (actor.train_batching, actor.experience_batching, worker_args.ref_settings(cfg).batching,
                     critic.train_batching, critic.forward_batching):
        assert (batching.logprob_kernel, batching.packed_attention) == ("torch", "flex")


def test_a_variable_set_on_the_driver_reaches_every_role_on_the_cluster(monkeypatch):
    monkeypatch.setenv("HYBRID_LOGPROB_KERNEL", "torch")
    for role in ("actor", "ref", "critic", "reward", "rollout"):
        env = role_env(role, on_cpu=False)
        assert env["HYBRID_LOGPROB_KERNEL"] == "torch" and "HYBRID_WAKE_COPY" not in env
