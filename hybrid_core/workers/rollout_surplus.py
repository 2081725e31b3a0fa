"""Oversampling on the rollout worker: step k's rollout composed from the groups step k − 1 left over and batch k's,
and the datasets a rollout stage commits together (`StepBatch`).

Batch k draws G = `rollout.vllm_generate_batch_size` prompts from the prompt ledger (`data.prompt_ledger`) and
generates them with the version the engine holds; dynamic filtering drops the groups out of its range and, while
step k's B = `rollout.batch_size` groups are not reached, the shortfall is drawn and generated again. Step k trains
the carried groups first, then batch k's; batch k's other passing groups are its surplus (`steps/<k>/surplus/`), and
carried groups it does not train expire: their samples stay in the store, their prompts go back to the sampler.
Everything is read from what step k − 1 committed or wrote ahead, so a resumed run composes the same batch. It knows
nothing about Prefect or the driver's schedule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa

from hybrid_core.data.prompt_ledger import (SamplerState, Served, carried_use, draw, ledger_rows, returned,
                                            take_groups)
from hybrid_core.data.prompts import Prompt, PromptSampler
from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.data.stage_tables import prompt_ledger_table, with_batch_columns
from hybrid_core.engines.rollout_step import GroupFilter, filtered_rollout
from hybrid_core.step_contract import PROMPT_LEDGER, ROLLOUT, SURPLUS, consumable_versions


@dataclass(frozen=True, kw_only=True)
class StepBatch:
    """The datasets a rollout stage commits, `rollout` last (with oversampling its surplus and prompt ledger before
    it), and the extra fields of their manifest entries (the prompt ledger's sampler state)."""

    tables: dict[str, pa.Table]
    records: dict[str, dict] = field(default_factory=dict)

    @property
    def rollout(self) -> pa.Table:
        return self.tables[ROLLOUT.name]

    def beside(self) -> dict[str, pa.Table]:
        return {name: table for name, table in self.tables.items() if name != ROLLOUT.name}


def oldest_version(table: pa.Table, default: int) -> int:
    """The oldest policy version among the rows (`default` for a table without rows or versions)."""
    if "policy_version" not in table.column_names or table.num_rows == 0:
        return default
    return min(table.column("policy_version").to_pylist())


@dataclass(frozen=True, kw_only=True)
class Oversampling:
    batch_size: int  # B: groups a step trains
    generate_batch_size: int  # G: prompts a batch serves fresh
    n: int  # samples a prompt (rows a group)
    queue_size: int  # Q
    group_filter: GroupFilter | None


@dataclass(frozen=True, kw_only=True)
class CarriedGroup:
    served: Served
    batch_step: int
    policy_version: int  # the oldest of its rows


class Draws:
    """The prompts one batch serves, drawn from the ledger's state; a row in flight (`busy`, or served here) is
    never served again until it settles."""

    def __init__(self, sampler: PromptSampler, state: SamplerState, busy: set[int]):
        self.sampler, self.state, self.busy = sampler, state, busy
        self.served: list[Served] = []

    def __call__(self, count: int) -> list[Prompt]:
        busy = self.busy | {served.index for served in self.served}
        got, self.state = draw(self.state, count, self.sampler.stream_entry, len(self.sampler.rows), busy)
        self.served += got
        return [self.sampler.prompt(served.index) for served in got]


def group_rows(table: pa.Table, positions: list[int], n: int) -> pa.Table:
    return table.take(pa.array([p * n + j for p in positions for j in range(n)], pa.int64()))


class SurplusBatches:
    """The oversampled batches of one run, composed on its rollout worker's rank 0 from the run's store."""

    def __init__(self, store: RolloutStore, sampler: PromptSampler, settings: Oversampling):
        s, num_rows = settings, len(sampler.rows)
        if num_rows < s.batch_size + s.generate_batch_size:
            raise ValueError(f"rollout.vllm_generate_batch_size {s.generate_batch_size} with rollout.batch_size "
                             f"{s.batch_size} needs {s.batch_size + s.generate_batch_size} prompt rows (a batch's "
                             f"prompts beside the carried ones in flight): got {num_rows}; lower "
                             "--rollout.vllm_generate_batch_size or add prompts")
        self.store, self.sampler, self.settings = store, sampler, settings

    def carried(self, step: int) -> tuple[pa.Table | None, SamplerState]:
        """Step k − 1's surplus rows and the sampler's state after its batch (committed or written ahead)."""
        if step == 1:
            return None, SamplerState()
        ledger = self.store.written_entry(step - 1, PROMPT_LEDGER)
        if ledger is None:
            raise RuntimeError(f"batch {step} is composed from step {step - 1}'s surplus and prompt ledger, which are "
                               f"not written under {self.store.run_dir}: batch {step - 1} must be generated first")
        return self.store.read(step - 1, SURPLUS), SamplerState.from_record(ledger["sampler"])

    def groups_of(self, table: pa.Table | None) -> list[CarriedGroup]:
        if table is None:
            return []
        n, rows = self.settings.n, table.select(["epoch", "prompt_index", "batch_step", "policy_version"]).to_pylist()
        return [CarriedGroup(served=Served(rows[g]["epoch"], rows[g]["prompt_index"]), batch_step=rows[g]["batch_step"],
                             policy_version=min(r["policy_version"] for r in rows[g:g + n]))
                for g in range(0, len(rows), n)]

    def compose(self, step: int, generate: Callable[[list[Prompt]], pa.Table],
                score: Callable[[pa.Table], pa.Table]) -> tuple[StepBatch, dict]:
        """Generate batch k and compose step k's rollout, surplus and prompt ledger; with the step's figures."""
        s = self.settings
        carried, state = self.carried(step)
        groups = self.groups_of(carried)
        versions = consumable_versions(step, s.queue_size)
        carried_versions = [g.policy_version for g in groups]
        used, expired = carried_use(carried_versions, s.batch_size, versions)
        draws = Draws(self.sampler, returned(state, [groups[i].served for i in expired]),
                      busy={groups[i].served.index for i in used})
        fresh, passed, figures = self.generate(step, draws, s.batch_size - len(used), generate, score)
        schedule = take_groups(carried_versions, sum(passed), s.batch_size, versions)
        carried = fresh.slice(0, 0) if carried is None else carried.select(fresh.schema.names).cast(fresh.schema)
        rollout = pa.concat_tables([group_rows(carried, schedule.used, s.n), group_rows(fresh, schedule.fresh, s.n)])
        assert set(rollout.column("policy_version").to_pylist()) <= set(versions), (step, list(versions))
        ledger = ledger_rows([(g.served, g.batch_step) for g in groups], schedule, draws.served, passed, step)
        figures |= {"rollout/surplus_carried": float(len(groups)), "rollout/surplus_used": float(len(used)),
                    "rollout/surplus_expired": float(len(expired)),
                    "rollout/surplus_left": float(len(schedule.surplus)),
                    "rollout/prompts_served": float(len(draws.served))}
        tables = {SURPLUS: group_rows(fresh, schedule.surplus, s.n), PROMPT_LEDGER: prompt_ledger_table(ledger),
                  ROLLOUT.name: rollout}
        return StepBatch(tables=tables, records={PROMPT_LEDGER: {"sampler": draws.state.record()}}), figures

    def generate(self, step: int, draws: Draws, wanted: int, generate: Callable[[list[Prompt]], pa.Table],
                 score: Callable[[pa.Table], pa.Table]) -> tuple[pa.Table, list[bool], dict]:
        """Batch k's passing groups (rows with their epoch and batch step), every served prompt's pass flag, and the
        filter's pass rate."""
        s = self.settings
        first = draws(s.generate_batch_size)
        if s.group_filter is None:
            rows, passed, figures = generate(first), [True] * len(first), {}
        else:
            filtered = filtered_rollout(generate, score, first, draws, wanted, s.n, s.group_filter)
            rows, passed, figures = filtered.rows, filtered.passed, {"filter/pass_rate": filtered.pass_rate}
        epoch_of = {served.index: served.epoch for served in draws.served}
        epochs = [epoch_of[i] for i in rows.column("prompt_index").to_pylist()]
        return with_batch_columns(rows.replace_schema_metadata(None), epochs, step), passed, figures
