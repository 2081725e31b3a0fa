"""Every entry point refuses the same problems and keeps secrets out of what it stores: `rl_train()` in this
process refuses what `hybrid train` refuses, with the same text, before any worker; a literal W&B key given on the
command line lands in no file, database, log or Parquet metadata; `ray job submit -- hybrid train` runs against a
`ray start --head` of this install, shows the run in its logs, and `ray job stop` keeps what was committed."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import MICRO_FLAGS, micro_config
from durable_runs import events, wait_for_event
from prefect_server import free_port

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent
UNIMPLEMENTED = ["--ds.load_in_4bit", "--ds.zpg", "8", "--ckpt.max_mem", "32"]


def test_rl_train_refuses_what_hybrid_train_refuses_before_any_worker(tmp_path, tiny_model, ray_session,
                                                                       prefect_server):
    from flows.rl_train import rl_train
    from hybrid_core.plan.preflight import PreflightError

    cli = subprocess.run([sys.executable, "-m", "flows.cli", "train", *MICRO_FLAGS, "--store.root", str(tmp_path),
                          "--run_id", "refused", *UNIMPLEMENTED], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode == 2
    with pytest.raises(PreflightError) as err:
        rl_train(micro_config(tmp_path, *UNIMPLEMENTED), run_id="refused")
    assert str(err.value) == cli.stderr.strip()  # the same message, word for word
    for flag in ("--ds.load_in_4bit (set to True)", "--ds.zpg (set to 8)", "--ckpt.max_mem (set to 32.0)"):
        assert flag in str(err.value)
    assert not (tmp_path / "refused").exists()  # refused before the run directory, the lease or any worker
    assert not [a for a in ray_session.util.list_named_actors(all_namespaces=True) if "refused" in a["name"]]


SECRET = "wandb-key-0123456789abcdef-never-stored"


def _files_holding(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


def test_a_literal_wandb_key_is_stored_nowhere(tmp_path, tiny_model):
    home, ray_tmp = tmp_path / "prefect-home", Path(f"/tmp/rk-{uuid.uuid4().hex[:6]}")  # Unix sockets: short paths
    env = os.environ | {"PREFECT_HOME": str(home), "WANDB_MODE": "offline", "RAY_TMPDIR": str(ray_tmp),
                        "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "train", *MICRO_FLAGS, "--train.max_steps", "2",
                           "--store.root", str(tmp_path / "runs"), "--run_id", "keyed", "--logger.wandb.key", SECRET],
                          cwd=REPO_ROOT, capture_output=True, timeout=600, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output.decode()[-3000:]
    run_dir = tmp_path / "runs" / "keyed"
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))  # W&B ran: the key turned it on
    assert SECRET.encode() not in output
    assert _files_holding(run_dir, SECRET.encode()) == []  # datasets, manifest, config.yaml, W&B's files
    assert _files_holding(home, SECRET.encode()) == []  # the Prefect database (and its write-ahead log)
    assert (home / "prefect.db").is_file()
    assert _files_holding(ray_tmp, SECRET.encode()) == []  # Ray's session logs
    shutil.rmtree(ray_tmp, ignore_errors=True)
    for part in run_dir.glob("steps/*/*/part-*.parquet"):
        metadata = pq.read_schema(part).metadata or {}
        assert not any(SECRET.encode() in v for v in metadata.values()), part
    assert "WANDB_API_KEY" not in json.loads((run_dir / "manifest.json").read_text())["config"]["logger"]["wandb"]


def _database_files() -> list[Path]:
    """The SQLite files of the session's Prefect server (the test harness's database and its journals)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url.get_secret_value()
    database = Path(url.split(":///", 1)[1])
    return [p for p in database.parent.glob(f"{database.name}*") if p.is_file()]


