"""Prefect operations against a real server: `prefect deploy --all`, `prefect deployment run 'rl-train/demo-cpu'
--watch` through a process worker, the UI's artifacts, how bad parameters and bad inputs are refused (the preflight
is the flow's first task: the same refusal as `hybrid train`, before any worker), the seed's deployment on the GPU
pool refused with its reasons, the event trigger and the schedule."""
from __future__ import annotations

import json
import re
import time
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
        for pool in ("hybrid-cpu", "hybrid-gpu"):
            assert srv.cli("work-pool", "create", pool, "--type", "process").returncode == 0
        deployed = srv.run("-m", "flows.cli", "deploy")  # `hybrid deploy` = `prefect deploy --all` at the repo root
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        srv.start_worker("hybrid-cpu")
        srv.start_worker("hybrid-gpu")  # on this CPU machine: the seed's run must be refused there
        yield srv
    finally:
        srv.stop()


def run_deployment(srv: PrefectServer, cfg: dict | None, run_id: str, name: str = "demo-cpu"):
    params = json.dumps(({"cfg": cfg} if cfg is not None else {}) | {"run_id": run_id})
    return srv.cli("deployment", "run", f"rl-train/{name}", "--params", params, "--watch", "--watch-timeout", "900")


def flow_run_logs(srv: PrefectServer, result) -> str:
    output = result.stdout + result.stderr
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", output).group(1)
    return output + srv.cli("flow-run", "logs", flow_run_id).stdout


