"""Arrow schemas of the stage datasets and the step's metrics row.

Owns the column names and types of `rollout`, `reward`, `advantage` and `metrics` (DESIGN.md §2), and the metric
keys computed from them and from the stages' committed records. It knows nothing about how the values were produced.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hybrid_core.step_contract import TIMED_STAGES

ints = pa.list_(pa.int32())
floats = pa.list_(pa.float32())
ROLLOUT_SCHEMA = pa.schema([
    ("prompt_index", pa.int64()), ("sample_index", pa.int32()), ("prompt_ids", ints), ("response_ids", ints),
    ("prompt_text", pa.string()), ("response_text", pa.string()),
    ("rollout_logprobs", floats),  # null where the engine was asked for none (rollout.logprobs false)
    ("finish_reason", pa.string()), ("label", pa.string()), ("policy_version", pa.int64()),
    ("data_source", pa.string()),  # the prompt's dataset, as named in data.prompt_dataset
])
# An agent run's rollout rows add the episode: `response_ids` is every token after the prompt (generated and the
# environment's), `action_mask` 1 on generated tokens, `turns` each turn's spans (of response_ids) and answer.
AGENT_ROLLOUT_SCHEMA = ROLLOUT_SCHEMA.append(pa.field("action_mask", pa.list_(pa.int8()))) \
    .append(pa.field("turns", pa.string())).append(pa.field("num_turns", pa.int32())) \
    .append(pa.field("episode_reward", pa.float32())).append(pa.field("episode_score", pa.float32()))
# A partial rollout's rows add the policy version of every response token (`policy_version` is the oldest of them)
PARTIAL_ROLLOUT_SCHEMA = ROLLOUT_SCHEMA.append(pa.field("token_policy_version", ints))
# Oversampling: rollout and surplus rows add the pass over the data their prompt was served in (`epoch`) and the step
# whose batch generated them (`batch_step`); the prompt ledger has a row for every prompt a step's batch touched
BATCH_COLUMNS = (pa.field("epoch", pa.int64()), pa.field("batch_step", pa.int64()))
PROMPT_LEDGER_SCHEMA = pa.schema([("epoch", pa.int64()), ("prompt_index", pa.int64()), ("batch_step", pa.int64()),
                                  ("fate", pa.string())])
REWARD_SCHEMA = pa.schema([
    ("prompt_index", pa.int64()), ("sample_index", pa.int32()), ("reward", pa.float32()), ("score", pa.float32()),
    ("extra_logs", pa.string()),
])
ADVANTAGE_SCHEMA = pa.schema([
    ("prompt_index", pa.int64()), ("sample_index", pa.int32()), ("old_logprobs", floats), ("ref_logprobs", floats),
    ("values", floats), ("advantages", floats), ("returns", floats),
])


def rollout_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ROLLOUT_SCHEMA)


def partial_rollout_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=PARTIAL_ROLLOUT_SCHEMA)


def agent_rollout_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=AGENT_ROLLOUT_SCHEMA)


def with_batch_columns(table: pa.Table, epochs: list[int], batch_step: int) -> pa.Table:
    """Oversampling: a batch's rows with each row's `epoch` and the batch's step."""
    epoch, batch = BATCH_COLUMNS
    table = table.append_column(epoch, pa.array(epochs, pa.int64()))
    return table.append_column(batch, pa.array([batch_step] * table.num_rows, pa.int64()))


def prompt_ledger_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=PROMPT_LEDGER_SCHEMA)


def action_masks(rollout: pa.Table) -> list[list[int]] | None:
    """Each sample's action mask (1: a generated token, trained on; 0: the environment's), None for a single-turn
    rollout, whose every response token is generated."""
    if "action_mask" not in rollout.column_names:
        return None
    return rollout.column("action_mask").to_pylist()


def reward_table(keys: list[tuple[int, int]], rewards: list[float], scores: list[float],
                 extra_logs: list[dict]) -> pa.Table:
    return pa.table({
        "prompt_index": [k[0] for k in keys], "sample_index": [k[1] for k in keys], "reward": rewards,
        "score": scores, "extra_logs": [json.dumps(e, sort_keys=True, default=float) for e in extra_logs],
    }, schema=REWARD_SCHEMA)


def advantage_table(keys: list[tuple[int, int]], columns: dict[str, list[list[float]] | pa.Array]) -> pa.Table:
    """Each per-token column as ragged lists, or already an Arrow list array (`ragged_column`)."""
    data = {"prompt_index": [k[0] for k in keys], "sample_index": [k[1] for k in keys]}
    return pa.table(data | {name: columns[name] for name in ADVANTAGE_SCHEMA.names[2:]}, schema=ADVANTAGE_SCHEMA)


