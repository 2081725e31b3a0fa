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
