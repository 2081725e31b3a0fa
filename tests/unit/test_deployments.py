"""prefect.yaml and its parameter sets in deployments/: the sets stay in step with the demo and the seed's recipe,
every deployment reads its set through the build step, and the seed's recipe is refused by the preflight with its
reasons (it needs what does not exist yet)."""
from pathlib import Path

import pytest
import yaml

from flows.deploy_steps import read_parameters
from hybrid_core.config import RunConfig
from hybrid_core.flags import ConfigError, load_config_file
from tests.conftest import REPO_ROOT


def deployments() -> dict[str, dict]:
    doc = yaml.safe_load(Path(REPO_ROOT / "prefect.yaml").read_text())
    return {d["name"]: d for d in doc["deployments"]}


def parameter_set(name: str) -> dict:
    return load_config_file(REPO_ROOT / "deployments" / f"{name}.yaml")


def test_every_deployment_reads_its_parameter_set_through_the_build_step():
    for name, deployment in deployments().items():
        (step,) = deployment["build"]
        assert step == {"flows.deploy_steps.read_parameters": {"id": f"{name}-parameters",
                                                               "path": f"deployments/{name}.yaml"}}
        assert deployment["parameters"] == {"cfg": f"{{{{ {name}-parameters.cfg }}}}"}  # a lone placeholder
        assert read_parameters(f"deployments/{name}.yaml") == {"cfg": parameter_set(name)}
        RunConfig.model_validate(parameter_set(name))
    assert sorted(p.stem for p in (REPO_ROOT / "deployments").glob("*.yaml")) == sorted(deployments())
    assert not list((REPO_ROOT / "deployments").glob("*.py"))  # data only


def test_a_broken_parameter_set_fails_the_build_step_naming_the_field(tmp_path):
    (tmp_path / "bad.yaml").write_text("rollout:\n  batch_size: -1\n  bath_size: 2\n")
    with pytest.raises(ConfigError, match=r"rollout\.bath_size is not a config key.*did you mean rollout\.batch_size"):
        read_parameters(str(tmp_path / "bad.yaml"))


def test_every_deployment_runs_in_the_checkout_not_a_temporary_directory():
    # the process worker's default, a temporary directory per flow run, was once gone before a retried run's pull
    # step read its working directory
    for name, deployment in deployments().items():
        assert deployment["work_pool"]["job_variables"] == {"working_dir": "{{ $PWD }}"}, name


def test_the_demo_deployment_runs_the_demo_on_the_cpu_pool():
    demo = deployments()["demo-cpu"]
    assert (demo["entrypoint"], demo["work_pool"]["name"]) == ("flows/rl_train.py:rl_train", "hybrid-cpu")
    assert parameter_set("demo-cpu") == load_config_file(REPO_ROOT / "data" / "demo.yaml")


def test_the_seed_deployment_is_the_seed_recipe_with_local_files_on_the_gpu_pool():
    from test_flags import SEED_ARGV  # the spec's launch recipe, verbatim

    from hybrid_core.config import leaf_values
    from hybrid_core.flags import parse_cli
    from hybrid_core.plan.report import render_plan

    qwen = deployments()["qwen3-4b-math-hybrid"]
    assert qwen["work_pool"]["name"] == "hybrid-gpu"
    local = {"reward.remote_url": "data/math_reward_func.py", "data.prompt_dataset": "data/math_prompts.jsonl"}
    seed = leaf_values(parse_cli(SEED_ARGV))
    cfg = RunConfig.model_validate(parameter_set("qwen3-4b-math-hybrid"))
    deployed = leaf_values(cfg)
    flags = [token[2:] for token in SEED_ARGV if token.startswith("--")]
    assert {f: deployed[f] for f in flags} == {f: local.get(f, seed[f]) for f in flags}
    assert all((REPO_ROOT / path).is_file() for path in local.values())
    text = render_plan(cfg)
    assert "needs 4 GPUs" in text and "2 vLLM engines × TP 2" in text and "sleep: vLLM on (level 1)" in text


def test_the_seed_deployment_is_refused_by_the_preflight_with_its_reasons(tmp_path, monkeypatch):
    from hybrid_core.plan.preflight import run_problems

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub model is then needed from a cache that lacks it
    cfg = RunConfig.model_validate(parameter_set("qwen3-4b-math-hybrid") | {"store": {"root": str(tmp_path)}})
    problems = "\n".join(run_problems(cfg, str(tmp_path / "seed"), num_gpus=0, gpu_total_gib=None))
    for reason in ("actor.model_name_or_path 'Qwen/Qwen3-4B-Thinking-2507' is a Hugging "
                   "Face hub id that is not in the local cache, and HF_HUB_OFFLINE=1", "needs 4 GPUs, found 0"):
        assert reason in problems, reason
    assert "prompt_dataset" not in problems  # the shipped math prompts (320 rows) hold more than a step's 128
    assert "tensor parallelism" not in problems  # 2 engines × TP 2 on the actor's 4 GPUs


def test_the_schedule_is_inactive_and_the_trigger_runs_the_demo():
    qwen, demo = deployments()["qwen3-4b-math-hybrid"], deployments()["demo-cpu"]
    assert qwen["schedules"] == [{"cron": "0 2 * * *", "timezone": "UTC", "active": False}]
    assert demo["triggers"][0]["expect"] == ["hybrid.dataset.updated"]
    assert demo["triggers"][0]["match"] == {"prefect.resource.id": "hybrid.dataset.*"}
