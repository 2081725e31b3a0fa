"""Colocated vLLM engines of several tensor-parallel workers (#18 part 4): `hybrid train` runs 2 steps with E engines
× TP T on the actor's E·T GPUs (one actor rank, one reference replica and one TP worker on each GPU, all sleeping in
turn). Each engine's workers are vLLM Ray-executor actors on its bundles, and each actor rank hands its weights by
CUDA IPC to the worker on its own GPU (`engine_layout`). Needs E·T GPUs (skipped with fewer).

The check: at step 2 each engine's logprobs of its own samples (engine e has the e-th contiguous share of the
prompts) match the trained actor's, while the initial weights (the reference) are far from them. A worker left with
the initial weights, or given another GPU's copy of a bucket, would break every token's logprob of its engine. On
one GPU (1 engine × TP 1) the same check covers the sync's buckets while DeepSpeed's sleep still copies the optimizer
states on a stream of its own (each bucket waits for its own stream only)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from test_colocated_run_gpu import REPO_ROOT, colocated_config, product_env
from test_distributed_run_gpu import by_sample, mean_abs_by_sample

pytestmark = pytest.mark.gpu


def tp_config(standin, root, num_engines: int, tp: int, executor: str | None = None):
    path = colocated_config(standin, root)
    cfg = yaml.safe_load(path.read_text())
    gpus = num_engines * tp
    cfg["actor"] |= {"num_gpus_per_node": gpus, "entropy_coef": 0.01}  # no reward on the stand-in: entropy moves it
    cfg["ref"] |= {"num_gpus_per_node": gpus}
    cfg["vllm"] |= {"num_engines": num_engines, "tensor_parallel_size": tp} | ({"executor_backend": executor}
                                                                           if executor else {})
    # two optimizer steps a step: not on-policy, so the advantage stage commits the actor's own logprobs (compared)
    cfg["train"] |= {"batch_size": 4, "micro_batch_size": 2}
    cfg["rollout"] |= {"logprobs": True}  # compared below; nothing of the run reads them, so they are asked for
    cfg.pop("eval")  # the engines' evaluation is the colocated test's; here only their weights matter
    path.write_text(yaml.safe_dump(cfg))
    return path


# 1 × TP 1: one GPU, the engine's model runner by default in a child process of the rollout worker that opens the
# buckets' CUDA IPC handles itself (or, `uni`, in the worker's own process); DeepSpeed's deferred sleep copies beside
# the sync
@pytest.mark.parametrize(("num_engines", "tp", "executor"), [(1, 1, None), (1, 1, "uni"), (1, 2, None), (2, 2, None)],
                         ids=["1-engine-tp1", "1-engine-tp1-uni", "1-engine-tp2", "2-engines-tp2"])
def test_tp_workers_take_their_weights_from_the_ranks_beside_them(standin, cuda, tmp_path, num_engines, tp, executor):
    if cuda.cuda.device_count() < num_engines * tp:
        pytest.skip(f"needs {num_engines * tp} GPUs ({num_engines} engines × TP {tp})")
    config = tp_config(standin, tmp_path, num_engines, tp, executor)
    done = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--config", str(config), "--run_id", "tp"],
                          cwd=REPO_ROOT, env=product_env(tmp_path), capture_output=True, text=True, timeout=900)
    print(done.stdout[-6000:], done.stderr[-6000:])
    assert done.returncode == 0, done.stderr[-3000:]
    check_each_engine_matches_actor(tmp_path / "runs" / "tp", num_engines, tp)


def check_each_engine_matches_actor(run_dir, num_engines: int, tp: int) -> None:
    """At step 2 each engine's logprobs of its own samples (the e-th contiguous share of the prompts) match the
    trained actor's; the initial weights do not."""
    import pyarrow.dataset as pds

    rollout = pds.dataset(str(run_dir / "steps" / "2" / "rollout"), format="parquet").to_table()
    experience = pds.dataset(str(run_dir / "steps" / "2" / "advantage"), format="parquet").to_table()
    engine, actor = by_sample(rollout, "rollout_logprobs"), by_sample(experience, "old_logprobs")
    initial = by_sample(experience, "ref_logprobs")
    prompts = sorted({prompt for prompt, _ in actor})
    assert len(prompts) % num_engines == 0
    share = len(prompts) // num_engines
    for rank in range(num_engines):
        keys = [key for key in actor if key[0] in prompts[rank * share:(rank + 1) * share]]
        pick = lambda rows: {k: rows[k] for k in keys}  # noqa: E731
        synced, moved = mean_abs_by_sample(pick(engine), pick(actor)), mean_abs_by_sample(pick(initial), pick(actor))
        print(f"engine {rank} (TP {tp}): mean |engine - actor| = {synced:.4f}, mean |initial - actor| = {moved:.4f}")
        assert moved >= 0.05 and synced <= 0.05, (rank, synced, moved)
