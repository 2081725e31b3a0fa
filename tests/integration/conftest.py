"""Session fixtures for integration tests: ONE local Ray instance, ONE Prefect server, the tiny model, and one
shared reference run of the micro configuration (2 prompts × 2 samples × 16 tokens) that many tests read.

Real components only: Ray on CPU, Prefect's test server, vLLM's CPU build and DeepSpeed on CPU.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.integration.served_eval_run import served_eval_run  # noqa: F401  (a session fixture)

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.pop("RAY_ADDRESS", None)  # never attach to a cluster a developer left running

MICRO_FLAGS = [
    "--config", str(REPO_ROOT / "data" / "demo.yaml"),
    "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "16",
    "--rollout.micro_batch_size", "4", "--train.batch_size", "4", "--train.micro_batch_size", "2",
    "--train.max_steps", "3",
]


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    path = REPO_ROOT / "data" / "tiny-qwen3"
    if not (path / "config.json").is_file():
        sys_path_builder = REPO_ROOT / "data" / "build_tiny_model.py"
        import runpy

        runpy.run_path(str(sys_path_builder))["build"](path)
    return path


@pytest.fixture(scope="session")
def tiny_reward_model() -> Path:
    """data/tiny-qwen3-rm (`make model`), built when missing: the tiny policy's shape with a value head."""
    path = REPO_ROOT / "data" / "tiny-qwen3-rm"
    if not (path / "config.json").is_file():
        import runpy

        runpy.run_path(str(REPO_ROOT / "data" / "build_tiny_model.py"))["build_reward_model"](path)
    return path


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from hybrid_core.workers import placement

    placement.connect(num_cpus=4)
    yield ray
    leftovers = ray.util.list_named_actors(all_namespaces=True)
    ray.shutdown()
    assert not leftovers, f"actors left alive at the end of the session: {leftovers}"


@pytest.fixture(scope="session")
def prefect_server():
    """The session's one Prefect server (Prefect's test harness); yields its API URL, which subprocesses of the
    tests (`hybrid train`, `ray job submit`) are pointed at too."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


def micro_config(store_root: Path, *extra: str):
    from hybrid_core.flags import parse_cli

    return parse_cli([*MICRO_FLAGS, "--store.root", str(store_root), *extra])


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, tiny_model, ray_session, prefect_server):
    """The micro configuration trained for 3 steps through the real `rl-train` flow; returns (cfg, result)."""
    from flows.rl_train import rl_train

    root = tmp_path_factory.mktemp("runs")
    cfg = micro_config(root, "--logger.tensorboard_dir", str(root / "tb"), "--logger.wandb.key", "offline")
    result = rl_train(cfg, run_id="reference")
    return cfg, result


# The demo's control (`--actor.adam.lr 0`: the policy never moves) for 10 steps, its advantages from a gae critic:
# test_demo_learns reads its rewards (no gain without learning), test_algorithm_flags its value losses (the critic
# fits a fixed reward distribution). A still policy's rollouts do not depend on the estimator, so the rewards are
# those of the demo's own control (reinforce_baseline, lr 0): one run instead of two.
FROZEN_DEMO_FLAGS = ("--train.max_steps", "10", "--actor.adam.lr", "0", "--algo.advantage.estimator", "gae",
                     "--critic.adam.lr", "0.001", "--critic.lr_scheduler", "constant")


@pytest.fixture(scope="session")
def frozen_demo_run(tmp_path_factory, tiny_model, ray_session, prefect_server):
    """data/demo.yaml with FROZEN_DEMO_FLAGS through the real flow; returns (cfg, result)."""
    from flows.rl_train import rl_train
    from hybrid_core.flags import parse_cli

    root = tmp_path_factory.mktemp("frozen-demo")
    cfg = parse_cli(["--config", str(REPO_ROOT / "data" / "demo.yaml"), "--store.root", str(root),
                     *FROZEN_DEMO_FLAGS])
    return cfg, rl_train(cfg, run_id="demo-frozen")


GAE_FLAGS = ("--algo.advantage.estimator", "gae", "--train.max_steps", "2")
# the two-rank runs partition the weights (ZeRO-3: forwards, sync and export gather them from every rank) and keep
# the reference's weights in host memory, against the one-rank run's ZeRO-2
ZERO3_OFFLOADED_REF = ("--ds.zero_stage", "3", "--ref.offload")
# two ranks of every role on one node: test_data_parallel_run.py, and the one-node side of test_multinode_run.py
TWO_RANK_GAE_FLAGS = (*GAE_FLAGS, "--actor.num_gpus_per_node", "2", "--ref.num_gpus_per_node", "2",
                      "--critic.num_gpus_per_node", "2", "--vllm.num_engines", "2", *ZERO3_OFFLOADED_REF)


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory, tiny_model, ray_session, prefect_server):
    """`shared_run(run_id, *flags)`: the micro configuration with `flags`, trained once in the session (the first
    test that asks trains it) and read by every test that names it; returns (cfg, run_dir)."""
    root = tmp_path_factory.mktemp("shared-runs")
    trained: dict[str, tuple[tuple[str, ...], tuple]] = {}

    def get(run_id: str, *flags: str):
        if run_id not in trained:
            trained[run_id] = (flags, run_micro(root, run_id, *flags))
        assert trained[run_id][0] == flags, f"the shared run {run_id!r} was trained with other flags"
        return trained[run_id][1]

    return get


def run_micro(store_root: Path, run_id: str, *flags: str):
    """Train the micro configuration through the real flow; returns (cfg, run_dir)."""
    from flows.rl_train import rl_train

    cfg = micro_config(store_root, *flags)
    return cfg, rl_train(cfg, run_id=run_id).run_dir


def read_stage(run_dir: str, step: int, stage: str):
    import pyarrow.dataset as pds

    return pds.dataset(f"{run_dir}/steps/{step}/{stage}", format="parquet").to_table()


def read_metrics(run_dir: str, step: int) -> dict:
    return read_stage(run_dir, step, "metrics").to_pylist()[0]
