"""prefect.yaml stays in step with the demo configuration and holds valid `cfg` parameters."""
from pathlib import Path

import yaml

from hybrid_core.config import RunConfig
from hybrid_core.flags import load_config_file
from tests.conftest import REPO_ROOT


def deployments() -> dict[str, dict]:
    doc = yaml.safe_load(Path(REPO_ROOT / "prefect.yaml").read_text())
    return {d["name"]: d for d in doc["deployments"]}


def test_demo_deployment_runs_the_demo_config():
    demo = deployments()["demo-cpu"]
    assert demo["entrypoint"] == "flows/rl_train.py:rl_train"
    assert demo["work_pool"]["name"] == "hybrid-cpu"
    assert demo["parameters"]["cfg"] == load_config_file(REPO_ROOT / "data" / "demo.yaml")


def test_every_deployment_cfg_validates():
    configs = {name: RunConfig.model_validate(d["parameters"]["cfg"]) for name, d in deployments().items()}
    assert configs["demo-cpu"].train.device == "cpu"


def test_qwen_deployment_is_the_seed_recipe_with_local_files():
    from test_flags import SEED_ARGV  # the spec's launch recipe, verbatim

    from hybrid_core.config import leaf_values
    from hybrid_core.flags import parse_cli
    from hybrid_core.plan import render_plan

    local = {"reward.remote_url": "data/math_reward_func.py", "data.prompt_dataset": "data/math_prompts.jsonl"}
    seed = leaf_values(parse_cli(SEED_ARGV))
    deployed = leaf_values(RunConfig.model_validate(deployments()["qwen3-4b-math-hybrid"]["parameters"]["cfg"]))
    flags = [token[2:] for token in SEED_ARGV if token.startswith("--")]
    assert {f: deployed[f] for f in flags} == {f: local.get(f, seed[f]) for f in flags}
    assert all((REPO_ROOT / path).is_file() for path in local.values())
    text = render_plan(RunConfig.model_validate(deployments()["qwen3-4b-math-hybrid"]["parameters"]["cfg"]))
    assert "needs 4 GPUs" in text and "2 vLLM engines × TP 2" in text and "sleep: vLLM on (level 1)" in text


def test_schedule_is_inactive_and_the_trigger_runs_the_demo():
    qwen, demo = deployments()["qwen3-4b-math-hybrid"], deployments()["demo-cpu"]
    assert qwen["schedules"] == [{"cron": "0 2 * * *", "timezone": "UTC", "active": False}]
    assert demo["triggers"][0]["expect"] == ["hybrid.dataset.updated"]
