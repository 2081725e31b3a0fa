"""Two data-parallel actor ranks colocated with two vLLM engines on two GPUs (one rank, one reference replica and one
engine per GPU, all sleeping in turn): `rl_train` runs 2 steps and each rank pushes its weights to the engine on
its GPU through CUDA IPC. Needs 2 GPUs (skipped on one).

`hybrid train` still refuses several ranks on GPUs (not verified yet), so the child calls the flow directly: this
test is the verification that lifts the refusal. The check: at step 2 each engine's logprobs of its own samples
(engine 0 has the first half of the prompts, engine 1 the second) match the trained actor's, while the initial
weights (the reference) are far from them."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from test_colocated_run_gpu import REPO_ROOT, colocated_config, product_env
from test_distributed_run_gpu import by_sample, mean_abs_by_sample

pytestmark = pytest.mark.gpu
RUN = "from flows.rl_train import rl_train; from hybrid_core.flags import parse_cli; import sys; " \
      "rl_train(parse_cli(['--config', sys.argv[1]]), run_id='dp2')"


@pytest.fixture(scope="module")
def two_gpus(cuda):
    if cuda.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (one actor rank and one engine on each)")


def two_rank_config(standin, root):
    path = colocated_config(standin, root)
    cfg = yaml.safe_load(path.read_text())
    cfg["actor"] |= {"num_gpus_per_node": 2, "entropy_coef": 0.01}  # no reward on the stand-in: entropy moves it
    cfg["ref"] |= {"num_gpus_per_node": 2}
    cfg["vllm"] |= {"num_engines": 2}
    # two optimizer steps a step: not on-policy, so the advantage stage commits the actor's own logprobs (compared)
    cfg["train"] |= {"batch_size": 4, "micro_batch_size": 2}
    cfg["rollout"] |= {"logprobs": True}  # compared below; nothing of the run reads them, so they are asked for
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_two_ranks_push_their_weights_to_their_engines(standin, two_gpus, tmp_path):
    config = two_rank_config(standin, tmp_path)
    done = subprocess.run([sys.executable, "-c", RUN, str(config)], cwd=REPO_ROOT, env=product_env(tmp_path),
                          capture_output=True, text=True, timeout=900)
    print(done.stdout[-6000:], done.stderr[-6000:])
    assert done.returncode == 0, done.stderr[-3000:]
    check_engines_match_actor(tmp_path / "runs" / "dp2")


def check_engines_match_actor(run_dir) -> None:
    """At step 2 each engine's logprobs of its own samples match the trained actor's; the initial weights do not."""
    import pyarrow.dataset as pds

    rollout = pds.dataset(str(run_dir / "steps" / "2" / "rollout"), format="parquet").to_table()
    experience = pds.dataset(str(run_dir / "steps" / "2" / "advantage"), format="parquet").to_table()
    engine, actor = by_sample(rollout, "rollout_logprobs"), by_sample(experience, "old_logprobs")
    initial = by_sample(experience, "ref_logprobs")
    prompts = sorted({prompt for prompt, _ in actor})
    halves = (prompts[:len(prompts) // 2], prompts[len(prompts) // 2:])  # engine 0's prompts, then engine 1's
    for rank, half in enumerate(halves):
        keys = [key for key in actor if key[0] in half]
        pick = lambda rows: {k: rows[k] for k in keys}  # noqa: E731
        synced, moved = mean_abs_by_sample(pick(engine), pick(actor)), mean_abs_by_sample(pick(initial), pick(actor))
        print(f"engine {rank}: mean |engine - actor| = {synced:.4f}, mean |initial - actor| = {moved:.4f}")
        assert moved >= 0.05 and synced <= 0.05, (rank, synced, moved)
