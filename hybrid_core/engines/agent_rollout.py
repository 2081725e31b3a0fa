"""Multi-turn agent episodes on the rollout engine: one environment per sample, every turn token in, token out.

Owns an episode's tokens (the prompt as the environment's `reset` returned it, tokenised once; then each turn's
generated ids exactly as the engine gave them and the environment's feedback tokenised once when appended), its
action mask (1 on generated tokens only), the per-turn budget (`data.max_len` minus the episode's length so far,
OpenRLHF's rule, lowered by the environment's `sampling_params.max_tokens` if it asks), per-turn seeds
(derive_seed of run seed, step, prompt, sample and turn), environment timeouts and failures, and running every
episode at once: each turn is a request of its own, so the engine batches the turns of all live episodes
continuously while environments answer the others. Rows and their schema are `agent_rows`; it knows nothing of
Ray, the store or rewards beyond the agent's answers.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

import pyarrow as pa

from hybrid_core.data.prompts import Prompt, format_prompt
from hybrid_core.data.stage_tables import agent_rollout_table
from hybrid_core.engines.vllm_rollout import Completion, SamplingSettings, VllmRolloutEngine
from hybrid_core.rewards.agents import AgentExecutorBase, AgentFileError, AgentInstanceBase, AgentStep, checked_step
from hybrid_core.step_contract import derive_seed
from hybrid_core.types import PermanentError

logger = logging.getLogger(__name__)


class AgentEpisodeError(RuntimeError):
    """An environment raised or hung: the stage fails naming the sample and the turn (Prefect may retry it)."""


class AgentAnswerError(PermanentError, AgentEpisodeError):
    """An environment answered what the interface does not allow: retrying cannot help."""


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """`train.agent_*` and the token budget of an episode."""

    path: str
    step_timeout_s: float
    skip_failed: bool
    max_len: int


@dataclass
class Episode:
    """One sample's episode as it runs; `response_ids` is everything after the prompt, generated or not."""

    prompt: Prompt
    sample_index: int
    instance: AgentInstanceBase
    prompt_ids: list[int] = field(default_factory=list)
    prompt_text: str = ""
    text: str = ""  # the observation so far: prompt, then every action and feedback text
    response_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    sampling_params: dict = field(default_factory=dict)
    finish_reason: str = "stop"
    feedback_truncated: int = 0
    error: str | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def request_id(self) -> str:
        return f"agent-{self.prompt.index}-{self.sample_index}-{len(self.turns)}"

    def where(self) -> str:
        return f"prompt {self.prompt.index} (sample {self.sample_index}), turn {len(self.turns) + 1}"


@dataclass(frozen=True, kw_only=True)
class EpisodeRun:
    """What runs the step's episodes: the engine, its tokenizer, the agent, the sampling and the seeds."""

    engine: VllmRolloutEngine
    tokenizer: object
    executor: AgentExecutorBase
    settings: AgentSettings
    sampling: SamplingSettings
    seed: int
    step: int | str


async def _call(run: EpisodeRun, episode: Episode, what: str, coroutine):
    """An environment call under `train.agent_step_timeout_s`; a raise or a hang names the sample and the turn."""
    try:
        return await asyncio.wait_for(coroutine, run.settings.step_timeout_s)
    except asyncio.TimeoutError:
        raise AgentEpisodeError(f"the agent's {what} did not answer within train.agent_step_timeout_s "
                                f"{run.settings.step_timeout_s:g} s at {episode.where()}; raise the timeout or fix "
                                f"{run.settings.path}") from None
    except AgentFileError as err:
        raise AgentAnswerError(f"the agent's {what} at {episode.where()}: {err}") from None
    except Exception as err:  # noqa: BLE001 — the user's environment: any failure is the sample's
        raise AgentEpisodeError(f"the agent's {what} raised {type(err).__name__} at {episode.where()}: "
                                f"{err}") from err


async def _reset(run: EpisodeRun, episode: Episode, prompt_text: str) -> None:
    answer = await _call(run, episode, "reset", episode.instance.reset({"observation": prompt_text,
                                                                        "label": episode.prompt.label}))
    observation = answer.get("observation") if isinstance(answer, dict) else None
    if not isinstance(observation, str):
        raise AgentAnswerError(f"the agent's reset at {episode.where()} returned no observation string: got "
                               f"{answer!r:.200}; return {{'observation': text}}")
    if isinstance(answer.get("sampling_params"), dict):  # ours: the first turn's, as a step's answer sets the next
        episode.sampling_params = dict(answer["sampling_params"])
    ids = run.tokenizer(observation, add_special_tokens=False)["input_ids"]
    budget = max(1, run.settings.max_len - 1)
    episode.prompt_ids, episode.prompt_text, episode.text = ids[-budget:], observation, observation


