"""The session's one run on reward servers with evaluations: the micro configuration scored by two real `hybrid
serve-reward` servers on loopback (the second killed as soon as step 1's rewards are committed), evaluated before
training and after every step, checkpointed every step and rotated to one. Its rollouts and rewards are the reference
run's (same seed; evaluations do not touch the training samples), so the remote-reward tests compare the two, and
the eval tests read its evaluations and checkpoints — one run instead of two."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.unit.rewards.reward_servers import LETTERS_REWARD, start_serve_reward, stop

RUN_ID = "served-evaluated"
EVAL_K = 2


@dataclass
class ServedRun:
    cfg: object
    result: object
    flags: list[str]
    api_url: str
    killed_at: float | None
    finished_at: float
    survivor: object
    doomed: object


def eval_file(root: Path) -> Path:
    rows = (REPO_ROOT / "data" / "demo_prompts.jsonl").read_text().splitlines(True)
    path = root / "letters_eval.jsonl"
    path.write_text("".join(rows[-3:]))
    return path


def kill_when_committed(marker: Path, proc, killed: dict, give_up_s: float = 900) -> threading.Thread:
    """Kill `proc` as soon as `marker` exists (polling in a thread); records when in `killed`."""
    def watch():
        deadline = time.monotonic() + give_up_s
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if marker.exists():
            proc.kill()
            killed["at"] = time.time()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="session")
def served_eval_run(tmp_path_factory, tiny_model, ray_session, prefect_server):
    from flows.rl_train import rl_train
    from tests.integration.conftest import micro_config

    root = tmp_path_factory.mktemp("served-eval")
    with ThreadPoolExecutor(2) as pool:
        (survivor, first_url), (doomed, second_url) = pool.map(start_serve_reward, [LETTERS_REWARD] * 2)
    killed: dict = {}
    watcher = kill_when_committed(root / RUN_ID / "steps" / "1" / "reward" / "_SUCCESS", doomed, killed)
    # batches of one sample: round-robin, both servers score step 1; later steps find the second one dead
    flags = ["--reward.remote_url", f"{first_url},{second_url}", "--reward.remote_batch_size", "1",
             "--eval.dataset", str(eval_file(root)), "--eval.steps", "1", "--eval.at_start",
             "--eval.n_samples_per_prompt", str(EVAL_K), "--eval.temperature", "1.0", "--ckpt.save_steps", "1",
             "--ckpt.max_num", "1", "--logger.tensorboard_dir", str(root / "tb")]
    try:
        cfg = micro_config(root, *flags)
        result = rl_train(cfg, run_id=RUN_ID)
        finished = time.time()
        watcher.join(timeout=5)
        yield ServedRun(cfg=cfg, result=result, flags=flags, api_url=prefect_server, killed_at=killed.get("at"),
                        finished_at=finished, survivor=survivor, doomed=doomed)
    finally:
        stop(survivor)
        stop(doomed)


def manifest_of(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "manifest.json").read_text())
