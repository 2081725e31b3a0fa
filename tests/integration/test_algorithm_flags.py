"""Every algorithm flag is honoured, not just accepted: each estimator runs the micro demo, and step k's committed
advantages are recomputed from the committed `reward` (+ `rollout`) datasets with the public functions alone. The
flag tests' runs double as the estimators' runs (one micro run each, shared through the session)."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import GAE_FLAGS, read_metrics, read_stage, run_micro

from hybrid_core.algorithms.advantages import (WHITENED_ESTIMATORS, compute_gae, compute_returns,
                                               place_sequence_rewards, shape_group_rewards, whiten)
from hybrid_core.algorithms.kl import kl_penalty
from hybrid_core.algorithms.penalties import overlong_penalty, stop_penalty
from hybrid_core.engines.sequence_batch import pad

pytestmark = pytest.mark.integration
ESTIMATORS = ["reinforce", "reinforce_baseline", "rloo", "group_norm", "dr_grpo", "gae"]
IS_RANGE = ("--algo.advantage.is_correction_enable", "--algo.advantage.is_correction_threshold", "1.5", "5.0")
# The flag tests' micro runs, each also the run of one estimator (the shared reference run is reinforce_baseline's):
# name → (estimator, flags). Each is trained once in the session, by the first test that reads it.
FLAG_RUNS = {
    "kl-penalties": ("reinforce", (
        "--algo.advantage.estimator", "reinforce", "--algo.kl.use_loss=false", "--algo.kl.estimator", "k1",
        "--algo.kl.init_coef", "0.5", "--algo.kl.target", "0.1", "--algo.kl.horizon", "10",
        "--reward.overlong_buffer_len", "4", "--reward.stop_properly_penalty_coef", "-0.5", "--actor.entropy_coef", "0",
        "--actor.adam.lr", "0.01", "--rollout.logprobs")),  # asked for, though nothing of this run reads them
    "is-tis": ("rloo", ("--algo.advantage.estimator", "rloo", *IS_RANGE, "--algo.advantage.is_correction_type", "tis",
                        "--train.max_steps", "2")),
    "is-icepop": ("group_norm", ("--algo.advantage.estimator", "group_norm", *IS_RANGE,
                                 "--algo.advantage.is_correction_type", "icepop", "--train.max_steps", "2")),
    "filtering": ("dr_grpo", ("--algo.advantage.estimator", "dr_grpo", "--algo.dynamic_filtering_enable",
                              "--algo.dynamic_filtering_range", "0.0", "1.0", "--train.max_steps", "2")),
    "gae": ("gae", GAE_FLAGS),
}


def expected_advantages(cfg, run_dir: str, step: int, kl_coef: float) -> torch.Tensor:
    """Advantages of step `step` rebuilt from the committed datasets (the arithmetic of inventory §3, steps 1–4)."""
    rollout, reward, adv = (read_stage(run_dir, step, s) for s in ("rollout", "reward", "advantage"))
    col = lambda table, name: table.column(name).to_pylist()  # noqa: E731
    mask = pad([[1.0] * len(r) for r in col(rollout, "response_ids")])
    rewards = torch.tensor(col(reward, "reward"))
    rw = cfg.reward
    if rw.overlong_buffer_len:
        lengths = torch.tensor([len(r) for r in col(rollout, "response_ids")])
        rewards = rewards + overlong_penalty(lengths, cfg.rollout.max_new_tokens, rw.overlong_buffer_len,
                                             rw.overlong_penalty_factor)
    if rw.stop_properly_penalty_coef is not None:
        truncated = torch.tensor([f == "length" for f in col(rollout, "finish_reason")])
        rewards = stop_penalty(rewards, truncated, rw.stop_properly_penalty_coef)
    estimator = cfg.algo.advantage.estimator
    shaped = shape_group_rewards(rewards, cfg.rollout.n_samples_per_prompt, estimator).clamp(*rw.clip_range)
    token_rewards = place_sequence_rewards(shaped, mask)
    if not cfg.algo.kl.use_loss:
        kl = kl_penalty(pad(col(adv, "old_logprobs")), pad(col(adv, "ref_logprobs")), cfg.algo.kl.estimator)
        token_rewards = token_rewards - kl_coef * kl * mask
    if estimator == "gae":
        advantages, _ = compute_gae(token_rewards, pad(col(adv, "values")), mask, cfg.algo.advantage.gamma,
                                    cfg.algo.advantage.lambd)
    else:
        advantages = compute_returns(token_rewards, mask, 1.0)
    if estimator in WHITENED_ESTIMATORS:
        advantages = whiten(advantages, mask)
    return advantages * mask


def committed_advantages(run_dir: str, step: int) -> torch.Tensor:
    return pad(read_stage(run_dir, step, "advantage").column("advantages").to_pylist())


def flag_run(shared_run, name: str):
    """The micro run `name` of FLAG_RUNS, trained once in the session; returns (cfg, run_dir)."""
    return shared_run(name, *FLAG_RUNS[name][1])


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_each_estimator_is_honoured(estimator, reference_run, shared_run):
    """Each estimator's run (the reference run for reinforce_baseline): every step's committed advantages are the
    ones the public functions give from the committed rewards."""
    if estimator == "reinforce_baseline":
        cfg, result = reference_run
        run_dir = result.run_dir
    else:
        name = next(name for name, (used, _) in FLAG_RUNS.items() if used == estimator)
        cfg, run_dir = flag_run(shared_run, name)
    assert cfg.algo.advantage.estimator == estimator
    for step in range(1, cfg.train.max_steps + 1):
        kl_coef = 0.0 if cfg.algo.kl.use_loss else read_metrics(run_dir, step)["actor/kl_coef"]  # β in the reward
        torch.testing.assert_close(committed_advantages(run_dir, step),
                                   expected_advantages(cfg, run_dir, step, kl_coef), rtol=0, atol=1e-5)
    if estimator == "gae":
        assert "critic/value_loss" in read_metrics(run_dir, cfg.train.max_steps)


def test_gae_critic_learns_over_a_10_step_demo(frozen_demo_run):
    """The demo's batch (16 prompts × 4 samples) for 10 steps with the actor held still (`--actor.adam.lr 0`, the
    session's frozen demo run), so the critic fits a fixed reward distribution: mean value loss of the last 3 steps
    below the first 3."""
    cfg, result = frozen_demo_run
    assert (cfg.actor.adam.lr, cfg.algo.advantage.estimator, result.num_steps) == (0.0, "gae", 10)
    losses = [read_metrics(result.run_dir, k)["critic/value_loss"] for k in range(1, 11)]
    assert sum(losses[-3:]) < sum(losses[:3]), losses


def test_kl_in_reward_penalties_entropy_and_adaptive_kl(shared_run):
    """The adaptive coefficient's first update; the penalties and the KL in the reward (each step with its own β)
    are checked in the advantages by test_each_estimator_is_honoured[reinforce], which reads this run."""
    _, run_dir = flag_run(shared_run, "kl-penalties")
    coefs = [read_metrics(run_dir, k)["actor/kl_coef"] for k in (1, 2)]
    # step 1: the policy is the reference, KL 0 → β ← 0.5·(1 + clip(0/0.1 − 1, ±0.2)·4/10) = 0.5·0.92 = 0.46
    assert coefs == pytest.approx([0.5, 0.46], abs=1e-9)
    entropy = read_metrics(run_dir, 1)["actor/entropy"]
    assert 0 < entropy <= math.log(128)


@pytest.mark.parametrize("run_id", ["kl-penalties", "is-tis"])
def test_the_engines_logprobs_are_committed_when_asked_for_or_read(run_id, shared_run):
    """--rollout.logprobs asks for them (kl-penalties); by default the importance-sampling correction reads them
    (is-tis). Every sampled token has its logprob; the reference run, where nothing reads them, commits null
    (test_datasets_load_with_hf_datasets)."""
    cfg, run_dir = flag_run(shared_run, run_id)
    assert cfg.asks_engine_logprobs
    for step in range(1, cfg.train.max_steps + 1):
        rollout = read_stage(run_dir, step, "rollout")
        lengths = [len(lp) for lp in rollout.column("rollout_logprobs").to_pylist()]
        assert lengths == [len(r) for r in rollout.column("response_ids").to_pylist()], step
        assert rollout.num_rows > 0 and all(math.isfinite(x) for lp in rollout.column("rollout_logprobs").to_pylist()
                                            for x in lp), step


@pytest.mark.parametrize("kind, weight_mean, masked_frac", [("tis", 1.5, 0.0), ("icepop", 0.0, 1.0)])
def test_is_correction_weights_the_loss(kind, weight_mean, masked_frac, shared_run):
    # vLLM's logprobs equal the trainer's on CPU (w ≈ 1): with the range [1.5, 5] tis clamps every weight to 1.5 and
    # icepop masks every token, so the flag's effect is exact.
    _, run_dir = flag_run(shared_run, f"is-{kind}")
    metrics = read_metrics(run_dir, 1)
    assert metrics["is/weight_mean"] == pytest.approx(weight_mean, abs=1e-6)
    assert metrics["is/masked_frac"] == pytest.approx(masked_frac, abs=1e-6)
    if kind == "icepop":
        assert metrics["actor/policy_loss"] == 0.0


def test_dynamic_filtering_keeps_only_informative_groups(shared_run):
    cfg, run_dir = flag_run(shared_run, "filtering")
    n = cfg.rollout.n_samples_per_prompt
    for step in (1, 2):
        scores = read_stage(run_dir, step, "reward").column("score").to_pylist()
        assert len(scores) % n == 0 and 0 < len(scores) <= cfg.rollout.batch_size * n
        means = [sum(scores[i:i + n]) / n for i in range(0, len(scores), n)]
        assert all(0.0 < m < 1.0 for m in means), means  # strict: all-0 and all-1 groups carry no signal
        assert 0.0 < read_metrics(run_dir, step)["filter/pass_rate"] <= 1.0


def test_packing_and_dynamic_batching_match_the_padded_run(reference_run, tmp_path, tiny_model, ray_session,
                                                           prefect_server):
    """`--ds.packing_samples` with token-budgeted micro-batches (samples here are 37–72 tokens: the forwards pack
    2–4 samples into a row of ≤ 160 tokens, the update 1–3 into ≤ 120) against the padded reference run of the
    same seed. Step 1's rollouts come from the same initial weights, so its committed reference logprobs must agree
    to 1e-5 (the actor's old logprobs are its on-policy update's own forward, not committed), and its one optimizer step over the same 4 samples (a global token mean, the boundary on the
    last micro-batch) must give the same loss and gradient norm. Later steps are not compared: Adam divides by
    √v, so last-bit differences of near-zero gradients can move weights by more than rounding."""
    _, reference = reference_run
    _, run_dir = run_micro(tmp_path, "packed-dynamic", "--ds.packing_samples", "--train.dynamic_batch_enable",
                           "--train.max_tokens_per_gpu", "120", "--rollout.max_tokens_per_gpu", "160")
    col = lambda run, stage, name: read_stage(run, 1, stage).column(name).to_pylist()  # noqa: E731
    assert col(run_dir, "rollout", "response_ids") == col(reference.run_dir, "rollout", "response_ids")
    got, expected = pad(col(run_dir, "advantage", "ref_logprobs")), pad(col(reference.run_dir, "advantage",
                                                                             "ref_logprobs"))
    assert got.shape == expected.shape and bool((expected != 0).any())
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    packed, padded = read_metrics(run_dir, 1), read_metrics(reference.run_dir, 1)
    # on-policy: the actor's old logprobs are its update's own forward, whose KL to the reference is actor/kl
    for key in ("actor/policy_loss", "actor/grad_norm", "actor/kl_loss", "actor/kl"):
        assert packed[key] == pytest.approx(padded[key], rel=1e-5, abs=1e-7), key
