"""Unit tests for hybrid_core.step_contract: the stage table, retries, the version rule, the seeds, and which steps
are complete (where a run resumes, whether live workers are kept, which checkpoint is restored)."""
from __future__ import annotations

import hashlib

import pytest

from hybrid_core.step_contract import (CHECKPOINT, STEP_STAGES, LiveVersions, batch_submitted_after_sync,
                                       can_reattach, consumable_versions, derive_seed, evaluated_version,
                                       first_incomplete_step, generating_version, is_checkpoint_due, is_eval_due,
                                       missing_parts, reattach_trained_step, reattach_version, restore_step,
                                       retry_policy, rollout_version, stage_named, stages_after, staleness)

DATASETS = {"rollout", "reward", "advantage", "metrics"}


def _complete(step: int, checkpoint: bool = False) -> dict:
    entries = {stage.name: {"seconds": 1.0} for stage in STEP_STAGES}
    return entries | ({"checkpoint": {"tag": f"global_step{step}", "kept": True}} if checkpoint else {})


def test_the_stage_table_in_order_with_its_roles_and_methods():
    assert [(s.name, s.role, s.method) for s in STEP_STAGES] == [
        ("rollout", "rollout", "generate"), ("reward", "rollout", "score"), ("advantage", "actor", "make_experience"),
        ("train", "actor", "train"), ("sync", "actor", "sync"), ("metrics", "actor", "write_metrics")]
    assert {s.name for s in STEP_STAGES if s.is_dataset} == DATASETS
    assert stage_named("checkpoint") is CHECKPOINT
    with pytest.raises(ValueError, match=r"stage must be one of .*: got 'judge'"):
        stage_named("judge")
    assert stages_after("reward") == ("advantage", "train", "sync", "eval", "metrics", "checkpoint")
    assert stages_after("checkpoint") == ()


def test_retries_follow_the_settings_and_train_never_retries():
    for stage in STEP_STAGES:
        policy = retry_policy(stage, stage_retries=3, retry_delay_s=0.5)
        assert (policy.retries, policy.delay_s) == ((0, 0.5) if stage.name == "train" else (3, 0.5)), stage.name


def test_the_version_rule_and_checkpoint_steps():
    assert [generating_version(k) for k in (1, 2, 7)] == [0, 1, 6]
    assert [k for k in range(1, 10) if is_checkpoint_due(k, 3)] == [3, 6, 9]
    assert not any(is_checkpoint_due(k, s) for k in range(1, 10) for s in (-1, 0))


def test_the_async_version_range_and_schedule():
    # sync mode (Q 0): batch k is k - 1's and nothing else is consumable
    assert [rollout_version(k) for k in (1, 2, 7)] == [0, 1, 6]
    assert [list(consumable_versions(k)) for k in (1, 2, 7)] == [[0], [1], [6]]
    # Q 2: batches 1-3 from the initial weights, then k - 3; a step may consume its scheduled version up to k - 1
    assert [rollout_version(k, 2) for k in range(1, 8)] == [0, 0, 0, 1, 2, 3, 4]
    assert [list(consumable_versions(k, 2)) for k in (1, 3, 4, 7)] == [[0], [0, 1, 2], [1, 2, 3], [4, 5, 6]]
    assert [staleness(k, rollout_version(k, 2)) for k in range(1, 8)] == [0, 1, 2, 2, 2, 2, 2]
    # the batch version k generates starts after step k's sync: k + Q + 1, whose scheduled version is k
    assert [batch_submitted_after_sync(k, 1) for k in (1, 5)] == [3, 7]
    assert all(rollout_version(batch_submitted_after_sync(k, q), q) == k for k in range(1, 9) for q in (1, 2, 3))


