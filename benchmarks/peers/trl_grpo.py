"""Peer benchmark (issue 17): TRL 1.16's `GRPOTrainer` at our iteration benchmark's shape on one GPU, in one process:
vLLM colocated with sleep mode, bf16 autocast over fp32 master weights (as DeepSpeed's bf16 keeps them), padded
micro-batches, gradient checkpointing, the letters reward as a Python callable, one optimizer step of all the step's
completions, three steps.

Figures (run_all.py's layout, via step_figures): the wall between consecutive optimizer steps (steps 2–3 count) and
per step the seconds of TRL's own phases, each the time of its methods minus the phases nested in them, with the
GPU's queued work finished at every boundary:
  generation   `_generate`: vLLM wake, generate, sleep, decode (weight_sync excluded)
  weight_sync  `vllm_generation.sync_weights`, inside generation
  reward       `_calculate_rewards`
  logprobs     `_get_per_token_logps_and_entropies` without grad: the old and the reference logprobs
  experience   the rest of `_prepare_inputs` / `_generate_and_score_completions` (padding, advantages, metrics)
  update       `training_step` (forward and backward of every micro-batch) less the above
  optimizer    from `on_pre_optimizer_step` to `on_optimizer_step`
  other        the wall less all of these (gradient clipping, logging, the dataloader)
Usage (on the GPU machine, wheels from fetch_wheels.sh installed; see run_peers.sh):
  python3 benchmarks/peers/trl_grpo.py --model DIR --out FILE.json [--git-sha SHA] [--config FILE.yaml]
  (--config benchmarks/configs/h200-grpo-4b.yaml with the 4B stand-in: issue 48's GRPO shape, group std)
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration_shape import ITERATION_CONFIG, IterationShape, read_iteration_shape  # noqa: E402
from step_figures import open_results, record_steps  # noqa: E402

HOW = ("TRL GRPOTrainer in one process: use_vllm, vllm_mode=colocate, vllm_enable_sleep_mode (level 2), fp32 master "
       "weights with bf16 autocast, padded micro-batches, {checkpointing}, TRL's default vLLM importance "
       "sampling correction (so the old logprobs are computed), loss_type dapo, scale_rewards {scale} ({meaning}), "
       "beta = our KL coefficient (TRL's k3 estimator as a loss)")
# our advantage estimator → TRL's scale_rewards and what it means; TRL always subtracts the group's mean
SCALE_REWARDS = {"reinforce_baseline": ("batch", "group mean, batch std: OpenRLHF's reinforce_baseline"),
                 "group_norm": ("group", "group mean, group std: OpenRLHF's group_norm")}


def scale_rewards(shape: IterationShape) -> str:
    """TRL's `scale_rewards` for the shape's advantage estimator; refuses one TRL has no match for."""
    if shape.advantage_estimator not in SCALE_REWARDS:
        raise ValueError(f"TRL has no advantage like our {shape.advantage_estimator!r}: the peer runs "
                         f"{', '.join(SCALE_REWARDS)}")
    return SCALE_REWARDS[shape.advantage_estimator][0]


def how_trl_runs(shape: IterationShape) -> str:
    """HOW with the shape's advantage mapping and checkpointing filled in."""
    scale, meaning = SCALE_REWARDS[shape.advantage_estimator]
    return HOW.format(scale=scale, meaning=meaning, checkpointing=shape.checkpointing_words)


def grpo_config_kwargs(shape: IterationShape, output_dir: Path, model_dtype: str = "float32") -> dict:
    """GRPOConfig's arguments for `shape` (TRL 1.16 / transformers 5 field names): one generation batch of
    prompts × samples completions per optimizer step, in micro-batches of the shape's size."""
    return {
        "output_dir": str(output_dir), "max_steps": shape.num_steps, "seed": shape.seed,
        "per_device_train_batch_size": shape.micro_batch_size,
        "gradient_accumulation_steps": shape.gradient_accumulation_steps,
        "num_generations": shape.samples_per_prompt, "max_completion_length": shape.max_new_tokens,
        "temperature": shape.temperature, "top_p": 1.0,
        "learning_rate": shape.lr, "lr_scheduler_type": shape.lr_scheduler, "warmup_steps": 0, "max_grad_norm": 1.0,
        "beta": shape.kl_coef, "loss_type": "dapo", "scale_rewards": scale_rewards(shape),
        "bf16": shape.param_dtype == "bf16", "gradient_checkpointing": shape.gradient_checkpointing,
        "model_init_kwargs": {"dtype": model_dtype},
        "use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": True,
        "vllm_gpu_memory_utilization": shape.vllm_gpu_memory_utilization, "vllm_max_model_length": shape.max_len,
        "logging_steps": 1, "save_strategy": "no", "report_to": "none", "log_completions": False,
    }


def prompt_rows(shape: IterationShape) -> list[dict]:
    """The prompt file as TRL's conversational rows (TRL applies the tokenizer's chat template, as our
    data.apply_chat_template does), each with its label for the reward."""
    rows = [json.loads(line) for line in shape.prompt_file.read_text().splitlines() if line.strip()]
    return [{"prompt": [{"role": "user", "content": row[shape.input_key]}], "label": row[shape.label_key]}
            for row in rows]


