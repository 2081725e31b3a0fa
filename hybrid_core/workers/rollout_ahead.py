"""Async mode on the rollout worker: batches generated ahead of the step that consumes them, while that step's
reward, advantage, train and sync run, and the one lock that serialises the engine between them.

The worker serves two Ray concurrency groups in async mode: `generation` (one thread: `generate_ahead`, a batch at a
time) and the default group (one thread: every other method, in call order, as in sync mode). What uses the engine
holds `EngineTurns.lock`: a batch's generation, an evaluation, the consuming step's own generation of a lost batch,
and a weight update from its first bucket to its last (`begin_weight_update` … `end_weight_update`). Reward
scoring and previews read committed datasets only, so they run while the engine generates.

A batch generated ahead is written with its manifest entry beside it (`RolloutStore.write_ahead`; with
oversampling its surplus and prompt ledger first, the rollout last); the manifest takes the entries, in one write,
when the step consumes the batch (`take`), so the manifest keeps one writer at a time. The driver's
schedule (`flows.batch_queue`) makes every batch's version exact; this module checks it is in the range the step
contract allows. It knows nothing about Prefect.
"""
from __future__ import annotations

import threading
import time

import pyarrow as pa

from hybrid_core.data.stage_tables import response_token_count
from hybrid_core.step_contract import OVERSAMPLING_DATASETS, ROLLOUT, consumable_versions, staleness
from hybrid_core.types import StageResult
from hybrid_core.workers.rollout_surplus import oldest_version

GENERATION_GROUP = "generation"  # the Ray concurrency group of `generate_ahead`
CONCURRENCY_GROUPS = {GENERATION_GROUP: 1}


class EngineTurns:
    """Whose turn the engine is: a lock taken by whatever generates or loads weights. A weight update holds it
    across calls (the sync's buckets arrive one call each); a retried update that begins again keeps it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.is_updating = False
        self.update_waiting = threading.Event()  # partial rollout: a push waits for the generation to pause
        self.update_done = threading.Event()

    def begin_update(self) -> None:
        if not self.is_updating:
            self.update_done.clear()
            self.update_waiting.set()
            self.lock.acquire()
            self.update_waiting.clear()
            self.is_updating = True

    def end_update(self) -> None:
        if self.is_updating:
            self.is_updating = False
            self.lock.release()
            self.update_done.set()

    def pause_point(self) -> None:
        """Partial rollout, between two engine steps of a generation holding the lock: when a weight push waits,
        hand it the engine and take it back once the new weights are loaded."""
        if not self.update_waiting.is_set():
            return
        self.lock.release()
        try:
            self.update_done.wait()
        finally:
            self.lock.acquire()


def async_figures(step: int, version: int, waited_s: float, metrics: dict | None = None) -> dict[str, float]:
    """The consuming step's figures: how stale its batch is (by its oldest token's version) and how long the driver
    waited for it; a partial rollout's batch adds its tokens' mean staleness (`token_figures`)."""
    figures = {"rollout/staleness": float(staleness(step, version)), "timing_s/rollout_wait": waited_s}
    if metrics and "rollout/token_version_mean" in metrics:
        figures["rollout/staleness_token_mean"] = float(step - 1) - metrics["rollout/token_version_mean"]
    return figures


def token_figures(table: pa.Table) -> dict[str, float]:
    """A partial rollout's versions: oldest and newest token version, their mean, and the share of tokens sampled
    by a version older than the batch's newest (what a weight push mid-batch left to the old weights)."""
    versions = [v for row in table.column("token_policy_version").to_pylist() for v in row]
    if not versions:
        return {}
    newest = max(versions)
    return {"rollout/token_version_min": float(min(versions)), "rollout/token_version_max": float(newest),
            "rollout/token_version_mean": sum(versions) / len(versions),
            "rollout/old_version_token_share": sum(v < newest for v in versions) / len(versions)}


