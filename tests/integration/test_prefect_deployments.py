"""Prefect operations against a real server: `prefect deploy --all`, `prefect deployment run 'rl-train/demo-cpu'
--watch` through a process worker, the UI's artifacts, and how bad parameters are refused."""
from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT

from prefect_server import PrefectServer

pytestmark = pytest.mark.integration
METRIC_KEYS = {"reward/mean", "reward/std", "advantage/mean", "advantage/std", "actor/kl", "actor/policy_loss",
               "actor/clip_ratio", "rollout/response_length_mean", "rollout/tokens_per_s", "timing_s/rollout"}


def short_cfg(store_root: Path, **override) -> dict:
    cfg = yaml.safe_load((REPO_ROOT / "data" / "demo.yaml").read_text())
    cfg["rollout"] |= {"batch_size": 2, "n_samples_per_prompt": 2, "micro_batch_size": 4}
    cfg["train"] |= {"batch_size": 4, "micro_batch_size": 2, "max_steps": 2}
    cfg["store"] = {"root": str(store_root)}
    for section, values in override.items():
        cfg[section] = cfg.get(section, {}) | values
    return cfg


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model):
    srv = PrefectServer(tmp_path_factory.mktemp("prefect-home")).start()
    try:
        assert srv.cli("work-pool", "create", "hybrid-cpu", "--type", "process").returncode == 0
        deployed = srv.run("-m", "flows.cli", "deploy")  # `hybrid deploy` = `prefect deploy --all` at the repo root
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        srv.start_worker("hybrid-cpu")
        yield srv
    finally:
        srv.stop()


def run_deployment(srv: PrefectServer, cfg: dict, run_id: str):
    params = json.dumps({"cfg": cfg, "run_id": run_id})
    return srv.cli("deployment", "run", "rl-train/demo-cpu", "--params", params, "--watch", "--watch-timeout", "900")


def read_artifacts(api_url: str, key: str) -> list[dict]:
    """Every version of the artifact `key`, oldest first, straight from the server's REST API."""
    body = json.dumps({"artifacts": {"key": {"any_": [key]}}}).encode()
    request = urllib.request.Request(f"{api_url}/artifacts/filter", data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return sorted(json.loads(response.read()), key=lambda artifact: artifact["created"])


def test_deployment_run_from_the_cli(server, tmp_path):
    result = run_deployment(server, short_cfg(tmp_path), "deployed-run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Completed" in result.stdout + result.stderr
    for step in (1, 2):
        for stage in ("rollout", "reward", "advantage", "metrics"):
            assert (tmp_path / "deployed-run" / "steps" / str(step) / stage / "_SUCCESS").is_file()
    table = read_artifacts(server.url, "rl-metrics-deployed-run")
    assert len(table) == 2  # one version of the metrics table per step
    rows = table[-1]["data"] if isinstance(table[-1]["data"], list) else json.loads(table[-1]["data"])
    assert [r["step"] for r in rows] == [1, 2] and METRIC_KEYS <= set(rows[-1])
    progress = read_artifacts(server.url, "rl-progress-deployed-run")
    assert float(progress[-1]["data"]) == 100.0 and "ETA" in progress[-1]["description"]
    assert read_artifacts(server.url, "rl-samples-deployed-run")[-1]["type"] == "markdown"


def test_schema_invalid_parameters_are_refused_before_a_run_exists(server, tmp_path):
    result = run_deployment(server, short_cfg(tmp_path, rollout={"batch_size": -1}), "bad-schema")
    assert result.returncode != 0
    assert "batch_size" in result.stdout + result.stderr
    assert not (tmp_path / "bad-schema").exists()


def test_cross_field_errors_fail_the_flow_run_with_the_message(server, tmp_path):
    cfg = short_cfg(tmp_path, train={"async_enable": True})
    result = run_deployment(server, cfg, "bad-rules")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", output).group(1)
    logs = server.cli("flow-run", "logs", flow_run_id).stdout
    assert "vllm.enable_sleep cannot be combined with train.async_enable" in logs, output + logs


def test_flow_run_retry_resumes_without_regenerating(server, tmp_path):
    """A run whose reward function raises fails; after the fix, `prefect flow-run retry` of the same flow run
    completes it, and no stage committed before the failure is generated again."""
    import time

    reward = tmp_path / "flaky_reward.py"
    good = (REPO_ROOT / "data" / "letters_reward.py").read_text()
    reward.write_text("def reward_func(queries, prompts, labels, **kwargs):\n    raise KeyError('broken until fixed')\n")
    cfg = short_cfg(tmp_path, reward={"remote_url": str(reward)}, train={"max_steps": 2, "stage_retries": 0})
    failed = run_deployment(server, cfg, "retried")
    assert failed.returncode != 0
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", failed.stdout + failed.stderr).group(1)
    reward.write_text(good)
    assert server.cli("flow-run", "retry", flow_run_id).returncode == 0
    deadline, state = time.time() + 600, ""
    while time.time() < deadline and state not in ("COMPLETED", "FAILED", "CRASHED"):
        time.sleep(2)
        state = json.loads(urllib.request.urlopen(f"{server.url}/flow_runs/{flow_run_id}", timeout=10).read())[
            "state_type"]
    assert state == "COMPLETED"
    events = [json.loads(line) for line in (tmp_path / "retried" / "events.jsonl").read_text().splitlines()]
    starts = [(e["step"], e["stage"]) for e in events if e["event"] == "start"]
    assert starts.count((1, "rollout")) == 1  # committed before the failure: replayed, not generated again
    assert (1, "rollout", "replay") in {(e["step"], e["stage"], e["event"]) for e in events}
    assert (tmp_path / "retried" / "steps" / "2" / "metrics" / "_SUCCESS").is_file()
