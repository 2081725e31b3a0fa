"""A store on s3:// whose credentials come from a Prefect Secret block: the flow exports them to its process and
the Ray workers receive them as a constructor argument; the secret lands in no dataset, manifest or config file."""
from __future__ import annotations

import json

import pytest
from conftest import micro_config
from durable_runs import S3_ENV, MotoServer

pytestmark = pytest.mark.integration
SECRET = "s3cr3t-value-never-logged"


@pytest.fixture
def s3(monkeypatch):
    # placeholders that cannot reach the server (a dead port): only the Secret block's values can; monkeypatch
    # restores the environment after the test, whatever the flow exported
    placeholders = {"AWS_ACCESS_KEY_ID": "placeholder", "AWS_SECRET_ACCESS_KEY": "placeholder",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    for name, value in placeholders.items():
        monkeypatch.setenv(name, value)
    server = MotoServer()
    server.filesystem().mkdir("secret-bucket")
    yield server
    server.stop()


def test_credentials_from_a_secret_block(s3, tiny_model, ray_session, prefect_server):
    from prefect.blocks.system import Secret

    from flows.rl_train import rl_train

    # moto accepts any key; the secret's fields are what reaches s3fs in the flow and in every worker
    Secret(value={"aws_access_key_id": SECRET, "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
                  "region_name": "us-east-1", "endpoint_url": s3.url}).save("run-store", overwrite=True)
    cfg = micro_config("s3://secret-bucket/runs", "--train.max_steps", "2", "--store.credentials_block", "run-store")
    result = rl_train(cfg, run_id="with-secret")
    fs = s3.filesystem()
    manifest = json.loads(fs.cat_file("secret-bucket/runs/with-secret/manifest.json"))
    assert sorted(k for k, v in manifest["steps"].items() if "metrics" in v) == ["1", "2"]
    assert result.run_dir == "s3://secret-bucket/runs/with-secret"
    for path in fs.find("secret-bucket/runs/with-secret"):
        assert SECRET.encode() not in fs.cat_file(path), path