class AheadGeneration:
    """`worker`'s batches generated ahead (rank 0 of the rollout role; the other engines generate their shares as
    in sync mode, called by it)."""

    def __init__(self, worker):
        self.worker = worker
        self.queue_size = worker.run.async_queue_size
        self.is_partial = worker.args.partial_rollout
        self.beside = OVERSAMPLING_DATASETS if worker.run.is_oversampling else ()

    def versions(self, step: int) -> range:
        return consumable_versions(step, self.queue_size)

    def generate(self, step: int) -> dict:
        """Generate step `step`'s batch now with the version the engine holds, unless it is committed or written
        ahead already (a resubmitted batch, e.g. by a resumed driver, is not generated twice). Returns what was done."""
        w = self.worker
        store = w.store
        if store.manifest()["steps"].get(str(step)) or store.ahead_entry(step, ROLLOUT.name) is not None:
            return {"step": step, "generated": False}
        with w.turns.lock:
            w.check_policy_version(step)
            store.clean_leftovers(step)
            store.log_event(step, ROLLOUT.name, "start", ahead=True, policy_version=w.policy_version)
            w.ledger.faults.reach(step, ROLLOUT.name, "start")
            started, first_version = time.perf_counter(), w.policy_version
            batch, metrics = w.generate_awake(step, pausing=self.is_partial)
            table = batch.rollout
            metrics["tokens"] = float(response_token_count(table))
            if self.is_partial:
                metrics |= token_figures(table)
            record = {"seconds": time.perf_counter() - started, "metrics": metrics}
            for name, beside in batch.beside().items():  # the rollout's entry, written last, marks the batch whole
                version = oldest_version(beside, first_version)
                store.write_ahead(step, name, beside, version, batch.records.get(name, {}))
            entry = store.write_ahead(step, ROLLOUT.name, table, oldest_version(table, first_version), record)
        w.ledger.faults.reach(step, ROLLOUT.name, "written")
        store.log_event(step, ROLLOUT.name, "generated", rows=table.num_rows, policy_version=entry["policy_version"])
        return {"step": step, "generated": True, "rows": table.num_rows, "seconds": record["seconds"],
                "policy_version": entry["policy_version"]}

    def take(self, step: int, entry: dict, waited_s: float) -> StageResult:
        """Enter a batch written ahead into the manifest as step `step`'s rollout: the step consumes it."""
        w = self.worker
        version = entry["policy_version"]
        if version not in self.versions(step):
            raise RuntimeError(f"the batch generated ahead for step {step} is from policy version {version}, outside "
                               f"the versions it may consume {list(self.versions(step))} (train.async_queue_size "
                               f"{self.queue_size}): delete {w.store.stage_uri(step, ROLLOUT.name)} to regenerate it")
        entry = entry | {"metrics": entry["metrics"] | async_figures(step, version, waited_s, entry["metrics"])}
        beside = {name: w.store.ahead_entry(step, name) for name in self.beside}
        if missing := [name for name, found in beside.items() if found is None]:
            raise RuntimeError(f"the batch generated ahead for step {step} has no {missing} written beside its "
                               f"rollout: delete {w.store.stage_uri(step, ROLLOUT.name)} to regenerate it")
        w.store.record_together(step, beside | {ROLLOUT.name: entry})
        w.ledger.faults.reach(step, ROLLOUT.name, "committed")
        return StageResult(stage=ROLLOUT.name, step=step, seconds=entry["seconds"], rows=entry["rows"],
                           path=w.store.stage_uri(step, ROLLOUT.name), metrics=entry["metrics"])

    def settle(self) -> dict:
        """Wait for a batch still generating (a killed driver's call goes on in this process) and say which batches
        are written ahead and which began but were lost with an earlier process (they are generated again)."""
        w = self.worker
        started = time.perf_counter()
        with w.turns.lock:
            waited_s = time.perf_counter() - started
        manifest_steps = w.store.manifest()["steps"]
        began = {e["step"] for e in w.store.events() if e.get("ahead") and e["event"] == "start"}
        pending = sorted(k for k in began if ROLLOUT.name not in manifest_steps.get(str(k), {}))
        ready = [k for k in pending if w.store.ahead_entry(k, ROLLOUT.name) is not None]
        return {"waited_s": waited_s, "ready": ready, "lost": [k for k in pending if k not in ready]}
