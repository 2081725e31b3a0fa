"""A micro run scored by the tiny reward model (real Ray, vLLM CPU, DeepSpeed CPU, the real flow) on prompts mixed
from two files at 0.7/0.3: every committed reward is the model's value at the last token of the committed
prompt+response ids, normalised by its config's mean/std, computed here independently with transformers; the run
completes and its reward actors are gone; the run's ≥ 1,000 mixed prompts hold the first file's within 5% of 0.7,
and each step generated exactly the prompts the sampler gives it, with their source."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import read_metrics, read_stage
from tests.conftest import REPO_ROOT

NUM_STEPS = 2
MIX = {"big.jsonl": (700, 0.7), "small.jsonl": (300, 0.3)}


def _mixed_files(root: Path) -> list[str]:
    """Two prompt files of the demo's kind (its prompts, numbered so that every row is distinct)."""
    demo = [json.loads(line) for line in (REPO_ROOT / "data" / "demo_prompts.jsonl").read_text().splitlines()]
    paths = []
    for name, (rows, _) in MIX.items():
        lines = [json.dumps({"input": f"{demo[i % len(demo)]['input']} ({name} {i})",
                             "label": demo[i % len(demo)]["label"]}) + "\n" for i in range(rows)]
        (root / name).write_text("".join(lines))
        paths.append(str(root / name))
    return paths


@pytest.fixture(scope="module")
def mixed_run(shared_run, tiny_reward_model, tmp_path_factory):
    files = _mixed_files(tmp_path_factory.mktemp("mix"))
    return shared_run("reward-model", "--reward.remote_url", "none", "--reward.model_name_or_path",
                      str(tiny_reward_model), "--reward.normalize_enable", "--train.max_steps", str(NUM_STEPS),
                      "--data.prompt_dataset", ",".join(files), "--data.prompt_probs", "0.7,0.3")


def test_a_two_file_mix_is_sampled_at_its_probabilities_and_steps_take_the_sampler_s_prompts(mixed_run):
    from hybrid_core.data.prompts import PromptSampler
    from hybrid_core.workers.worker_args import rollout_args

    cfg, run_dir = mixed_run
    source = rollout_args(cfg).prompts
    rows = source.rows()
    big = cfg.data.prompt_dataset.split(",")[0]
    share = sum(row.source == big for row in rows) / len(rows)
    assert len(rows) >= 1000 and abs(share - 0.7) <= 0.05 * 0.7, (len(rows), share)
    assert rows == source.rows()  # seeded: the same mix every time
    sampler = PromptSampler(rows, source.batch_size, source.num_episodes, cfg.train.seed, source.max_steps)
    for step in range(1, NUM_STEPS + 1):
        rollout = read_stage(run_dir, step, "rollout")
        planned = sampler.for_step(step)
        n = cfg.rollout.n_samples_per_prompt
        assert rollout.column("prompt_index").to_pylist() == [p.index for p in planned for _ in range(n)]
        assert rollout.column("data_source").to_pylist() == [p.source for p in planned for _ in range(n)]
        texts = rollout.column("prompt_text").to_pylist()
        assert all(p.text in text for p, text in zip([p for p in planned for _ in range(n)], texts))


def test_a_reward_model_scores_the_committed_samples(mixed_run, tiny_reward_model, ray_session):
    from transformers import AutoModelForSequenceClassification

    _, run_dir = mixed_run
    # transformers' own backbone and head, one unpadded sample at a time, the head at the last token
    model = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model, dtype=torch.float32).eval()
    config = json.loads((tiny_reward_model / "config.json").read_text())
    for step in range(1, NUM_STEPS + 1):
        rollout, reward = read_stage(run_dir, step, "rollout"), read_stage(run_dir, step, "reward")
        assert reward.num_rows == rollout.num_rows == 4
        keys = list(zip(rollout.column("prompt_index").to_pylist(), rollout.column("sample_index").to_pylist()))
        assert list(zip(reward.column("prompt_index").to_pylist(), reward.column("sample_index").to_pylist())) == keys
        raw = []
        with torch.no_grad():
            for prompt_ids, response_ids in zip(rollout.column("prompt_ids").to_pylist(),
                                                rollout.column("response_ids").to_pylist()):
                hidden = model.model(input_ids=torch.tensor([prompt_ids + response_ids])).last_hidden_state
                raw.append(model.score(hidden[0, -1]).item())
        expected = [(x - config["mean"]) / config["std"] for x in raw]
        torch.testing.assert_close(reward.column("reward").to_pylist(), expected, rtol=0, atol=1e-5)
        assert reward.column("score").to_pylist() == reward.column("reward").to_pylist()
        logged = [json.loads(e)["reward_model_raw"] for e in reward.column("extra_logs").to_pylist()]
        torch.testing.assert_close(logged, raw, rtol=0, atol=1e-6)
        assert len(set(round(x, 3) for x in raw)) > 1  # the samples do get different rewards
    assert abs(read_metrics(run_dir, NUM_STEPS)["reward/mean"] - sum(expected) / len(expected)) < 1e-5
    named = {actor["name"] for actor in ray_session.util.list_named_actors(all_namespaces=True)}
    assert not [name for name in named if name.startswith("reward-model/")], named  # killed at the run's end
