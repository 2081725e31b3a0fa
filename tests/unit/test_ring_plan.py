"""Ring attention in the plan (hybrid_core.plan: ring.py, placement.py, memory.py): the refusals of `hybrid train`
naming both values and the fix, the ring groups `hybrid plan` prints, how a role's ranks share the rows of a no-grad
forward, and the memory a ring divides (a sample's activations and logits) or adds (the gathered keys and values)."""
from __future__ import annotations

import json

import pytest

from hybrid_core.config import RunConfig
from hybrid_core.plan.memory import GIB, model_shape, trainer_bytes
from hybrid_core.plan.refusals import preflight_problems
from hybrid_core.plan.report import render_plan
from hybrid_core.workers.rank_group import sharded_rows
from tests.conftest import REPO_ROOT
from tests.unit.plan_fixtures import logprob_kernels  # noqa: F401 — autouse: the PyTorch head's bytes

INPUTS = {"data": {"prompt_dataset": str(REPO_ROOT / "data" / "demo_prompts.jsonl")},
          "reward": {"remote_url": str(REPO_ROOT / "data" / "letters_reward.py")}}


@pytest.fixture
def model_dir(tmp_path):
    """A model directory whose config.json has 4 K/V heads (the plan reads shapes only: no weights needed)."""
    config = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def ring_config(model: str, ranks: int = 2, ds: dict | None = None, **blocks) -> RunConfig:
    """A CPU run of `ranks` colocated actor/ref ranks (estimator group_norm: no critic), ring attention 2."""
    merged = {"actor": {"model_name_or_path": model, "num_gpus_per_node": ranks},
              "ref": {"num_gpus_per_node": ranks}, "vllm": {"num_engines": ranks},
              "train": {"device": "cpu", "colocate_all": True},
              "ds": {"ring_attn_size": 2, "packing_samples": True} | (ds or {}),
              "algo": {"advantage": {"estimator": "group_norm"}}, "rollout": {"n_samples_per_prompt": 2}} | INPUTS
    for ns, block in blocks.items():
        merged[ns] = merged.get(ns, {}) | block
    return RunConfig.model_validate(merged)


def ring_lines(cfg: RunConfig) -> list[str]:
    return [line for line in render_plan(cfg).splitlines() if "ring" in line]


def test_a_ring_of_packed_samples_is_accepted_and_its_groups_shown(model_dir):
    cfg = ring_config(model_dir, ranks=4, ds={"ring_attn_head_stride": 2})
    assert preflight_problems(cfg, num_gpus_found=None) == []
    assert ring_lines(cfg) == [
        "ring attention: each packed sample split over 2 ranks, 2 K/V head(s) all-gathered at a time",
        "  actor: ring groups [0, 1] [2, 3] (2 data-parallel group(s))",
        "  ref: ring groups [0, 1] [2, 3] (2 data-parallel group(s))"]
    assert ring_lines(ring_config(model_dir, ds={"ring_attn_size": 1})) == []  # no ring, nothing printed


def test_ring_attention_without_packing_is_refused(model_dir):
    problems = preflight_problems(ring_config(model_dir, ds={"packing_samples": False}), num_gpus_found=None)
    assert problems == ["ds.ring_attn_size 2 splits packed samples: got ds.packing_samples False; add "
                        "--ds.packing_samples, or drop --ds.ring_attn_size"]


def test_a_ring_size_that_does_not_divide_the_ranks_is_refused(model_dir):
    problems = preflight_problems(ring_config(model_dir, ranks=3), num_gpus_found=None)
    assert problems == [f"ds.ring_attn_size 2 must divide the {role}'s ranks: got 3 {role} ranks; use "
                        f"--ds.ring_attn_size among 1, 3, or give the {role} a multiple of 2 ranks"
                        for role in ("actor", "ref")]


def test_the_critic_is_checked_and_shown_too(model_dir):
    cfg = ring_config(model_dir, ranks=2, algo={"advantage": {"estimator": "gae"}},
                      critic={"model_name_or_path": model_dir, "num_gpus_per_node": 2})
    assert preflight_problems(cfg, num_gpus_found=None) == []
    assert ring_lines(cfg)[-1] == "  critic: ring groups [0, 1] (1 data-parallel group(s))"
    alone = ring_config(model_dir, ranks=2, algo={"advantage": {"estimator": "gae"}},
                        critic={"model_name_or_path": model_dir, "num_gpus_per_node": 3},
                        train={"device": "cpu", "colocate_all": False})
    assert preflight_problems(alone, num_gpus_found=None) == [
        "ds.ring_attn_size 2 must divide the critic's ranks: got 3 critic ranks; use --ds.ring_attn_size among 1, "
        "3, or give the critic a multiple of 2 ranks"]


