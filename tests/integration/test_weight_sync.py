"""Weight sync between the ActorWorker (DeepSpeed) and the RolloutWorker (vLLM CPU build) as real Ray actors."""
from __future__ import annotations

import contextlib

import pytest

pytestmark = pytest.mark.integration


def distinct_chars_reward(root) -> str:
    """A reward that differs between samples, so the first update has non-zero advantages."""
    reward_file = root / "distinct_chars_reward.py"
    reward_file.write_text("def reward_func(queries, prompts, labels, **kwargs):\n"
                           "    return {'rewards': [len(set(q[len(p):])) / 16 for q, p in zip(queries, prompts)]}\n")
    return str(reward_file)


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb, strict=True))


@contextlib.contextmanager
def started_workers(cfg, run_id: str):
    """The run's workers started without the flow, stopped at the end."""
    from hybrid_core.workers import launch
    from hybrid_core.workers.worker_args import run_ref

    run = run_ref(cfg, run_id)
    try:
        launch.start_workers(cfg, run)
        yield run
    finally:
        launch.stop_workers(run)


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory, tiny_model, ray_session):
    """Colocated on CPU under ZeRO-2: buckets by value through Ray's object store (ZeRO-3's gather of each bucket
    is the distributed run's; gathering and transport are independent steps of `WeightSender.send`)."""
    from conftest import micro_config

    root = tmp_path_factory.mktemp("sync")
    reward_file = distinct_chars_reward(root)
    cfg = micro_config(root, "--actor.adam.lr", "0.01", "--reward.remote_url", str(reward_file),
                       "--ds.zero_stage", "2", "--vllm.sync_bucket_mb", "1")
    with started_workers(cfg, "sync-test-zero2") as run:
        yield run


@pytest.fixture(scope="module")
def distributed_run(tmp_path_factory, tiny_model, ray_session):
    """Distributed mode on CPU: actor (ZeRO-3: each bucket gathered from its shards), reference and two rollout
    engines in bundles of their own, weights broadcast over a gloo process group to both engines."""
    import yaml
    from conftest import MICRO_FLAGS, REPO_ROOT

    from hybrid_core.flags import parse_cli
    from hybrid_core.plan.run_plan import role_bundles, sync_transport
    from hybrid_core.workers import launch
    from hybrid_core.workers.worker_args import run_ref

    root = tmp_path_factory.mktemp("distributed")
    demo = yaml.safe_load((REPO_ROOT / "data" / "demo.yaml").read_text())
    demo["train"]["colocate_all"], demo["vllm"]["enable_sleep"] = False, False
    (root / "distributed.yaml").write_text(yaml.safe_dump(demo))
    cfg = parse_cli(["--config", str(root / "distributed.yaml"), *MICRO_FLAGS[2:], "--store.root", str(root),
                     "--actor.adam.lr", "0.01", "--vllm.sync_bucket_mb", "1", "--ds.zero_stage", "3",
                     "--reward.remote_url", distinct_chars_reward(root), "--vllm.num_engines", "2"])
    assert sync_transport(cfg) == "process_group:gloo"
    # the rollout group's first bundle; engine r takes bundle 2 + r. The engines fill nodes as wide as the actor's
    # (one bundle): node 0 holds the actor's, the reference's and engine 0's bundles, a third of a CPU each
    assert role_bundles(cfg) == (4, {"actor": (0, 0.333), "ref": (1, 0.333), "rollout": (2, 0.333)})
    run = run_ref(cfg, "sync-test-distributed")
    try:
        launch.start_workers(cfg, run)
        yield run
    finally:
        launch.stop_workers(run)


def test_sync_makes_vllm_match_the_trainer(sync_run, ray_session):
    check_sync_matches(sync_run, ray_session)


def test_distributed_sync_broadcasts_over_a_process_group(distributed_run, ray_session):
    from hybrid_core.data.rollout_store import RolloutStore
    from hybrid_core.workers.placement import get_worker

    check_sync_matches(distributed_run, ray_session)
    # the step's prompts were shared out between the two engines and come back in prompt order
    rows = RolloutStore(distributed_run.run_dir).read(1, "rollout").to_pylist()
    assert [(r["prompt_index"], r["sample_index"]) for r in rows][1::2] == [(rows[0]["prompt_index"], 1),
                                                                            (rows[2]["prompt_index"], 1)]
    # the second engine got the same weights by the same broadcast
    prompt, response = [[1, 60, 20, 30, 2, 1, 40, 50]], [[17, 18, 19, 20, 21, 22, 23, 24, 25, 26]]
    actor, second = get_worker(distributed_run, "actor"), get_worker(distributed_run, "rollout", 1)
    trained = ray_session.get(actor.logprobs_of.remote(prompt, response))
    assert max_abs_diff(trained, ray_session.get(second.logprobs_of.remote(prompt, response))) <= 1e-3
    assert ray_session.get(second.info.remote())["policy_version"] == 1


def check_sync_matches(sync_run, ray) -> None:
    from hybrid_core.workers.placement import get_worker

    actor, rollout = get_worker(sync_run, "actor"), get_worker(sync_run, "rollout")
    ray.get(rollout.generate.remote(1))
    ray.get(rollout.score.remote(1))
    ray.get(actor.make_experience.remote(1))
    # a fixed prompt + response, not from the rollout, so nothing about generation is assumed
    prompt, response = [[1, 60, 20, 30, 2, 1, 40, 50]], [[17, 18, 19, 20, 21, 22, 23, 24, 25, 26]]
    before = ray.get(rollout.logprobs_of.remote(prompt, response))
    assert max_abs_diff(before, ray.get(actor.logprobs_of.remote(prompt, response))) < 1e-4  # same start
    ray.get(actor.train.remote(1))
    trained = ray.get(actor.logprobs_of.remote(prompt, response))
    stale = ray.get(rollout.logprobs_of.remote(prompt, response))
    assert max_abs_diff(trained, stale) >= 1e-2
    ray.get(actor.sync.remote(1))
    synced = ray.get(rollout.logprobs_of.remote(prompt, response))
    assert max_abs_diff(trained, synced) <= 1e-3
    assert ray.get(rollout.info.remote())["policy_version"] == 1
