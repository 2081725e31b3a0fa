"""Oversampled batches composed over a real store (fake generation and scores): five steps worked by hand, where
groups are carried, trained, left over, expire and have their prompts served again first, the stream crosses into
the next episode, and a batch short of passing groups draws the shortfall and generates again."""
from __future__ import annotations

import pyarrow as pa
import pytest

from hybrid_core.data.prompts import PromptRow, PromptSampler
from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.data.stage_tables import reward_table, rollout_table, sample_keys
from hybrid_core.engines.rollout_step import GroupFilter
from hybrid_core.step_contract import rollout_version
from hybrid_core.workers.rollout_surplus import Oversampling, SurplusBatches

N_SAMPLES, QUEUE = 2, 2
# 10 rows served in episode 0 as 0 … 9, in episode 1 as 9 … 0, in episode 2 as 0 … 9 again
ORDERS = {0: list(range(10)), 1: list(range(9, -1, -1)), 2: list(range(10))}


class FixedOrders(PromptSampler):
    def episode_order(self, episode: int) -> list[int]:
        return ORDERS[episode]


def batches(tmp_path, failing: set[int], generate_batch_size: int) -> SurplusBatches:
    rows = [PromptRow(text=f"q{i}", label=f"a{i}", source="") for i in range(10)]
    sampler = FixedOrders(rows, 3, 1, seed=0, is_oversampling=True)
    settings = Oversampling(batch_size=3, generate_batch_size=generate_batch_size, n=N_SAMPLES, queue_size=QUEUE,
                            group_filter=GroupFilter(low=0.0, high=1.0))
    return SurplusBatches(RolloutStore(str(tmp_path / "run")), sampler, settings), failing


def fake_generation(version: int, failing: set[int], generated: list[list[int]]):
    """Rows of a batch of `version` (each round's prompts kept in `generated`), and scores that fail the filter's open
    range (0, 1) for the prompts in `failing`."""
    def generate(prompts) -> pa.Table:
        generated.append([p.index for p in prompts])
        return rollout_table([{"prompt_index": p.index, "sample_index": j, "prompt_ids": [p.index], "response_ids": [j],
                               "prompt_text": p.text, "response_text": "r", "rollout_logprobs": None,
                               "finish_reason": "stop", "label": p.label, "policy_version": version,
                               "data_source": ""} for p in prompts for j in range(N_SAMPLES)])

    def score(table: pa.Table) -> pa.Table:
        scores = [1.0 if i in failing else 0.5 for i in table.column("prompt_index").to_pylist()]
        return reward_table(sample_keys(table), scores, scores, [{}] * table.num_rows)

    return generate, score


def compose_and_commit(surplus: SurplusBatches, failing: set[int], step: int):
    """Compose batch `step` and commit its three datasets by one manifest write, as the rollout stage does."""
    generated: list[list[int]] = []
    batch, figures = surplus.compose(step, *fake_generation(rollout_version(step, QUEUE, True), failing, generated))
    beside = {name: (table, 0, batch.records.get(name, {})) for name, table in batch.beside().items()}
    surplus.store.commit(step, "rollout", batch.rollout, 0, {}, beside=beside)
    return batch, figures, generated


def groups(table: pa.Table) -> list[tuple[int, int, int]]:
    """(epoch, prompt index, batch step) of each group (its first row)."""
    rows = table.select(["epoch", "prompt_index", "batch_step"]).to_pylist()[::N_SAMPLES]
    return [(r["epoch"], r["prompt_index"], r["batch_step"]) for r in rows]


def fates(table: pa.Table) -> list[tuple[int, int, int, str]]:
    return [(r["epoch"], r["prompt_index"], r["batch_step"], r["fate"]) for r in table.to_pylist()]


