"""Two data-parallel ranks of every role (actor, reference replicas, vLLM engines and the gae critic) on CPU against
the shared one-rank run of the same micro configuration: `rl-train` through real Ray, Prefect, vLLM's CPU build and
DeepSpeed (gloo). Per-prompt seeds make the two engines generate what the one did; the ranks' sharded forwards and
data-parallel updates must then give the one rank's logprobs, values, advantages and training figures."""
from __future__ import annotations

import pytest

from tests.integration.conftest import GAE_FLAGS, TWO_RANK_GAE_FLAGS, read_metrics, read_stage

pytestmark = pytest.mark.integration
TRAIN_FIGURES = ("actor/policy_loss", "actor/kl", "actor/grad_norm", "advantage/mean", "advantage/std",
                 "reward/mean")


def by_sample(table, column: str) -> dict:
    keys = zip(table.column("prompt_index").to_pylist(), table.column("sample_index").to_pylist())
    return dict(zip(keys, table.column(column).to_pylist()))


@pytest.fixture(scope="module")
def two_rank_gae_run(shared_run):
    """The shared one-rank gae run and the same run with two ranks of every role: (one-rank run_dir, (cfg, two-rank
    run_dir))."""
    _, one = shared_run("gae", *GAE_FLAGS)
    return one, shared_run("gae-two", *TWO_RANK_GAE_FLAGS)


def test_two_ranks_train_like_one(two_rank_gae_run):
    """Step 1 starts from the same weights: everything agrees to float rounding. Step 2 starts from weights updated
    by Adam, whose first steps move each weight by about ±lr whatever the gradient's size, so a gradient summed in
    another order may flip a near-zero one: its logprobs agree to 5e-3 and figures to 1%."""
    one, (cfg, two) = two_rank_gae_run
    assert cfg.actor_world_size == 2 and cfg.vllm.num_engines == 2 and "critic" in cfg.roles
    for step, (logprob_atol, figure_rel) in zip((1, 2), ((1e-5, 1e-4), (5e-3, 1e-2))):
        rollout_one, rollout_two = read_stage(one, step, "rollout"), read_stage(two, step, "rollout")
        assert by_sample(rollout_two, "response_ids") == by_sample(rollout_one, "response_ids"), step
        adv_one, adv_two = read_stage(one, step, "advantage"), read_stage(two, step, "advantage")
        for column in ("ref_logprobs", "advantages"):  # old logprobs: the on-policy update's own (in actor/kl)
            a, b = by_sample(adv_two, column), by_sample(adv_one, column)
            for key in b:
                assert a[key] == pytest.approx(b[key], rel=0, abs=logprob_atol), (step, column, key)
        metrics_one, metrics_two = read_metrics(one, step), read_metrics(two, step)
        for name in TRAIN_FIGURES:
            assert metrics_two[name] == pytest.approx(metrics_one[name], rel=figure_rel, abs=1e-7), (step, name)


def test_two_critic_ranks_train_like_one(two_rank_gae_run):
    """gae: the critic's ranks shard the value forwards and split its updates like the actor's."""
    one, (_, two) = two_rank_gae_run
    values_one, values_two = (by_sample(read_stage(run, 1, "advantage"), "values") for run in (one, two))
    for key in values_one:
        assert values_two[key] == pytest.approx(values_one[key], rel=0, abs=1e-5), key
    metrics_one, metrics_two = read_metrics(one, 1), read_metrics(two, 1)
    for name in ("critic/value_loss", "critic/grad_norm", *TRAIN_FIGURES):
        assert metrics_two[name] == pytest.approx(metrics_one[name], rel=1e-4, abs=1e-7), name
