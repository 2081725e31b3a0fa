"""The step contract: what one RL step is made of, and the rules every layer follows for it.

Owns the roles, the stage table (which worker role and method serve a stage, whether a failed attempt is retried,
what it reads and what it commits), the policy-version rule, the one seed derivation, when a checkpoint is due and
which steps are complete, so where a run resumes and whether live workers may be re-attached. Plain data and pure
functions: it knows nothing of Ray, Prefect or where the run's files live.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

ROLES = ("actor", "ref", "critic", "reward", "rollout")


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One stage of a step: served by rank 0 of `role` through `method`; it commits `commits` in the step's record
    (a dataset under `steps/<k>/<name>/` when `is_dataset`)."""

    name: str
    role: str
    method: str
    is_retried: bool  # an attempt is idempotent (seeded, committed atomically), so Prefect may run it again
    reads: tuple[str, ...]
    is_dataset: bool

    @property
    def commits(self) -> str:
        return self.name


# In order. `train` is never retried: a half-done update cannot be told from a done one. The actor's rank 0 leads the
# critic in `train` (and in checkpoints), as it leads the reference and critic forwards of `advantage`.
ROLLOUT = Stage(name="rollout", role="rollout", method="generate", is_retried=True, reads=("prompts",),
                is_dataset=True)
REWARD = Stage(name="reward", role="rollout", method="score", is_retried=True, reads=("rollout",), is_dataset=True)
ADVANTAGE = Stage(name="advantage", role="actor", method="make_experience", is_retried=True,
                  reads=("rollout", "reward"), is_dataset=True)
TRAIN = Stage(name="train", role="actor", method="train", is_retried=False, reads=("rollout", "advantage"),
              is_dataset=False)
SYNC = Stage(name="sync", role="actor", method="sync", is_retried=True, reads=("train",), is_dataset=False)
METRICS = Stage(name="metrics", role="actor", method="write_metrics", is_retried=True,
                reads=("rollout", "reward", "advantage", "train", "sync"), is_dataset=True)
CHECKPOINT = Stage(name="checkpoint", role="actor", method="save_checkpoint", is_retried=True, reads=("sync",),
                   is_dataset=False)
# Every `eval.steps` steps, after the sync: the policy the step trained (version k) answers the eval prompts; step 0
# (`eval.at_start`) evaluates the initial policy. Its figures go into the step's metrics row, so it precedes it.
EVAL = Stage(name="eval", role="rollout", method="evaluate", is_retried=True, reads=("sync",), is_dataset=True)

STEP_STAGES: tuple[Stage, ...] = (ROLLOUT, REWARD, ADVANTAGE, TRAIN, SYNC, METRICS)
STAGE_ORDER = ("rollout", "reward", "advantage", "train", "sync", "eval", "metrics", "checkpoint")
STAGES_BY_NAME = {stage.name: stage for stage in (*STEP_STAGES, EVAL, CHECKPOINT)}
TIMED_STAGES = ("rollout", "reward", "advantage", "train", "sync", "eval")  # their seconds go into the metrics row
DATASET_STAGES = tuple(stage.name for stage in STEP_STAGES if stage.is_dataset)


def stage_named(name: str) -> Stage:
    if name not in STAGES_BY_NAME:
        raise ValueError(f"stage must be one of {sorted(STAGES_BY_NAME)}: got {name!r}")
    return STAGES_BY_NAME[name]


def stages_after(name: str) -> tuple[str, ...]:
    """What a step committed after `name` (in stage order, the checkpoint last): regenerating `name` invalidates it."""
    return STAGE_ORDER[STAGE_ORDER.index(name) + 1:]


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    retries: int
    delay_s: float


def retry_policy(stage: Stage, stage_retries: int, retry_delay_s: float) -> RetryPolicy:
    """The run's retry settings (`train.stage_retries`, `train.retry_delay_s`) for a stage that may be retried."""
    return RetryPolicy(retries=stage_retries if stage.is_retried else 0, delay_s=retry_delay_s)


def evaluated_version(step: int) -> int:
    """The policy an evaluation after step k measures: the one step k's sync gave the engines (step 0: the initial
    weights)."""
    return step


def generating_version(step: int) -> int:
    """The policy version is the number of completed syncs: step k generates, and computes its advantages, with
    version k − 1."""
    return step - 1


