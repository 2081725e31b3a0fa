"""Agent episodes on the real vLLM CPU build: every stored sample is the engine's generated ids and the
environment's feedback ids, in order, with nothing re-tokenised from text; each turn's ids are what the engine
generates for that prefix with that turn's seed; an environment that raises or hangs fails the stage naming the
sample and the turn, or with `train.agent_skip_failed` loses its prompt's group and is counted."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray

from hybrid_core.data.prompts import Prompt
from hybrid_core.step_contract import derive_seed

pytestmark = pytest.mark.integration

AGENT = str(Path(__file__).parent / "agents" / "turns_agent.py")
MAX_LEN = 40
SEED, STEP, N = 7, 1, 2
PROMPTS = [Prompt(0, "abc", "x"), Prompt(1, "hello there", "y"), Prompt(2, "xyz", "z")]


@pytest.fixture(scope="module")
def episode_engine(ray_session, tiny_model):
    """One vLLM CPU engine in a Ray actor of its own, running episodes and single generations."""

    @ray_session.remote(num_cpus=0)
    class EpisodeEngine:
        def __init__(self, model_path: str):
            from hybrid_core.engines.vllm_rollout import EngineSettings, VllmRolloutEngine
            from hybrid_core.rewards.agents import load_agent_executor

            self.engine = VllmRolloutEngine(EngineSettings(model_path=model_path, param_dtype="fp32",
                                                           gpu_memory_utilization=0.1, seed=0, enforce_eager=True,
                                                           max_model_len=64))
            self.executor = load_agent_executor(AGENT)

        def episodes(self, prompts, timeout_s: float = 30.0, skip_failed: bool = False):
            from hybrid_core.engines.agent_rollout import (AgentSettings, EpisodeRun, generate_episode_rows,
                                                           summed_figures)
            from hybrid_core.engines.vllm_rollout import SamplingSettings

            settings = AgentSettings(path=AGENT, step_timeout_s=timeout_s, skip_failed=skip_failed, max_len=MAX_LEN)
            run = EpisodeRun(engine=self.engine, tokenizer=self.engine.tokenizer, executor=self.executor,
                             settings=settings, sampling=SamplingSettings(n=N, max_new_tokens=8), seed=SEED, step=STEP)
            table = generate_episode_rows(run, prompts, False, None, policy_version=0)
            return table.to_pylist(), summed_figures([table]), self.engine.has_turns()

        def generate_one(self, token_ids: list[int], max_tokens: int, seed: int) -> list[int]:
            from hybrid_core.engines.vllm_rollout import SamplingSettings

            sampling = SamplingSettings(n=1, max_new_tokens=max_tokens)
            return self.engine.generate([token_ids], sampling, [seed])[0][0].token_ids

        def tokenize(self, text: str) -> list[int]:
            return self.engine.tokenizer(text, add_special_tokens=False)["input_ids"]

    actor = EpisodeEngine.remote(str(tiny_model))
    yield actor
    ray.kill(actor)


def test_every_sample_is_the_engine_s_ids_and_the_environment_s_ids_in_order(episode_engine):
    rows, figures, left = ray.get(episode_engine.episodes.remote(PROMPTS))
    feedback = ray.get(episode_engine.tokenize.remote(" ok! "))
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == [(p.index, j) for p in PROMPTS for j in range(N)]
    assert not left  # no turn stays queued in the engine
    for row in rows:
        assert row["prompt_ids"] == ray.get(episode_engine.tokenize.remote(PROMPTS[row["prompt_index"]].text))
        response, turns = row["response_ids"], json.loads(row["turns"])
        expected_ids, expected_mask = [], []
        for t, turn in enumerate(turns):
            a, b = turn["action"]
            prefix = row["prompt_ids"] + response[:a]
            budget = min(5, MAX_LEN - len(prefix))
            generated = ray.get(episode_engine.generate_one.remote(
                prefix, budget, derive_seed(SEED, STEP, row["prompt_index"], row["sample_index"], t)))
            assert response[a:b] == generated, (row["prompt_index"], t)
            c, d = turn["feedback"]
            room = MAX_LEN - len(row["prompt_ids"]) - b
            assert c == b and response[c:d] == ([] if turn["done"] else feedback[:room])
            expected_ids += generated + response[c:d]
            expected_mask += [1] * len(generated) + [0] * (d - c)
        assert response == expected_ids and row["action_mask"] == expected_mask
        assert [lp for lp, m in zip(row["rollout_logprobs"], expected_mask) if not m] == [0.0] * expected_mask.count(0)
        assert all(lp < 0 for lp, m in zip(row["rollout_logprobs"], expected_mask) if m)
        assert row["num_turns"] == len(turns) and 1 <= len(turns) <= 3
        assert row["episode_reward"] == pytest.approx(sum(t["reward"] for t in turns))
        assert row["episode_score"] == turns[-1]["score"]
        assert row["finish_reason"] == ("stop" if turns[-1]["done"] else "length")
    assert figures["agent/failed"] == 0 and figures["agent/turns_mean"] == pytest.approx(
        sum(r["num_turns"] for r in rows) / len(rows))
    again, _, _ = ray.get(episode_engine.episodes.remote(PROMPTS))
    assert [r["response_ids"] for r in again] == [r["response_ids"] for r in rows]  # seeded per turn


def test_an_environment_that_raises_fails_the_stage_naming_the_sample_and_the_turn(episode_engine):
    prompts = [PROMPTS[0], Prompt(1, "hello there", "boom")]
    with pytest.raises(ray.exceptions.RayTaskError) as err:
        ray.get(episode_engine.episodes.remote(prompts))
    assert "the agent's step raised ValueError at prompt 1 (sample " in str(err.value)
    assert "turn 2: the environment broke" in str(err.value)
    rows, figures, left = ray.get(episode_engine.episodes.remote(prompts, skip_failed=True))
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == [(0, 0), (0, 1)]  # its prompt's group goes
    assert figures["agent/failed"] == N and not left


def test_a_hung_environment_fails_at_the_step_timeout(episode_engine):
    import time

    start = time.perf_counter()
    with pytest.raises(ray.exceptions.RayTaskError) as err:
        ray.get(episode_engine.episodes.remote([Prompt(0, "abc", "hang")], timeout_s=0.5))
    assert "did not answer within train.agent_step_timeout_s 0.5 s at prompt 0 (sample " in str(err.value)
    assert time.perf_counter() - start < 10
    rows, _, left = ray.get(episode_engine.episodes.remote(PROMPTS[:1]))  # the engine holds no aborted turn
    assert len(rows) == N and not left


def agent_config(tmp_path: Path, agent: Path, *flags: str):
    """The micro configuration of the integration runs with the agent instead of the demo's reward function."""
    import yaml

    from tests.integration.conftest import MICRO_FLAGS, micro_config

    demo = yaml.safe_load(Path(MICRO_FLAGS[1]).read_text())
    demo["reward"].pop("remote_url")
    demo["train"]["agent_func_path"] = str(agent)
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump(demo))
    return micro_config(tmp_path, "--config", str(config), "--data.max_len", "96", *flags)