def test_the_oversampling_schedule_generates_one_step_less_ahead():
    # Q 2: batches 1-2 from the initial weights, then k - 2, so batch k's groups are at most Q - 1 = 1 stale at k
    assert [rollout_version(k, 2, is_oversampling=True) for k in range(1, 8)] == [0, 0, 1, 2, 3, 4, 5]
    assert [staleness(k, rollout_version(k, 2, True)) for k in range(1, 8)] == [0, 1, 1, 1, 1, 1, 1]
    # its surplus, trained at step k + 1, is at most Q = 2 stale there: inside the range every step may consume
    assert [staleness(k + 1, rollout_version(k, 2, True)) for k in range(1, 8)] == [1, 2, 2, 2, 2, 2, 2]
    assert all({rollout_version(k, q, True)} <= set(consumable_versions(k, q)) & set(consumable_versions(k + 1, q))
               for k in range(1, 12) for q in (1, 2, 3))
    # Q 1: batch k by version k - 1, the one step k trains with: nothing is generated ahead of its step's sync
    assert [rollout_version(k, 1, True) for k in range(1, 6)] == [0, 1, 2, 3, 4]
    # batch k + Q starts once step k synced (version k); step k's sync waits for batch k - 1 + Q, version k - 1's last
    assert [batch_submitted_after_sync(k, 2, True) for k in (0, 1, 5)] == [2, 3, 7]
    assert all(rollout_version(batch_submitted_after_sync(k, q, True), q, True) == k
               for k in range(1, 9) for q in (1, 2, 3))


def test_one_seed_formula_computed_independently():
    # sha256("0/1/2")[:4] = f1 90 06 05 → little-endian 0x050690f1 = 84316401 (top bit already clear): the rollout
    # seeds of (run seed, step, prompt index) are those of earlier runs
    assert derive_seed(0, 1, 2) == 84316401
    # sha256("7/3/5")[:4] = 47 9b 94 1b → 0x1b949b47 = 462723911
    assert derive_seed(7, 3, 5) == 462723911
    # sha256("1/1/0")[:4] = fe a1 d7 ff → 0xffd7a1fe = 4292321790; & 0x7fffffff → 0x7fd7a1fe = 2144838142
    assert derive_seed(1, 1, 0) == 2144838142
    digest = hashlib.sha256(b"42/3/actor-batches").digest()[:4]
    assert derive_seed(42, 3, "actor-batches") == int.from_bytes(digest, "little") & 0x7FFFFFFF
    assert len({derive_seed(42, 3, s) for s in ("actor-batches", "critic-batches", "refill")}) == 3


def test_seeds_are_stable_distinct_and_31_bit():
    triples = [(seed, step, index) for seed in (0, 1, 42) for step in range(1, 11) for index in range(50)]
    seeds = [derive_seed(*t) for t in triples]
    assert seeds == [derive_seed(*t) for t in triples]  # same inputs, same seeds (retries regenerate alike)
    assert len(set(seeds)) == len(triples)  # 1500 draws from 2^31: a collision has probability ~5e-4
    assert all(0 <= s < 2 ** 31 for s in seeds)
    # the separator keeps digit runs apart: "1/23/4" is not "12/3/4"
    assert derive_seed(1, 23, 4) != derive_seed(12, 3, 4)


def test_what_a_step_still_owes():
    never = dict(save_steps=-1, eval_steps=-1)
    every_2 = dict(save_steps=2, eval_steps=-1)
    assert missing_parts(1, {}, set(), **never) == [s.name for s in STEP_STAGES]
    assert missing_parts(2, _complete(2), DATASETS, **every_2) == ["checkpoint"]
    assert missing_parts(2, _complete(2, checkpoint=True), DATASETS, **every_2) == []
    # its _SUCCESS was deleted
    assert missing_parts(3, _complete(3), DATASETS - {"reward"}, **every_2) == ["reward"]
    rotated = _complete(2) | {"checkpoint": {"tag": "global_step2", "kept": False}}
    assert missing_parts(2, rotated, DATASETS, **every_2) == []  # a checkpoint rotated away was still taken