def _turn_budget(run: EpisodeRun, episode: Episode) -> int:
    remaining = run.settings.max_len - episode.length
    asked = episode.sampling_params.get("max_tokens")
    return min(remaining, int(asked)) if isinstance(asked, (int, float)) and asked > 0 else remaining


def _submit(run: EpisodeRun, episode: Episode) -> bool:
    """Queue the episode's next turn; False when no token fits (the episode ends at max_len)."""
    budget = _turn_budget(run, episode)
    if budget <= 0:
        episode.finish_reason = "length"
        return False
    seed = derive_seed(run.seed, run.step, episode.prompt.index, episode.sample_index, len(episode.turns)) \
        if run.sampling.seed_per_prompt else None
    run.engine.submit_turn(episode.request_id, episode.prompt_ids + episode.response_ids, run.sampling, budget, seed)
    return True


def _append_action(episode: Episode, completion: Completion) -> dict:
    start = len(episode.response_ids)
    episode.response_ids += completion.token_ids
    episode.action_mask += [1] * len(completion.token_ids)
    if completion.logprobs is None:
        episode.logprobs = None
    elif episode.logprobs is not None:
        episode.logprobs += completion.logprobs
    episode.text += completion.text
    return {"action": [start, len(episode.response_ids)], "action_text": completion.text,
            "finish_reason": completion.finish_reason}


def _append_feedback(run: EpisodeRun, episode: Episode, turn: dict, answer: AgentStep) -> None:
    """The feedback's tokens (tokenised once, here) after the action, cut at max_len (counted) and masked out."""
    ids = run.tokenizer(answer.feedback, add_special_tokens=False)["input_ids"] if answer.feedback else []
    room = max(0, run.settings.max_len - episode.length)
    turn["feedback_truncated"] = len(ids) > room
    if len(ids) > room:
        episode.feedback_truncated += 1
        ids = ids[:room]
    start = len(episode.response_ids)
    episode.response_ids += ids
    episode.action_mask += [0] * len(ids)
    if episode.logprobs is not None:
        episode.logprobs += [0.0] * len(ids)
    episode.text += answer.feedback
    turn |= {"feedback": [start, len(episode.response_ids)], "feedback_text": answer.feedback,
             "reward": answer.reward, "score": answer.score,
             "extra_logs": answer.extra_logs, "done": answer.done}
    episode.turns.append(turn)
    if answer.sampling_params:
        episode.sampling_params = dict(answer.sampling_params)


async def _step(run: EpisodeRun, episode: Episode, completion: Completion) -> bool:
    """The environment's answer to one generated turn; True when the episode goes on."""
    observation = episode.text
    turn = _append_action(episode, completion)
    states = {"observation_text": observation, "action_text": completion.text, "label": episode.prompt.label,
              "sampling_params": dict(episode.sampling_params)}
    answer = await _call(run, episode, "step", episode.instance.step(states))
    try:
        answer = checked_step(answer)
    except AgentFileError as err:
        raise AgentAnswerError(f"the agent's step at {episode.where()}: {err}") from None
    _append_feedback(run, episode, turn, answer)
    return not answer.done


def _new_episodes(run: EpisodeRun, prompts: list[Prompt]) -> list[Episode]:
    """n episodes a prompt, prompt-major (a prompt's samples are contiguous), each with its own environment."""
    return [Episode(prompt=prompt, sample_index=j, instance=run.executor.new_instance())
            for prompt in prompts for j in range(run.sampling.n)]


def _fail(run: EpisodeRun, episode: Episode, err: AgentEpisodeError) -> None:
    """`train.agent_skip_failed`: the episode is marked and dropped later; otherwise the stage fails with it."""
    if not run.settings.skip_failed or isinstance(err, AgentAnswerError):
        raise err
    logger.warning("dropping %s: %s", episode.where(), err)
    episode.error = str(err)


async def _start(run: EpisodeRun, episodes: list[Episode], prompt_texts: list[str]) -> list[Episode]:
    """Reset every environment at once; the episodes whose first turn is queued."""
    texts = [text for text in prompt_texts for _ in range(run.sampling.n)]
    results = await asyncio.gather(*(_reset(run, e, t) for e, t in zip(episodes, texts)), return_exceptions=True)
    live = []
    for episode, result in zip(episodes, results):
        if isinstance(result, AgentEpisodeError):
            _fail(run, episode, result)
        elif isinstance(result, BaseException):
            raise result
        elif _submit(run, episode):
            live.append(episode)
    return live