# B 3, G 5, prompts 1 and 6 always filtered out. Step by step:
# 1: serves 0-4 (1 filtered); trains 0 2 3, leaves 4.
# 2: trains 4 (carried), serves 5-9 (6 filtered), trains 5 7, leaves 8 9.
# 3: trains 8 9 (carried); rows 9 and 8 are in flight, so episode 1's 9 and 8 wait and it serves 7 6 5 4 3 (6
#    filtered); trains 7, leaves 5 4 3.
# 4: trains 5 4 3 (carried, the step full); serves the waiting 9 8, then 2 1 0 (1 filtered); leaves 9 8 2 0.
# 5: trains 9 8 2 of the 4 carried: 0 expires and is served first again; episode 2 begins with 0, drawn already, and
#    2, in flight: both wait; it serves (1, 0) 1 3 4 5 (1 filtered), and leaves all its 4 passing groups.
EXPECTED = {
    1: dict(rollout=[(0, 0, 1), (0, 2, 1), (0, 3, 1)], surplus=[(0, 4, 1)],
            ledger=[(0, 0, 1, "trained"), (0, 1, 1, "filtered"), (0, 2, 1, "trained"), (0, 3, 1, "trained"),
                    (0, 4, 1, "surplus")],
            counts=(0, 0, 0, 1, 5), sampler={"position": 5, "waiting": []}),
    2: dict(rollout=[(0, 4, 1), (0, 5, 2), (0, 7, 2)], surplus=[(0, 8, 2), (0, 9, 2)],
            ledger=[(0, 4, 1, "trained"), (0, 5, 2, "trained"), (0, 6, 2, "filtered"), (0, 7, 2, "trained"),
                    (0, 8, 2, "surplus"), (0, 9, 2, "surplus")],
            counts=(1, 1, 0, 2, 5), sampler={"position": 10, "waiting": []}),
    3: dict(rollout=[(0, 8, 2), (0, 9, 2), (1, 7, 3)], surplus=[(1, 5, 3), (1, 4, 3), (1, 3, 3)],
            ledger=[(0, 8, 2, "trained"), (0, 9, 2, "trained"), (1, 7, 3, "trained"), (1, 6, 3, "filtered"),
                    (1, 5, 3, "surplus"), (1, 4, 3, "surplus"), (1, 3, 3, "surplus")],
            counts=(2, 2, 0, 3, 5), sampler={"position": 17, "waiting": [[1, 9], [1, 8]]}),
    4: dict(rollout=[(1, 5, 3), (1, 4, 3), (1, 3, 3)], surplus=[(1, 9, 4), (1, 8, 4), (1, 2, 4), (1, 0, 4)],
            ledger=[(1, 5, 3, "trained"), (1, 4, 3, "trained"), (1, 3, 3, "trained"), (1, 9, 4, "surplus"),
                    (1, 8, 4, "surplus"), (1, 2, 4, "surplus"), (1, 1, 4, "filtered"), (1, 0, 4, "surplus")],
            counts=(3, 3, 0, 4, 5), sampler={"position": 20, "waiting": []}),
    5: dict(rollout=[(1, 9, 4), (1, 8, 4), (1, 2, 4)], surplus=[(1, 0, 5), (2, 3, 5), (2, 4, 5), (2, 5, 5)],
            ledger=[(1, 9, 4, "trained"), (1, 8, 4, "trained"), (1, 2, 4, "trained"), (1, 0, 4, "expired"),
                    (1, 0, 5, "surplus"), (2, 1, 5, "filtered"), (2, 3, 5, "surplus"), (2, 4, 5, "surplus"),
                    (2, 5, 5, "surplus")],
            counts=(4, 3, 1, 4, 5), sampler={"position": 26, "waiting": [[2, 0], [2, 2]]}),
}


def test_five_oversampled_steps_worked_by_hand(tmp_path):
    surplus, failing = batches(tmp_path, {1, 6}, generate_batch_size=5)
    for step, expected in EXPECTED.items():
        batch, figures, _ = compose_and_commit(surplus, failing, step)
        store = surplus.store
        assert groups(store.read(step, "rollout")) == expected["rollout"], step
        assert groups(store.read(step, "surplus")) == expected["surplus"], step
        assert fates(store.read(step, "prompts")) == expected["ledger"], step
        keys = ("rollout/surplus_carried", "rollout/surplus_used", "rollout/surplus_expired", "rollout/surplus_left",
                "rollout/prompts_served")
        assert tuple(figures[k] for k in keys) == expected["counts"], step
        assert store.manifest()["steps"][str(step)]["prompts"]["sampler"] == expected["sampler"], step
        # every consumed group within the versions the step may consume: batch k by k - 2, its surplus one step later
        versions = set(store.read(step, "rollout").column("policy_version").to_pylist())
        assert versions <= {max(0, step - 3), max(0, step - 2)}, step
    # the three datasets were entered by one manifest write per step
    commits = [e["stage"] for e in store.events() if e["event"] == "commit"]
    assert commits == ["surplus", "prompts", "rollout"] * 5


def test_a_batch_short_of_passing_groups_draws_the_shortfall_and_generates_again(tmp_path):
    surplus, failing = batches(tmp_path, {0, 1, 2}, generate_batch_size=4)
    batch, figures, generated = compose_and_commit(surplus, failing, 1)
    # 0 1 2 3 pass only 3; the 2 missing groups are drawn (4 5) and pass
    assert generated == [[0, 1, 2, 3], [4, 5]]
    assert groups(batch.rollout) == [(0, 3, 1), (0, 4, 1), (0, 5, 1)] and batch.tables["surplus"].num_rows == 0
    assert figures["filter/pass_rate"] == pytest.approx(3 / 6) and figures["rollout/prompts_served"] == 6


def test_a_dataset_too_small_for_a_batch_beside_the_carried_groups_is_refused(tmp_path):
    with pytest.raises(ValueError) as err:
        batches(tmp_path, set(), generate_batch_size=8)
    assert str(err.value) == (
        "rollout.vllm_generate_batch_size 8 with rollout.batch_size 3 needs 11 prompt rows (a batch's prompts beside "
        "the carried ones in flight): got 10; lower --rollout.vllm_generate_batch_size or add prompts")