def test_an_evaluation_is_owed_by_every_eval_steps_th_step_before_its_metrics_row():
    assert [k for k in range(0, 9) if is_eval_due(k, 3)] == [3, 6]
    assert not any(is_eval_due(k, s) for k in range(0, 9) for s in (-1, 0))
    assert missing_parts(3, _complete(3), DATASETS, save_steps=3, eval_steps=3) == ["eval", "checkpoint"]
    evaluated = _complete(3) | {"eval": {"rows": 8}}
    assert missing_parts(3, evaluated, DATASETS, save_steps=-1, eval_steps=3) == ["eval"]  # no _SUCCESS yet
    assert missing_parts(3, evaluated, DATASETS | {"eval"}, save_steps=-1, eval_steps=3) == []
    assert missing_parts(2, _complete(2), DATASETS, save_steps=-1, eval_steps=3) == []
    assert stages_after("eval") == ("metrics", "checkpoint")
    assert stages_after("sync") == ("eval", "metrics", "checkpoint")
    assert [evaluated_version(k) for k in (0, 1, 5)] == [0, 1, 5]


def test_the_first_incomplete_step_is_where_a_run_resumes():
    steps = {"1": _complete(1), "2": _complete(2, True), "3": _complete(3), "4": _complete(4)}
    committed = {(k, s) for k in (1, 2, 3, 4) for s in DATASETS}
    assert first_incomplete_step({}, set(), save_steps=2, eval_steps=-1) == 1
    # step 4's checkpoint is due and missing
    assert first_incomplete_step(steps, committed, save_steps=2, eval_steps=-1) == 4
    assert first_incomplete_step(steps, committed, save_steps=-1, eval_steps=-1) == 5
    assert first_incomplete_step(steps, committed - {(3, "metrics")}, save_steps=2, eval_steps=-1) == 3
    assert first_incomplete_step(steps, committed, save_steps=-1, eval_steps=2) == 2  # step 2 was not evaluated


def test_live_workers_are_kept_only_at_the_version_the_resumed_step_needs():
    at = lambda v: LiveVersions(trained_step=v, policy_version=v, rollout_version=v)  # noqa: E731
    partial = {"rollout": {}, "reward": {}}
    assert reattach_version(5, partial, {"rollout", "reward"}) == 4
    assert can_reattach(at(4), 5, partial, {"rollout", "reward"})
    assert not can_reattach(at(5), 5, partial, {"rollout", "reward"})
    assert not can_reattach(None, 5, partial, {"rollout", "reward"})
    # killed after step 4's sync committed, before its metrics row: the workers already hold version 4
    synced = {s: {} for s in ("rollout", "reward", "advantage", "train", "sync")}
    datasets = {"rollout", "reward", "advantage"}
    assert reattach_version(4, synced, datasets) == 4 and can_reattach(at(4), 4, synced, datasets)
    # the step's rollout lost its marker: it must be generated again by version 3, which these workers no longer hold
    assert not can_reattach(at(4), 4, synced, {"reward", "advantage"})
    # killed during step 4's train: the actor finished it (its record is committed), the engines still hold 3
    trained_not_synced = LiveVersions(trained_step=4, policy_version=3, rollout_version=3)
    trained = {s: {} for s in ("rollout", "reward", "advantage", "train")}
    assert reattach_trained_step(4, trained, datasets) == 4 and reattach_version(4, trained, datasets) == 3
    assert can_reattach(trained_not_synced, 4, trained, datasets)
    assert not can_reattach(at(3), 4, trained, datasets)  # an actor that did not train step 4 is not the one
    # an actor that trained step 4 while no train record of it was committed is not to be trusted
    assert not can_reattach(trained_not_synced, 4, {s: {} for s in ("rollout", "reward", "advantage")}, datasets)


def test_the_restored_checkpoint_is_the_newest_kept_before_the_step():
    steps = {"2": {"checkpoint": {"kept": False}}, "4": {"checkpoint": {"kept": True}},
             "6": {"checkpoint": {"kept": True}}}
    assert restore_step(7, steps) == 6
    assert restore_step(6, steps) == 4  # step 6 is to be redone: its own checkpoint is not before it
    assert restore_step(4, steps) == 0  # checkpoint 2 was rotated away