async def _drive(run: EpisodeRun, episodes: list[Episode], prompt_texts: list[str]) -> None:
    """Engine steps and environment answers interleaved until every episode ended: a finished turn goes to its
    environment at once, and its next turn is queued as soon as the answer comes."""
    by_request = {e.request_id: e for e in await _start(run, episodes, prompt_texts)}
    answering: dict[asyncio.Task, Episode] = {}
    while by_request or answering:
        if run.engine.has_turns():
            for request_id, completion in run.engine.finished_turns():
                episode = by_request.pop(request_id)
                answering[asyncio.ensure_future(_step(run, episode, completion))] = episode
            await asyncio.sleep(0)
        elif answering:
            await asyncio.wait(answering, return_when=asyncio.FIRST_COMPLETED)
        else:
            raise RuntimeError(f"the rollout engine holds none of the {len(by_request)} queued agent turns")
        for task in [t for t in answering if t.done()]:
            episode = answering.pop(task)
            if task.exception() is None:
                if task.result() and _submit(run, episode):
                    by_request[episode.request_id] = episode
            elif isinstance(task.exception(), AgentEpisodeError):
                _fail(run, episode, task.exception())
            else:
                raise task.exception()


def run_episodes(run: EpisodeRun, prompts: list[Prompt], prompt_texts: list[str]) -> list[Episode]:
    """Every episode of `prompts` (the formatted prompt texts the environments' `reset` sees), prompt-major."""
    episodes = _new_episodes(run, prompts)
    try:
        asyncio.run(_drive(run, episodes, prompt_texts))
    except BaseException:
        run.engine.abort_turns()
        raise
    return episodes


def _row(episode: Episode, response_text: str, policy_version: int) -> dict:
    rewards = [turn["reward"] for turn in episode.turns]
    return {"prompt_index": episode.prompt.index, "sample_index": episode.sample_index,
            "prompt_ids": episode.prompt_ids, "response_ids": episode.response_ids,
            "prompt_text": episode.prompt_text, "response_text": response_text, "rollout_logprobs": episode.logprobs,
            "finish_reason": episode.finish_reason, "label": episode.prompt.label, "policy_version": policy_version,
            "data_source": episode.prompt.source, "action_mask": episode.action_mask,
            "turns": json.dumps(episode.turns, sort_keys=True), "num_turns": len(episode.turns),
            "episode_reward": float(sum(rewards)),
            "episode_score": float(episode.turns[-1]["score"]) if episode.turns else 0.0}


def episode_figures(episodes: list[Episode]) -> dict[str, float]:
    """The stage's agent counters: samples failed (dropped), feedback cut at max_len, turns per episode."""
    kept = [e for e in episodes if e.error is None]
    return {"agent/failed": float(len(episodes) - len(kept)),
            "agent/feedback_truncated": float(sum(e.feedback_truncated for e in episodes)),
            "agent/turns_mean": sum(len(e.turns) for e in kept) / len(kept) if kept else 0.0}


def agent_rows(episodes: list[Episode], tokenizer, policy_version: int) -> pa.Table:
    """The rollout rows of the episodes, prompt-major. A prompt with a failed (skipped) sample loses its whole
    group, so that every group the advantage stage sees has its n samples."""
    failed = {e.prompt.index for e in episodes if e.error is not None}
    kept = [e for e in episodes if e.prompt.index not in failed]
    texts = tokenizer.batch_decode([e.response_ids for e in kept], skip_special_tokens=True) if kept else []
    return agent_rollout_table([_row(e, text, policy_version) for e, text in zip(kept, texts)])


FIGURES_KEY = b"agent_figures"  # the rollout table's schema metadata: this share's `episode_figures`


def generate_episode_rows(run: EpisodeRun, prompts: list[Prompt], apply_chat_template: bool,
                          input_template: str | None, policy_version: int) -> pa.Table:
    """The rollout rows of `prompts`' episodes, with their `episode_figures` in the schema metadata."""
    texts = [format_prompt(p.text, run.tokenizer, apply_chat_template, input_template) for p in prompts]
    episodes = run_episodes(run, prompts, texts)
    table = agent_rows(episodes, run.tokenizer, policy_version)
    return table.replace_schema_metadata({FIGURES_KEY: json.dumps(episode_figures(episodes)).encode()})


def summed_figures(tables: list[pa.Table]) -> dict[str, float]:
    """The step's agent figures from its shares' tables: counts added, the turn mean weighted by rows."""
    figures = [json.loads((t.schema.metadata or {}).get(FIGURES_KEY, b"{}")) for t in tables]
    rows = sum(t.num_rows for t in tables)
    turns = sum(f.get("agent/turns_mean", 0.0) * t.num_rows for f, t in zip(figures, tables))
    return {"agent/failed": sum(f.get("agent/failed", 0.0) for f in figures),
            "agent/feedback_truncated": sum(f.get("agent/feedback_truncated", 0.0) for f in figures),
            "agent/turns_mean": turns / rows if rows else 0.0}
