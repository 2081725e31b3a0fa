"""`hybrid train` refuses bad inputs before anything starts: one message naming each problem, exit 2, no
traceback, in well under a second of its own (a subprocess, Python's start-up included), and nothing created."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.unit.moto_fixtures import moto_url, s3_options  # noqa: F401  (pytest fixtures)

DEMO = str(REPO_ROOT / "data" / "demo.yaml")


def hybrid_train(*args: str, env: dict | None = None) -> tuple[int, str, float]:
    started = time.perf_counter()
    base = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--config", DEMO, *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60, env=base | (env or {}))
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - started


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def _cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name → (flags, a line of the expected refusal)."""
    lines = [json.dumps({"input": f"p{i}", "label": "a"}) + "\n" for i in range(20)]
    prompts = "".join(lines)
    good_model = REPO_ROOT / "data" / "tiny-qwen3"
    return {
        "an empty dataset": (["--data.prompt_dataset", _write(tmp / "empty.jsonl", "")],
                             "empty.jsonl' has 0 rows, fewer than rollout.batch_size 16"),
        "a dataset smaller than a step": (["--data.prompt_dataset", _write(tmp / "small.jsonl", "".join(lines[:8]))],
                                          "has 8 rows, fewer than rollout.batch_size 16: lower --rollout.batch_size"),
        "malformed JSONL": (["--data.prompt_dataset", _write(tmp / "bad.jsonl", prompts + "{'input': 1}\n")],
                            "bad.jsonl line 21 is not valid JSON"),
        "a row without the input key": (
            ["--data.prompt_dataset", _write(tmp / "holes.jsonl", prompts + '{"question": "q", "label": "a"}\n')],
            "holes.jsonl line 21 has no 'input' (data.input_key): its keys are ['label', 'question']"),
        "a reward file with a syntax error": (
            ["--reward.remote_url", _write(tmp / "syntax.py", "def reward_func(queries:\n")],
            "syntax.py' has a syntax error at line 1"),
        "a reward file without reward_func": (
            ["--reward.remote_url", _write(tmp / "other.py", "def score(q):\n    return 1\n")],
            "other.py' defines no reward_func"),
        "an empty model directory": (["--actor.model_name_or_path", str((tmp / "model").mkdir() or tmp / "model")],
                                     "model' holds no config.json and no weights"),
        "a store under /proc": (["--store.root", "/proc/nope"], "store.root is not writable: got '/proc/nope'"),
        "an s3 store without a bucket": (["--store.root", "s3://"], "store.root names no bucket: got 's3://'; give "
                                         "s3://BUCKET/PREFIX, or a local directory"),
        "a store that is a file": (["--store.root", _write(tmp / "a-file", "x") + "/runs"],
                                   "a-file is a file"),
        "a missing local model": (["--actor.model_name_or_path", str(tmp / "models" / "none")],
                                  "actor.model_name_or_path does not exist: got '"),
    } | {"a good model but no prompts": (["--actor.model_name_or_path", str(good_model), "--data.prompt_dataset",
                                          str(tmp / "nowhere.jsonl")], "data.prompt_dataset does not exist"),
         "a missing eval file": (["--eval.dataset", str(tmp / "no-eval.jsonl"), "--eval.steps", "2"],
                                 "eval.dataset does not exist: got '"),
         "an eval row without the input key": (
             ["--eval.dataset", _write(tmp / "eval.jsonl", prompts + '{"q": "x"}\n'), "--eval.at_start"],
             "eval.jsonl line 21 has no 'input' (data.input_key): its keys are ['q']"),
         "an empty eval dataset": (["--eval.dataset", _write(tmp / "no-rows.jsonl", "\n"), "--eval.steps", "2"],
                                   "eval.dataset '" + str(tmp / "no-rows.jsonl") + "' has no rows: add prompts or "
                                   "remove it from --eval.dataset"),
         "an empty file in a mix": (["--data.prompt_dataset", _write(tmp / "full.jsonl", prompts) + ","
                                     + _write(tmp / "void.jsonl", ""), "--data.prompt_probs", "0.5,0.5"],
                                    "data.prompt_dataset '" + str(tmp / "void.jsonl") + "' has no rows: add prompts "
                                    "or remove it from --data.prompt_dataset"),
         "a prompt that is a number": (
             ["--data.prompt_dataset", _write(tmp / "number.jsonl", prompts + '{"input": 12, "label": "a"}\n')],
             "number.jsonl line 21 has 'input' (data.input_key) of type int, not a string: got '12'; write every prompt as "
             "a string"),
         "a prompt that is a list": (
             ["--data.prompt_dataset", _write(tmp / "list.jsonl", '{"input": ["a", "b"]}\n' + prompts)],
             "list.jsonl line 1 has 'input' (data.input_key) of type list, not a string: got \"['a', 'b']\"")}


