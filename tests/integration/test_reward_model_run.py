"""A micro run scored by the tiny reward model (real Ray, vLLM CPU, DeepSpeed CPU, the real flow): every committed
reward is the model's value at the last token of the committed prompt+response ids, normalised by its config's
mean/std, computed here independently with transformers; the run completes and its reward actors are gone."""
from __future__ import annotations

import json

import torch

from conftest import read_metrics, read_stage

NUM_STEPS = 2


def test_a_reward_model_scores_the_committed_samples(shared_run, tiny_reward_model, ray_session):
    from transformers import AutoModelForSequenceClassification

    _, run_dir = shared_run("reward-model", "--reward.remote_url", "none", "--reward.model_name_or_path",
                            str(tiny_reward_model), "--reward.normalize_enable", "--train.max_steps", str(NUM_STEPS))
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
