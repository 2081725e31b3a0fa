"""Async mode's schedule in the `rl-train` flow: which batch generates when, as task runs `generate-batch-<k>` beside
the steps that train.

With `train.async_queue_size` Q the engines generate batch k with policy version max(0, k − 1 − Q)
(`step_contract.rollout_version`): batches 1 … Q + 1 start from the initial weights, and batch k + Q + 1 starts once
step k's sync has committed version k; step k's sync first waits for batch k + Q, the last one version k − 1
generates, so no batch sees two versions. Oversampling generates one step less ahead (batch k by max(0, k − Q), so
the surplus it carries to step k + 1 is at most Q stale): batches 1 … Q, then batch k + Q after step k's sync. With
partial rollout the sync does not wait: the batch generating pauses between engine steps for the push and goes on
with the new weights, each token tagged with its version. Each batch is linked to the one before it (they generate
one after another on the engines, and an oversampled batch reads the surplus the one before left) and to the
`rollout-step-<k>` task that commits it, so the Prefect UI shows which generation each step consumed. Without
partial rollout the schedule does not depend on which task finishes first, so a killed and resumed run regenerates
a lost batch with the version it had; only the wall clock depends on the race. With it, where a batch's tokens
switch version depends on when the push came.
"""
from __future__ import annotations

import time

from prefect.futures import PrefectFuture

from hybrid_core.step_contract import batch_submitted_after_sync
from hybrid_core.types import RunRef
from tasks.stages import StepTasks


class BatchQueue:
    """The batches generating ahead of run `run`'s steps `first_step` … `num_steps` (empty in sync mode)."""

    def __init__(self, run: RunRef, stage: StepTasks, first_step: int, num_steps: int, is_partial: bool = False):
        self.run, self.stage, self.num_steps, self.is_partial = run, stage, num_steps, is_partial
        self.queue_size, self.is_oversampling = run.async_queue_size, run.is_oversampling
        self.futures: dict[int, PrefectFuture] = {}
        if self.queue_size:  # every batch the version before `first_step` generates, and those before it
            for step in range(first_step, self.submitted_after_sync(first_step - 1) + 1):
                self.submit(step)

    def submitted_after_sync(self, step: int) -> int:
        return batch_submitted_after_sync(step, self.queue_size, self.is_oversampling)

    def submit(self, step: int) -> None:
        """Start batch `step`'s generation after the batch before it (when the run has that step)."""
        if step > self.num_steps or step in self.futures:
            return
        before = self.futures.get(step - 1)
        self.futures[step] = self.stage.generate.submit(self.run, step, wait_for=[before] if before else None)

    def wait(self, step: int) -> tuple[float, list[PrefectFuture]]:
        """Wait for batch `step` (generated ahead): seconds waited and the future its rollout task is linked to."""
        future = self.futures.pop(step, None)
        if future is None:
            return 0.0, []
        started = time.perf_counter()
        future.result()  # a failed generation fails the step here, with its cause
        return time.perf_counter() - started, [future]

    def before_sync(self, step: int) -> None:
        """Step `step`'s sync changes the weights: the last batch of the version it replaces must be done first
        (partial rollout: it pauses for the push and goes on with the new weights instead)."""
        future = None if self.is_partial else self.futures.get(self.submitted_after_sync(step - 1))
        if future is not None:
            future.result()

    def after_sync(self, step: int) -> None:
        """Version `step` is on the engines: the batch it generates starts."""
        self.submit(self.submitted_after_sync(step))

    def cancel(self) -> None:
        """The run stops: batches not started are not started (one generating ends with the workers)."""
        for future in self.futures.values():
            wrapped = getattr(future, "wrapped_future", None)
            if wrapped is not None:
                wrapped.cancel()  # a task run already running is not stopped by this
        self.futures.clear()