CASES = ["an empty dataset", "a dataset smaller than a step", "malformed JSONL", "a row without the input key",
         "a reward file with a syntax error", "a reward file without reward_func", "an empty model directory",
         "a store under /proc", "an s3 store without a bucket", "a store that is a file", "a missing local model", "a good model but no prompts",
         "a missing eval file", "an eval row without the input key", "an empty eval dataset", "an empty file in a mix",
         "a prompt that is a number", "a prompt that is a list"]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_input_is_refused_at_once_naming_it(case, tmp_path):
    cases = _cases(tmp_path)
    assert sorted(cases) == sorted(CASES)
    flags, expected = cases[case]
    rc, out, seconds = hybrid_train("--store.root", str(tmp_path / "runs"), *flags)
    assert rc == 2, out
    assert out.startswith("hybrid train cannot start:\n") and expected in out, out
    assert "Traceback" not in out and seconds < 5
    assert not (tmp_path / "runs").exists()  # nothing was created: no run directory, no Prefect, no Ray


def test_a_hub_model_is_refused_offline_only_when_it_is_not_cached(tmp_path):
    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    rc, out, seconds = hybrid_train("--store.root", str(tmp_path / "runs"), "--actor.model_name_or_path",
                                    "Qwen/Qwen3-4B", env=offline)
    assert rc == 2 and seconds < 5, out
    assert "actor.model_name_or_path 'Qwen/Qwen3-4B' is a Hugging Face hub id that is not in the local cache, and " \
           "HF_HUB_OFFLINE=1 forbids downloading it" in out and "pass --actor.model_name_or_path a local model" in out
    # online, the hub id passes the preflight (a wrong store root stops the run before anything starts)
    rc, out, _ = hybrid_train("--store.root", "/proc/nope", "--actor.model_name_or_path", "Qwen/Qwen3-4B")
    assert rc == 2 and "model_name_or_path" not in out and "store.root is not writable" in out, out


def test_a_hub_dataset_is_refused_at_once_offline_or_when_the_hub_does_not_answer(tmp_path):
    """It once failed 20 s later, in the rollout worker; now the preflight finds it in well under a second."""
    from tests.unit.rewards.reward_servers import dead_url

    caches = {"HF_HOME": str(tmp_path / "hf")}
    rc, out, seconds = hybrid_train("--store.root", str(tmp_path / "runs"), "--data.prompt_dataset", "acme/math",
                                    env=caches | {"HF_HUB_OFFLINE": "1"})
    assert rc == 2 and seconds < 5, out
    assert "data.prompt_dataset 'acme/math' is a Hugging Face hub dataset that is not in the local cache, and " \
           "HF_HUB_OFFLINE=1 forbids downloading it: give a local path" in out
    dead_hub = {"HF_ENDPOINT": dead_url().removesuffix("/get_reward")}
    rc, out, seconds = hybrid_train("--store.root", str(tmp_path / "runs"), "--eval.dataset", "acme/eval",
                                    "--eval.steps", "2", env=caches | dead_hub)
    assert rc == 2 and seconds < 5, out
    assert "eval.dataset 'acme/eval' is a Hugging Face hub dataset that is not in the local cache, and the hub " \
           "cannot be reached (ConnectError: " in out
    assert not (tmp_path / "runs").exists()


def test_a_best_metric_key_the_evaluation_will_not_give_is_refused_before_the_run(tmp_path):
    """It was found only at the first checkpoint, after the steps before it had run."""
    evalset = _write(tmp_path / "gsm.jsonl", "".join(json.dumps({"input": f"q{i}", "label": "1"}) + "\n"
                                                      for i in range(4)))
    flags = ["--store.root", str(tmp_path / "runs"), "--eval.dataset", evalset, "--eval.steps", "2",
             "--eval.n_samples_per_prompt", "2", "--ckpt.save_steps", "2"]
    rc, out, seconds = hybrid_train(*flags, "--ckpt.best_metric_key", "eval/math_pass1")
    assert rc == 2 and seconds < 5, out
    assert f"ckpt.best_metric_key 'eval/math_pass1' is not a figure the evaluation of eval.dataset '{evalset}' " \
           "gives: it gives ['eval/gsm_pass1', 'eval/gsm_pass2', 'eval/gsm_response_length', 'eval/gsm_truncated', " \
           "'eval/num_samples']; pass one of them" in out
    rc, out, _ = hybrid_train(*flags, "--ckpt.best_metric_key", "eval_gsm_pass2", "--store.root", "/proc/nope")
    assert rc == 2 and "best_metric_key" not in out and "store.root is not writable" in out, out