def test_a_resumed_agent_run_calls_no_environment_for_committed_episodes(tmp_path, tiny_model, ray_session,
                                                                          prefect_server, monkeypatch):
    """Both steps' episodes are committed before step 2's advantage stage fails; the resumed run replays them:
    every environment was reset once, whichever run asked. The evaluation after step 2 (resumed run) runs its
    episodes: eval prompts are labelled "eval"."""
    from flows.rl_train import rl_train

    calls, evals = tmp_path / "calls.jsonl", tmp_path / "eval.jsonl"
    evals.write_text("".join(json.dumps({"input": text, "label": "eval"}) + "\n" for text in ("ab", "cd", "ef")))
    agent = tmp_path / "counted_agent.py"
    agent.write_text(f"import os\nos.environ['AGENT_CALLS'] = {str(calls)!r}\n" + Path(AGENT).read_text())
    cfg = agent_config(tmp_path, agent, "--train.max_steps", "2", "--train.stage_retries", "0", "--eval.dataset",
                       str(evals), "--eval.steps", "2", "--eval.n_samples_per_prompt", "2")
    monkeypatch.setenv("HYBRID_FAULTS", "raise:2:advantage:start")
    with pytest.raises(Exception, match="InjectedFault|injected"):
        rl_train(cfg, run_id="agent-resume")
    resets = lambda label: [c for c in map(json.loads, calls.read_text().splitlines())  # noqa: E731
                            if c["call"] == "reset" and (c["label"] == "eval") == (label == "eval")]
    assert len(resets("train")) == 2 * 2 * 2 and resets("eval") == []  # steps × batch_size × n_samples_per_prompt
    before = resets("train")
    monkeypatch.delenv("HYBRID_FAULTS")
    result = rl_train(cfg, run_id="agent-resume", resume=True)
    assert result.num_steps == 2 and resets("train") == before and len(resets("eval")) == 3 * 2
    evaluated = pds_table(result.run_dir, 2, "eval")
    assert evaluated.num_rows == 6 and set(evaluated.column("label").to_pylist()) == {"eval"}
    rollout = pds_table(result.run_dir, 2, "rollout")
    assert "action_mask" in rollout.column_names and rollout.num_rows == 4
    metrics = pds_table(result.run_dir, 2, "metrics").to_pylist()[0]
    assert metrics["agent/failed"] == 0 and metrics["agent/turns_mean"] >= 1


def pds_table(run_dir: str, step: int, stage: str):
    from tests.integration.conftest import read_stage

    return read_stage(run_dir, step, stage)