def read_artifacts(api_url: str, key: str) -> list[dict]:
    """Every version of the artifact `key`, oldest first, straight from the server's REST API."""
    body = json.dumps({"artifacts": {"key": {"any_": [key]}}}).encode()
    request = urllib.request.Request(f"{api_url}/artifacts/filter", data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return sorted(json.loads(response.read()), key=lambda artifact: artifact["created"])


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


def test_a_failed_deployment_run_is_retried_to_completion_without_regenerating(server, tmp_path):
    """`prefect deployment run --watch` of a run whose reward function raises fails; after the fix, `prefect
    flow-run retry` of the same flow run completes it, no stage committed before the failure is generated again,
    and the UI's artifacts show the run: one metrics table version per step, the progress at 100% with an ETA, the
    samples as markdown."""
    reward = tmp_path / "flaky_reward.py"
    good = (REPO_ROOT / "data" / "letters_reward.py").read_text()
    reward.write_text("def reward_func(queries, prompts, labels, **kwargs):\n"
                      "    raise KeyError('broken until fixed')\n")
    cfg = short_cfg(tmp_path, reward={"remote_url": str(reward)}, train={"max_steps": 2, "stage_retries": 0})
    failed = run_deployment(server, cfg, "retried")
    assert failed.returncode != 0
    assert "broken until fixed" in flow_run_logs(server, failed)
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", failed.stdout + failed.stderr).group(1)
    reward.write_text(good)
    assert server.cli("flow-run", "retry", flow_run_id).returncode == 0
    # (`prefect flow-run watch` replays the first attempt's events and stops at its Failed: the state is polled)
    deadline, state = time.time() + 600, ""
    while time.time() < deadline and state not in ("COMPLETED", "FAILED", "CRASHED"):
        time.sleep(2)
        state = json.loads(urllib.request.urlopen(f"{server.url}/flow_runs/{flow_run_id}", timeout=10).read())[
            "state_type"]
    assert state == "COMPLETED", flow_run_logs(server, failed)[-3000:]
    events = [json.loads(line) for line in (tmp_path / "retried" / "events.jsonl").read_text().splitlines()]
    starts = [(e["step"], e["stage"]) for e in events if e["event"] == "start"]
    assert starts.count((1, "rollout")) == 1  # committed before the failure: replayed, not generated again
    assert (1, "rollout", "replay") in {(e["step"], e["stage"], e["event"]) for e in events}
    for step in (1, 2):
        for stage in ("rollout", "reward", "advantage", "metrics"):
            assert (tmp_path / "retried" / "steps" / str(step) / stage / "_SUCCESS").is_file()
    table = read_artifacts(server.url, "rl-metrics-retried")
    assert len(table) == 2  # one version of the metrics table per step
    rows = table[-1]["data"] if isinstance(table[-1]["data"], list) else json.loads(table[-1]["data"])
    assert [r["step"] for r in rows] == [1, 2] and METRIC_KEYS <= set(rows[-1])
    progress = read_artifacts(server.url, "rl-progress-retried")
    assert float(progress[-1]["data"]) == 100.0 and "ETA" in progress[-1]["description"]
    assert read_artifacts(server.url, "rl-samples-retried")[-1]["type"] == "markdown"


SECRET = "wandb-key-0123456789abcdef-never-stored"


def test_a_wandb_key_in_a_deployment_run_s_parameters_is_refused_before_the_server_stores_it(server, tmp_path):
    """The server checks the parameters against the flow's schema (enforce_parameter_schema, Prefect's default)
    before it stores a flow run: `logger.wandb.key` admits only 'offline', and the refusal does not repeat the key."""
    result = run_deployment(server, short_cfg(tmp_path, logger={"wandb": {"key": SECRET}}), "keyed-deployment")
    output = " ".join((result.stdout + result.stderr).split())  # the console wraps its lines
    assert result.returncode != 0
    assert "Validation failed for field 'cfg.logger.wandb.key'. Failure reason: 'offline' was expected" in output
    assert SECRET not in output
    body = json.dumps({"sort": "EXPECTED_START_TIME_DESC", "limit": 200}).encode()
    request = urllib.request.Request(f"{server.url}/flow_runs/filter", data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        runs = json.loads(response.read())
    assert [run["id"] for run in runs if SECRET in json.dumps(run["parameters"])] == []
    # the server's database (and its journals), the server's and the workers' logs
    stored = [p.name for p in server.logs.iterdir() if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert stored == [] and (server.logs / "prefect.db").is_file()
    assert not (tmp_path / "keyed-deployment").exists()


# every bad input of `hybrid train`'s refusal tests (tests/unit/test_cli_refusals.py), grouped so that one
# deployment run meets several at once (one per setting: dataset, reward file, model, store), all named in one message
BAD_INPUT_GROUPS = {
    "dataset-reward-model-store": ["an empty dataset", "a reward file with a syntax error", "an empty model directory",
                                   "a store under /proc"],
    "more-of-each": ["malformed JSONL", "a reward file without reward_func", "a store that is a file",
                     "a missing local model"],
    "a-row-without-its-input": ["a row without the input key"],
    "too-few-prompts": ["a dataset smaller than a step"],
}


def _config_with(flags: list[str]) -> dict:
    """The deployment parameter equivalent to `hybrid train --config data/demo.yaml FLAGS`."""
    from hybrid_core.flags import parse_cli

    return parse_cli(["--config", str(REPO_ROOT / "data" / "demo.yaml"), *flags]).model_dump(mode="json")


@pytest.mark.parametrize("group", list(BAD_INPUT_GROUPS))
def test_bad_inputs_fail_the_flow_run_with_the_refusal_of_hybrid_train_before_any_worker(group, server, tmp_path):
    from tests.unit.test_cli_refusals import _cases

    cases = _cases(tmp_path)
    flags = [flag for case in BAD_INPUT_GROUPS[group] for flag in cases[case][0]]
    if "--store.root" not in flags:
        flags += ["--store.root", str(tmp_path / "runs")]
    cli = server.run("-m", "flows.cli", "train", "--config", str(REPO_ROOT / "data" / "demo.yaml"), *flags,
                     "--run_id", "bad-inputs")
    assert cli.returncode == 2 and cli.stderr.startswith("hybrid train cannot start:"), cli.stderr
    for case in BAD_INPUT_GROUPS[group]:
        assert cases[case][1] in cli.stderr, case
    result = run_deployment(server, _config_with(flags), "bad-inputs")
    assert result.returncode != 0
    logs = flow_run_logs(server, result)
    for line in cli.stderr.strip().splitlines():  # the same refusal, line by line
        assert line.strip() in logs, line
    assert "start-workers" not in logs and "open-run" not in logs  # refused by the first task
    assert not (tmp_path / "runs").exists()


def test_the_seed_deployment_is_refused_on_the_gpu_pool_with_its_reasons(server, tmp_path):
    result = run_deployment(server, None, "seed-recipe", name="qwen3-4b-math-hybrid")
    assert result.returncode != 0
    logs = flow_run_logs(server, result)
    for reason in ("hybrid train cannot start:", "needs 4 GPUs"):
        assert reason in logs, reason


def _deployment(server, name: str) -> dict:
    with urllib.request.urlopen(f"{server.url}/deployments/name/rl-train/{name}", timeout=30) as response:
        return json.loads(response.read())


def test_the_schedule_is_registered_as_declared(server):
    (schedule,) = _deployment(server, "qwen3-4b-math-hybrid")["schedules"]
    assert (schedule["schedule"]["cron"], schedule["schedule"]["timezone"], schedule["active"]) == \
        ("0 2 * * *", "UTC", False)


def test_the_event_trigger_starts_the_demo(server):
    demo = _deployment(server, "demo-cpu")
    emitted = server.cli("event", "emit", "hybrid.dataset.updated", "--resource-id", "hybrid.dataset.letters")
    assert emitted.returncode == 0, emitted.stdout + emitted.stderr
    body = json.dumps({"flow_runs": {"deployment_id": {"any_": [demo["id"]]}}}).encode()
    deadline, runs = time.time() + 120, []
    while time.time() < deadline and not runs:
        request = urllib.request.Request(f"{server.url}/flow_runs/filter", data=body,
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            runs = [r for r in json.loads(response.read()) if r["parameters"].get("run_id") is None]
        time.sleep(2)
    assert runs, "the trigger started no run of demo-cpu"
    assert runs[0]["parameters"]["cfg"]["rollout"]["batch_size"] == 16  # the demo's own parameter set
    assert server.cli("flow-run", "cancel", runs[0]["id"]).returncode == 0