def letters_reward_callable(reward_file: Path):
    """TRL's reward callable around the reward file's `reward_func(queries, prompts, labels)`: a query is the
    completion after the assistant header, which is all the file reads of it."""
    spec = importlib.util.spec_from_file_location("peer_reward_file", reward_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def letters_reward(prompts, completions, label, **kwargs) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        queries = [module.ASSISTANT_HEADER + text for text in texts]
        return module.reward_func(queries, prompts, label)["rewards"].tolist()

    return letters_reward


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


class PhaseClock:
    """Seconds per phase since the last `take()`; a phase's seconds exclude the phases nested in it, so the phases
    of a step add up to the time they cover. The device's queued work is finished at every boundary, so GPU time
    lands in the phase that queued it."""

    def __init__(self, now=time.perf_counter, sync=synchronize):
        self.now, self.sync = now, sync
        self.seconds: dict[str, float] = {}
        self._open: list[list] = []  # [name, start, seconds of nested phases]

    def enter(self, name: str) -> None:
        self.sync()
        self._open.append([name, self.now(), 0.0])

    def exit(self) -> None:
        self.sync()
        name, start, nested = self._open.pop()
        total = self.now() - start
        self.seconds[name] = self.seconds.get(name, 0.0) + total - nested
        if self._open:
            self._open[-1][2] += total

    @contextmanager
    def phase(self, name: str):
        self.enter(name)
        try:
            yield
        finally:
            self.exit()

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)
        return timed

    def take(self) -> dict[str, float]:
        seconds, self.seconds = self.seconds, {}
        return seconds


def timed_trainer_class(base, clock: PhaseClock):
    """`base` (GRPOTrainer) with its phase methods timed by `clock`."""
    import torch

    class TimedGRPOTrainer(base):
        def training_step(self, *args, **kwargs):
            with clock.phase("update"):
                return super().training_step(*args, **kwargs)

        def _prepare_inputs(self, *args, **kwargs):
            with clock.phase("experience"):
                return super()._prepare_inputs(*args, **kwargs)

        def _generate(self, *args, **kwargs):
            with clock.phase("generation"):
                return super()._generate(*args, **kwargs)

        def _calculate_rewards(self, *args, **kwargs):
            with clock.phase("reward"):
                return super()._calculate_rewards(*args, **kwargs)

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            with clock.phase("update" if torch.is_grad_enabled() else "logprobs"):
                return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    return TimedGRPOTrainer


class StepRecorder:
    """Per optimizer step: the wall since the previous step ended (step 1: since training began) and the clock's
    phases, written to the results after every step."""

    def __init__(self, clock: PhaseClock, results, now=time.perf_counter):
        self.clock, self.results, self.now = clock, results, now
        self.walls: dict[int, float] = {}
        self.stages: dict[int, dict[str, float]] = {}
        self.last_end: float | None = None

    def begin(self) -> None:
        self.clock.sync()
        self.clock.take()
        self.last_end = self.now()

    def end_step(self, step: int) -> None:
        self.clock.sync()
        ended = self.now()
        self.walls[step], self.last_end = ended - self.last_end, ended
        self.stages[step] = self.clock.take()
        record_steps(self.results, self.walls, self.stages)


def step_callback(callback_base, recorder: StepRecorder):
    """A transformers TrainerCallback feeding `recorder` and timing the optimizer step."""

    class StepTimes(callback_base):
        def on_train_begin(self, args, state, control, **kwargs):
            recorder.begin()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            recorder.clock.enter("optimizer")

        def on_optimizer_step(self, args, state, control, **kwargs):
            recorder.clock.exit()

        def on_step_end(self, args, state, control, **kwargs):
            recorder.end_step(state.global_step)

    return StepTimes()


def run_trl(args, shape: IterationShape, results) -> None:
    for key, value in {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
                       "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
        os.environ.setdefault(key, value)
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    clock = PhaseClock()
    recorder = StepRecorder(clock, results)
    started = time.perf_counter()
    trainer = timed_trainer_class(GRPOTrainer, clock)(
        model=str(args.model), reward_funcs=[letters_reward_callable(shape.reward_file)],
        args=GRPOConfig(**grpo_config_kwargs(shape, args.work_dir, args.model_dtype)),
        train_dataset=Dataset.from_list(prompt_rows(shape)), callbacks=[step_callback(TrainerCallback, recorder)])
    vllm_generation = trainer.vllm_generation
    vllm_generation.sync_weights = clock.wrap("weight_sync", vllm_generation.sync_weights)
    results.figure("startup_s", time.perf_counter() - started, note="GRPOTrainer(...): model, vLLM engine, optimizer")
    trainer.train()


def _cut_off(signum, frame):
    raise SystemExit(f"cut off by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path, help="the random-weight stand-in (build_tiny_model.py)")
    parser.add_argument("--out", required=True, type=Path, help="results JSON, rewritten after every step")
    parser.add_argument("--git-sha", default=os.environ.get("GIT_SHA", "unknown"))
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/peer-trl"), help="TRL's output_dir")
    parser.add_argument("--config", type=Path, default=ITERATION_CONFIG,
                        help="our benchmark config whose shape TRL copies (default: the 1.7B iteration's)")
    parser.add_argument("--model-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the trained weights' dtype (float32: bf16 autocast over fp32 master weights)")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"--model {args.model} has no config.json: build the stand-in first "
                         f"(python3 data/build_tiny_model.py --standin Qwen/Qwen3-1.7B {args.model} --device cuda)")
    shape = read_iteration_shape(args.config)
    results = open_results(args.out, peer="trl", how=how_trl_runs(shape) + f"; trained weights {args.model_dtype}",
                           model_dir=args.model, shape=shape, git_sha=args.git_sha,
                           packages=("trl", "accelerate", "datasets"))
    signal.signal(signal.SIGTERM, _cut_off)  # `timeout` ends the run: record why before exiting
    try:
        run_trl(args, shape, results)
    except BaseException as error:
        results.data["errors"]["trl"] = f"{type(error).__name__}: {error}"[-2000:]
        results.write()
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