def test_rl_train_refuses_a_literal_wandb_key_in_a_dict_before_prefect_stores_or_prints_it(
        tmp_path, tiny_model, ray_session, prefect_server, capfd, caplog):
    from prefect import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    from flows.rl_train import rl_train
    from hybrid_core.config import ConfigError
    from hybrid_core.plan.preflight import PreflightError

    cfg = micro_config(tmp_path).model_dump(mode="json")
    cfg["logger"]["wandb"]["key"] = SECRET
    with pytest.raises(ConfigError) as err:
        rl_train(cfg=cfg, run_id="keyed-call")
    assert str(err.value).startswith("logger.wandb.key holds an API key (39 characters, not shown): in a config "
                                     "file or a flow parameter it would be stored")
    cfg["logger"]["wandb"]["key"] = "offline"  # the same dict without the key still reaches the flow's preflight
    cfg["ds"]["load_in_4bit"] = True
    with pytest.raises(PreflightError, match=r"--ds.load_in_4bit \(set to True\)"):
        rl_train(cfg=cfg, run_id="keyed-call")
    with get_client(sync_client=True) as client:
        recent = client.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=20)
    assert recent and not [run.id for run in recent if SECRET in json.dumps(run.parameters)]
    assert recent[0].parameters["cfg"]["logger"]["wandb"]["key"] == "offline"  # the refused dict made no run
    captured = capfd.readouterr()
    assert SECRET not in captured.out + captured.err + caplog.text
    assert [str(p) for p in _database_files() if SECRET.encode() in p.read_bytes()] == []
    assert _files_holding(tmp_path, SECRET.encode()) == []