def ragged_column(padded: np.ndarray, lengths: list[int]) -> pa.Array:
    """(B, T) values, row i's first `lengths[i]` of them kept → a list<float32> column, built from the array at once
    (the same float32 values as converting each row to Python floats first, without the 262k Python objects of a
    step's column)."""
    counts = np.asarray(lengths, dtype=np.int64)
    kept = padded[np.arange(padded.shape[1]) < counts[:, None]].astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(kept), type=floats)


def sample_keys(table: pa.Table) -> list[tuple[int, int]]:
    return list(zip(table.column("prompt_index").to_pylist(), table.column("sample_index").to_pylist()))


def _mean_std(values: pa.Array | pa.ChunkedArray) -> tuple[float, float]:
    """Mean and population standard deviation in float64 (numpy's: a step's 262k advantages in ~1 ms, where
    `statistics.pstdev`'s exact fractions took 0.12 s); 0, 0 without values."""
    if len(values) == 0:
        return 0.0, 0.0
    x = np.asarray(values.to_numpy(), dtype=np.float64)
    return float(x.mean()), float(x.std())


def response_token_count(rollout: pa.Table) -> int:
    """The response tokens of a rollout table (its `response_ids` lists' lengths, summed in Arrow)."""
    return int(pc.sum(pc.list_value_length(rollout.column("response_ids"))).as_py() or 0)


METRIC_COLUMNS = {"rollout": ["response_ids"], "reward": ["reward"], "advantage": ["advantages"]}  # what rows read


ACTOR_STATS = {"kl_loss": "actor/kl_loss", "approx_kl": "actor/approx_kl", "grad_norm": "actor/grad_norm",
               "lr": "actor/lr", "dual_clip_ratio": "actor/dual_clip_ratio", "entropy": "actor/entropy",
               "kl_coef": "actor/kl_coef", "is_weight_mean": "is/weight_mean", "is_masked_frac": "is/masked_frac"}


def step_metrics(rollout: pa.Table, reward: pa.Table, advantage: pa.Table, train_stats: dict,
                 timings: dict[str, float], extra: dict[str, float] | None = None) -> dict[str, float]:
    """The metrics row of a step: reward, advantage, actor and rollout figures, `timing_s/<stage>`, and `extra`
    (already namespaced figures from other workers, e.g. `critic/value_loss`, `filter/pass_rate`)."""
    reward_mean, reward_std = _mean_std(reward.column("reward"))
    adv_mean, adv_std = _mean_std(pc.list_flatten(advantage.column("advantages")))
    num_samples, num_tokens = rollout.num_rows, response_token_count(rollout)
    rollout_s = timings.get("rollout", 0.0)
    metrics = {
        "reward/mean": reward_mean, "reward/std": reward_std, "advantage/mean": adv_mean, "advantage/std": adv_std,
        "actor/kl": train_stats.get("experience_kl", 0.0), "actor/policy_loss": train_stats.get("policy_loss", 0.0),
        "actor/clip_ratio": train_stats.get("clip_ratio", 0.0),
        "rollout/response_length_mean": num_tokens / num_samples if num_samples else 0.0,
        "rollout/tokens_per_s": num_tokens / rollout_s if rollout_s > 0 else 0.0,
    }
    named = {ACTOR_STATS[k]: v for k, v in train_stats.items() if k in ACTOR_STATS}
    named |= {k: float(v) for k, v in train_stats.items() if k.startswith("timing_s/")}  # sleep/wake inside stages
    timing = {f"timing_s/{stage}": float(s) for stage, s in timings.items()}
    return metrics | named | dict(extra or {}) | timing


def metrics_table(step: int, metrics: dict[str, float]) -> pa.Table:
    """Step `step`'s metrics row: the step, then the figures by name, so the same figures make the same bytes
    whatever order the stages' records listed them in (a step trained again after a restore lists them in
    another)."""
    return pa.Table.from_pylist([{"step": step} | dict(sorted(metrics.items()))])


def experience_figures(advantage_entry: dict | None) -> dict[str, float]:
    """The advantage stage's own figures (KL to the reference, KL coefficient, sample count) from its committed
    record: what the policy update and the KL controller need, without the namespaced timings."""
    metrics = (advantage_entry or {}).get("metrics", {})
    return {key: value for key, value in metrics.items() if "/" not in key}


def row_from_records(rollout: pa.Table, reward: pa.Table, advantage: pa.Table, entries: dict) -> dict[str, float]:
    """The step's metrics row from its committed datasets and its stages' records (`entries`: the step's manifest
    entries): each stage's seconds as `timing_s/<stage>` and every namespaced figure it recorded."""
    records = {stage: entries.get(stage) or {} for stage in TIMED_STAGES}
    timings = {stage: float(r["seconds"]) for stage, r in records.items() if "seconds" in r}
    extra = {key: float(value) for r in records.values() for key, value in r.get("metrics", {}).items() if "/" in key}
    return step_metrics(rollout, reward, advantage, records["train"].get("metrics", {}), timings, extra)