def synced_version(step: int) -> int:
    """The version the rollout engines hold once step k's sync committed."""
    return step


def derive_seed(*parts: int | str) -> int:
    """A stable 31-bit seed from its parts, run seed first: the one formula behind every seeded draw of a run.

    Rollouts use (seed, step, prompt index), the update orders (seed, step, "actor-batches") and (seed, step,
    "critic-batches"), the prompt shuffles (seed, "episode", e) and the refill order (seed, step, "refill").
    """
    digest = hashlib.sha256("/".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def is_checkpoint_due(step: int, save_steps: int) -> bool:
    """A checkpoint is taken after step k iff k % ckpt.save_steps == 0 (save_steps -1 or 0: never)."""
    return save_steps > 0 and step % save_steps == 0


def is_eval_due(step: int, eval_steps: int) -> bool:
    """An evaluation follows step k iff k % eval.steps == 0 (eval.steps -1 or 0: never; step 0 is `eval.at_start`)."""
    return step > 0 and eval_steps > 0 and step % eval_steps == 0


def missing_parts(step: int, entries: dict, committed: set[str], *, save_steps: int, eval_steps: int) -> list[str]:
    """What step `step` still owes: its stages' records (datasets also need their `_SUCCESS` marker, `committed`)
    and, when due, its evaluation and its checkpoint."""
    due = (*STEP_STAGES, EVAL) if is_eval_due(step, eval_steps) else STEP_STAGES
    missing = [stage.name for stage in due
               if stage.name not in entries or (stage.is_dataset and stage.name not in committed)]
    if is_checkpoint_due(step, save_steps) and not entries.get(CHECKPOINT.name):
        missing.append(CHECKPOINT.name)
    return sorted(missing, key=STAGE_ORDER.index)


def first_incomplete_step(steps: dict[str, dict], committed: set[tuple[int, str]], *, save_steps: int,
                          eval_steps: int) -> int:
    """The first step that does not have everything it owes (1 for a new run): where a run resumes."""
    step = 1
    while not missing_parts(step, steps.get(str(step), {}), {s for k, s in committed if k == step},
                            save_steps=save_steps, eval_steps=eval_steps):
        step += 1
    return step


@dataclass(frozen=True, kw_only=True)
class LiveVersions:
    """What a run's live workers hold: the actor's weights and the oldest rollout engine's."""

    trained_step: int
    policy_version: int
    rollout_version: int


def _is_done(entries: dict, committed: set[str], *records: str) -> bool:
    """The step's datasets are committed and so are `records` (e.g. its train record)."""
    return {ROLLOUT.name, REWARD.name, ADVANTAGE.name} <= committed and set(records) <= set(entries)


def reattach_version(first_step: int, entries: dict, committed: set[str]) -> int:
    """The version the rollout engines (and the actor's record of them) must hold to continue at `first_step`: that
    step's own when it already trained and synced with all its datasets committed (a driver killed after the sync),
    else the step before's."""
    is_synced = _is_done(entries, committed, TRAIN.name, SYNC.name)
    return synced_version(first_step) if is_synced else generating_version(first_step)


def reattach_trained_step(first_step: int, entries: dict, committed: set[str]) -> int:
    """The step the live actor must have trained to continue at `first_step`: that step itself when its train record
    is committed (a driver killed during or after its train: the actor finished it), else the step before."""
    return first_step if _is_done(entries, committed, TRAIN.name) else generating_version(first_step)


def can_reattach(live: LiveVersions | None, first_step: int, entries: dict, committed: set[str]) -> bool:
    """Live workers are kept only when every one of them holds exactly the version the resumed step needs."""
    if live is None:
        return False
    wanted = reattach_version(first_step, entries, committed)
    is_trained = live.trained_step == reattach_trained_step(first_step, entries, committed)
    return is_trained and live.policy_version == live.rollout_version == wanted


def restore_step(first_step: int, steps: dict[str, dict]) -> int:
    """The newest checkpoint still kept from before `first_step` (0: start from the model's weights)."""
    kept = [int(k) for k, entries in steps.items()
            if int(k) < first_step and (entries.get(CHECKPOINT.name) or {}).get("kept")]
    return max(kept, default=0)