def test_prompt_probs_that_do_not_match_the_datasets_are_refused_naming_both(tmp_path):
    a, b = (_write(tmp_path / name, "".join(json.dumps({"input": f"p{i}"}) + "\n" for i in range(20)))
            for name in ("a.jsonl", "b.jsonl"))
    rc, out, _ = hybrid_train("--store.root", str(tmp_path / "runs"), "--data.prompt_dataset", f"{a},{b}",
                              "--data.prompt_probs", "0.5,0.3,0.2")
    assert rc == 2 and "Traceback" not in out, out
    assert f"data.prompt_probs has 3 values ('0.5,0.3,0.2') but data.prompt_dataset names 2 ('{a},{b}')" in out


def test_every_problem_is_listed_in_one_message(tmp_path):
    rc, out, _ = hybrid_train("--data.input_key", "prompt", "--reward.remote_url",
                              _write(tmp_path / "r.py", "x = (\n"), "--store.root", "/proc/nope")
    assert rc == 2 and out.count("hybrid train cannot start") == 1
    assert [line.split(" ")[3] for line in out.splitlines()[1:]] == ["data.input_key", "reward.remote_url",
                                                                     "store.root"], out


def test_s3_without_credentials_is_refused_naming_the_store(moto_url, tmp_path):
    env = {"AWS_ENDPOINT_URL": moto_url, "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
    rc, out, seconds = hybrid_train("--store.root", "s3://bucket/runs", env=env)
    assert rc == 2 and "store.root is not writable: got 's3://bucket/runs' (NoCredentialsError" in out, out
    assert seconds < 15


def test_a_changed_configuration_under_an_existing_run_id_is_refused_naming_the_fields(tmp_path):
    run = tmp_path / "runs" / "r1"
    from hybrid_core.flags import parse_cli

    saved = parse_cli(["--config", DEMO, "--store.root", str(tmp_path / "runs")])
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"config": saved.model_dump(mode="json"), "run_id": "r1",
                                                   "steps": {}}))
    rc, out, _ = hybrid_train("--store.root", str(tmp_path / "runs"), "--run_id", "r1", "--rollout.temperature",
                              "0.5", "--train.max_steps", "30")
    assert rc == 2, out
    assert "run r1 was started with another configuration; refusing to resume: rollout.temperature: saved 1.0, now " \
           "0.5. Start a new --run_id" in out and "max_steps" not in out


def test_a_literal_wandb_key_in_a_config_file_is_refused_without_showing_it(tmp_path):
    config = _write(tmp_path / "c.yaml", Path(DEMO).read_text() + "logger:\n  wandb:\n    key: abcd-SECRET-1234\n")
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--config", config], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "logger.wandb.key holds an API key (16 characters, not shown)" in proc.stderr
    assert "SECRET" not in proc.stdout + proc.stderr


def test_a_reward_server_that_does_not_answer_is_refused_at_start_up(tmp_path):
    """A dead reward URL once failed ~136 s later, after 18 tries in the reward stage; the preflight's one-sample
    probe now refuses it in about reward.probe_timeout_s (10 s by default), and a server answering 500 likewise."""
    from hybrid_core.rewards.reward_func import load_reward_func
    from tests.unit.rewards.reward_servers import LETTERS_REWARD, ScriptedServer, answer_with, dead_url

    gone = dead_url()
    rc, out, seconds = hybrid_train("--store.root", str(tmp_path / "runs"), "--reward.remote_url", gone)
    assert rc == 2 and 10 <= seconds < 20, (seconds, out)
    assert out.startswith(f"hybrid train cannot start:\n  - reward.remote_url {gone} does not answer: a one-sample "
                          "probe failed for 1"), out
    assert "Connection refused; start the server (hybrid serve-reward" in out and "Traceback" not in out
    with ScriptedServer(lambda payload, n: (500, b"model not loaded")) as failing:
        rc, out, seconds = hybrid_train("--store.root", str(tmp_path / "runs"), "--reward.remote_url", failing.url,
                                        "--reward.probe_timeout_s", "2")
    assert rc == 2 and seconds < 10 and "HTTP 500 Internal Server Error: model not loaded" in out, (seconds, out)
    assert not (tmp_path / "runs").exists()
    # a server that answers passes: only the unwritable store is refused
    with ScriptedServer(answer_with(load_reward_func(str(LETTERS_REWARD)))) as good:
        rc, out, _ = hybrid_train("--store.root", "/proc/nope", "--reward.remote_url", good.url)
    assert rc == 2 and "reward.remote_url" not in out and "store.root is not writable" in out, out
    assert len(good.requests) == 1