class JobHead:
    """`ray start --head` with the dashboard's job server, from this install; killed as a group at the end. Its
    jobs' `hybrid train` talk to `api_url` (the session's Prefect server)."""

    def __init__(self, tmp_path: Path, api_url: str):
        self.port, self.dashboard = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.dashboard}"
        self.temp = Path(f"/tmp/rj-{uuid.uuid4().hex[:6]}")  # Ray's Unix sockets want a short path
        self.env = os.environ | {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                                 "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
                                 "PREFECT_HOME": str(tmp_path / "prefect-home"),
                                 "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        self.env.pop("RAY_ADDRESS", None)
        self.env["PREFECT_API_URL"] = api_url
        self.proc = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--block", "--port", str(self.port), "--temp-dir", str(self.temp),
             "--num-cpus", "4", "--num-gpus", "0", "--include-dashboard=true", "--dashboard-host", "127.0.0.1",
             "--dashboard-port", str(self.dashboard), "--disable-usage-stats",
             # the job agent's HTTP port (default 52365) is taken by any other Ray of this machine, and a head whose
             # agent cannot bind answers every submission "No available agent"
             "--dashboard-agent-listen-port", str(free_port())], env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/api/version", timeout=2)
                return
            except OSError:
                time.sleep(1)
        raise RuntimeError("the Ray head's job server did not answer")

    def job(self, command: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`ray job COMMAND --address URL ARGS` (the address before ARGS: after `--` it would be the entrypoint's);
        a submission retried while the head's agent is still starting."""
        deadline = time.time() + 300  # the agent of a loaded 2-core machine took over 90 s
        while True:
            proc = subprocess.run([str(BIN / "ray"), "job", command, "--address", self.url, *args], cwd=REPO_ROOT,
                                  env=self.env, capture_output=True, text=True, timeout=timeout)
            if "No available agent" not in proc.stderr + proc.stdout or time.time() > deadline:
                return proc
            time.sleep(3)

    def state(self, job_id: str) -> str:
        """The job's status from the job server's REST API (PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED)."""
        with urllib.request.urlopen(f"{self.url}/api/jobs/{job_id}", timeout=30) as response:
            return json.loads(response.read())["status"]

    def wait(self, job_id: str, states: tuple[str, ...], timeout_s: float = 600) -> str:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if (state := self.state(job_id)) in states:
                return state
            time.sleep(2)
        raise AssertionError(f"job {job_id} did not reach {states}: {self.job('logs', job_id).stdout[-3000:]}")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        subprocess.run(["pkill", "-9", "-f", str(self.temp)], check=False)
        shutil.rmtree(self.temp, ignore_errors=True)


def test_ray_job_submit_runs_hybrid_train_and_ray_job_stop_keeps_the_committed_steps(tmp_path, tiny_model,
                                                                                    prefect_server):
    head = JobHead(tmp_path, prefect_server)
    store, run_dir = tmp_path / "runs", tmp_path / "runs" / "job-run"
    # the working dir is uploaded without what .gitignore names (the tiny model): local inputs by absolute path
    inputs = ["--actor.model_name_or_path", str(tiny_model), "--data.prompt_dataset",
              str(REPO_ROOT / "data" / "demo_prompts.jsonl"), "--reward.remote_url",
              str(REPO_ROOT / "data" / "letters_reward.py")]
    try:
        # the rollout of step 3 waits for a release file (HYBRID_FAULTS), so the job is surely running when stopped
        hold = json.dumps({"env_vars": {"HYBRID_FAULTS": "hold:3:rollout:start",
                                        "HYBRID_FAULTS_RELEASE": str(tmp_path / "go")}})
        submitted = head.job("submit", "--working-dir", ".", "--no-wait", "--submission-id", "job-1",
                             "--runtime-env-json", hold, "--", "hybrid", "train", *MICRO_FLAGS, "--train.max_steps",
                             "4", *inputs, "--store.root", str(store), "--run_id", "job-run")
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        try:
            wait_for_event(run_dir, 3, "rollout", "fault", _Running(head, "job-1"))
        except AssertionError as err:
            raise AssertionError(f"{err}: {head.job('logs', 'job-1').stdout[-3000:]}") from None
        assert head.job("stop", "job-1").returncode == 0
        assert head.wait("job-1", ("STOPPED", "FAILED")) == "STOPPED"
        (tmp_path / "go").touch()  # the stopped job's rollout worker may go on: it commits nothing out of turn
        committed = [(e["step"], e["stage"]) for e in events(run_dir) if e["event"] == "commit"]
        assert (2, "metrics") in committed
        assert "step 1/4" in head.job("logs", "job-1").stdout  # the job's logs show the run
        resumed = head.job("submit", "--working-dir", ".", "--submission-id", "job-2", "--", "hybrid", "train",
                           "--resume", str(run_dir), timeout=600)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        assert "step 4/4" in head.job("logs", "job-2").stdout
        starts = [(e["step"], e["stage"]) for e in events(run_dir) if e["event"] == "start"]
        for step, stage in committed:  # nothing committed before the stop was generated again
            if stage in ("rollout", "reward", "advantage", "metrics"):
                assert starts.count((step, stage)) == 1, (step, stage)
    finally:
        head.stop()


class _Running:
    """What `wait_for_event` polls: a submitted job, seen as a process that has not exited while it runs."""

    def __init__(self, head: JobHead, job_id: str):
        self.head, self.job_id, self.returncode = head, job_id, None

    def poll(self):
        if self.head.state(self.job_id) in ("FAILED", "STOPPED", "SUCCEEDED"):
            self.returncode = 1
        return self.returncode


@pytest.mark.parametrize("case", ["an empty dataset", "malformed JSONL", "a row without the input key",
                                  "a reward file without reward_func", "an empty model directory",
                                  "a store that is a file"])
def test_the_flow_refuses_each_bad_input_with_the_refusal_of_hybrid_train(case, tmp_path, tiny_model, ray_session,
                                                                         prefect_server):
    from flows.rl_train import rl_train
    from hybrid_core.flags import parse_cli
    from hybrid_core.plan.preflight import PreflightError
    from tests.unit.test_cli_refusals import DEMO, _cases, hybrid_train

    flags, expected = _cases(tmp_path)[case]
    rc, out, _ = hybrid_train("--store.root", str(tmp_path / "runs"), *flags)
    assert rc == 2 and expected in out
    with pytest.raises(PreflightError) as err:
        rl_train(parse_cli(["--config", DEMO, "--store.root", str(tmp_path / "runs"), *flags]), run_id="bad")
    assert str(err.value) == out.strip()  # the same refusal from the flow's first task
    assert not (tmp_path / "runs").exists()


def _children(pid: int) -> list[int]:
    table = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    return [int(child) for child, parent in zip(table[::2], table[1::2]) if int(parent) == pid]


def test_the_embedded_prefect_server_does_not_outlive_a_killed_hybrid_train(tmp_path, tiny_model):
    """`hybrid train` SIGKILLed once its embedded Prefect server is up (before any worker: the server starts
    first): the server's watchdog stops it."""
    env = os.environ | {"PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "train", *MICRO_FLAGS, "--store.root",
                             str(tmp_path / "runs"), "--run_id", "orphan"], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        servers, deadline = [], time.time() + 180
        while not servers and time.time() < deadline and proc.poll() is None:
            servers = [pid for pid in _children(proc.pid) if b"uvicorn" in _cmdline(pid)]
            time.sleep(0.2)
        assert len(servers) == 1, "no embedded Prefect server found under hybrid train"
        os.kill(proc.pid, signal.SIGKILL)  # the process alone, as the kernel's OOM killer would
        proc.wait(timeout=60)
        deadline = time.time() + 20
        while time.time() < deadline and Path(f"/proc/{servers[0]}").exists():
            time.sleep(0.2)
        assert not Path(f"/proc/{servers[0]}").exists(), "the embedded Prefect server outlived hybrid train"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # the process ended meanwhile
        return b""