def test_a_head_stride_that_does_not_divide_the_kv_heads_is_refused(model_dir):
    problems = preflight_problems(ring_config(model_dir, ds={"ring_attn_head_stride": 3}), num_gpus_found=None)
    assert problems == [f"ds.ring_attn_head_stride 3 must divide the K/V heads of actor.model_name_or_path "
                        f"{model_dir!r}: got 4 K/V heads; use --ds.ring_attn_head_stride among 1, 2, 4"]
    hub = ring_config("Qwen/Qwen3-4B-Thinking-2507", ds={"ring_attn_head_stride": 3})  # 8 K/V heads (shape table)
    assert any("got 8 K/V heads; use --ds.ring_attn_head_stride among 1, 2, 4, 8" in p
               for p in preflight_problems(hub, num_gpus_found=None))


def test_a_head_stride_without_a_ring_is_refused(model_dir):
    problems = preflight_problems(ring_config(model_dir, ds={"ring_attn_size": 1, "ring_attn_head_stride": 2}),
                                  num_gpus_found=None)
    assert problems == ["ds.ring_attn_head_stride 2 does nothing without ring attention: got ds.ring_attn_size 1; "
                        "set --ds.ring_attn_size to a divisor of the actor's ranks, or drop --ds.ring_attn_head_stride"]


def test_a_ring_shares_the_same_rows_and_its_first_rank_answers(monkeypatch):
    from hybrid_core.workers import rank_group

    # no Ray here: the "remote" calls answer at once, and gathering their answers is taking them
    monkeypatch.setattr(rank_group, "gather", lambda role, pending, timeout_s, deadline: [a for _, a in pending])
    calls = []

    def rank_call(rank):
        def call(prompts, responses):
            calls.append((rank, prompts))
            return [(rank, p[0]) for p in prompts]
        return call

    prompts, responses = [[i] for i in range(5)], [[0]] * 5
    remote = [(rank, rank_call(rank)) for rank in range(1, 4)]
    rows = sharded_rows(prompts, responses, "ref", remote, 1.0, local=rank_call(0), ring_size=2)
    # rings [0, 1] and [2, 3]: rows 0-2 to both ranks of the first, 3-4 to the second; ranks 0 and 2 answer
    assert rows == [(0, 0), (0, 1), (0, 2), (2, 3), (2, 4)]
    assert sorted(calls) == [(0, [[0], [1], [2]]), (1, [[0], [1], [2]]), (2, [[3], [4]]), (3, [[3], [4]])]


def test_a_ring_divides_activations_and_logits_and_adds_the_gathered_keys():
    # Qwen3-1.7B, 2048-token micro-batches, bf16: without a ring 6.125 GiB of activations (see test_memory_plan);
    # a ring of 2 computes 1024 tokens a rank, and each of the 28 layers keeps the row's gathered keys and values:
    # 2 · 1024 tokens · 2 · (8 K/V heads · 128) · 2 bytes. A rank's vocabulary head runs over its own 1024 tokens:
    # one chunk of min(1024, 4096), 1024 · 151936 · 10 bytes, plus the head's gradient sum 151936 · 2048 · 2 bytes
    # in the update; with chunks of 512 tokens, 512 of them.
    shape = model_shape("Qwen/Qwen3-1.7B")
    base = {"actor": {"model_name_or_path": "Qwen/Qwen3-1.7B"}, "data": {"max_len": 2048},
            "algo": {"advantage": {"estimator": "reinforce"}, "kl": {"init_coef": 0.0}}}
    ds = {"ring_attn_size": 2, "packing_samples": True}
    ring = trainer_bytes(RunConfig.model_validate(base | {"ds": ds}), shape, has_logits=True)
    gathered = 28 * 2 * 1024 * 2 * 1024 * 2 / GIB
    head_gradient_sum = 151936 * 2048 * 2 / GIB
    assert ring.activations == pytest.approx(6.125 / 2 + gathered, rel=0, abs=1e-9)
    assert ring.logits == pytest.approx(1024 * 151936 * 10 / GIB + head_gradient_sum, rel=0, abs=1e-9)
    assert ring.forward == pytest.approx(1024 * 151936 * 10 / GIB, rel=0, abs=1e-9)
    small_chunks = trainer_bytes(RunConfig.model_validate(base | {"ds": ds | {"logit_chunk_tokens": 512}}),
                                 shape, has_logits=True)
    assert small_chunks.logits == pytest.approx(512 * 151936 * 10 / GIB + head_gradient_sum, rel=0, abs=1e-9)
    assert small_chunks.forward == pytest.approx(512 * 151936 * 10 / GIB, rel=0, abs=1e-9)


def test_a_token_budget_is_a_gpus_so_a_ring_micro_batch_holds_ring_size_times_it(model_dir):
    from hybrid_core.plan.memory import forward_tokens_of, train_tokens
    from hybrid_core.workers.worker_args import forward_batching, train_batching

    cfg = ring_config(model_dir, train={"dynamic_batch_enable": True, "max_tokens_per_gpu": 3000},
                      rollout={"n_samples_per_prompt": 2, "max_tokens_per_gpu": 5000}, data={"max_len": 4096})
    assert (train_batching(cfg).max_tokens, forward_batching(cfg).max_tokens) == (6000, 10000)  # as OpenRLHF
    assert (train_tokens(cfg), forward_tokens_of(cfg)) == (6000, 10000)
