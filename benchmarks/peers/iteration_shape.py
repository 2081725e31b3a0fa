"""The shape the peer benchmarks copy from our iteration benchmark, read from benchmarks/configs/h200-iteration.yaml
so that a change there reaches TRL's and OpenRLHF's runs too: prompts and samples per step, lengths, batch sizes,
optimiser, KL, vLLM's share of the GPU, the prompt file and the reward file.

Owns reading and checking that file; knows nothing about TRL or OpenRLHF (each peer script maps the shape onto its
own arguments).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ITERATION_CONFIG = REPO_ROOT / "benchmarks" / "configs" / "h200-iteration.yaml"


@dataclass(frozen=True)
class IterationShape:
    """One colocated iteration as our benchmark runs it: `prompts_per_step` × `samples_per_prompt` completions of
    `max_new_tokens`, one optimizer step over all of them in micro-batches of `micro_batch_size` samples (or
    `max_tokens_per_gpu` packed tokens), `num_steps` steps."""

    prompts_per_step: int
    samples_per_prompt: int
    max_new_tokens: int
    max_len: int
    temperature: float
    train_batch_size: int
    micro_batch_size: int
    max_tokens_per_gpu: int
    num_steps: int
    seed: int
    lr: float
    lr_scheduler: str
    gradient_checkpointing: bool
    zero_stage: int
    param_dtype: str
    kl_coef: float
    kl_estimator: str
    advantage_estimator: str
    vllm_gpu_memory_utilization: float
    prompt_file: Path
    input_key: str
    label_key: str
    reward_file: Path

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.train_batch_size // self.micro_batch_size

    @property
    def checkpointing_words(self) -> str:
        """How a peer's description names its activation checkpointing."""
        return "gradient checkpointing" if self.gradient_checkpointing else "no gradient checkpointing"


def read_iteration_shape(config_path: Path = ITERATION_CONFIG) -> IterationShape:
    """The shape of `config_path` (our iteration benchmark's YAML); refuses one the peers cannot copy."""
    import yaml

    tree = yaml.safe_load(Path(config_path).read_text())
    actor, rollout, train, data = tree["actor"], tree["rollout"], tree["train"], tree["data"]
    shape = IterationShape(
        prompts_per_step=rollout["batch_size"], samples_per_prompt=rollout["n_samples_per_prompt"],
        max_new_tokens=rollout["max_new_tokens"], max_len=data["max_len"], temperature=rollout["temperature"],
        train_batch_size=train["batch_size"], micro_batch_size=train["micro_batch_size"],
        max_tokens_per_gpu=train["max_tokens_per_gpu"], num_steps=train["max_steps"], seed=train["seed"],
        lr=actor["adam"]["lr"], lr_scheduler=actor["lr_scheduler"],
        gradient_checkpointing=actor["gradient_checkpointing_enable"], zero_stage=tree["ds"]["zero_stage"],
        param_dtype=tree["ds"]["param_dtype"], kl_coef=tree["algo"]["kl"]["init_coef"],
        kl_estimator=tree["algo"]["kl"]["estimator"], advantage_estimator=tree["algo"]["advantage"]["estimator"],
        vllm_gpu_memory_utilization=tree["vllm"]["gpu_memory_utilization"],
        prompt_file=REPO_ROOT / data["prompt_dataset"], input_key=data["input_key"], label_key=data["label_key"],
        reward_file=REPO_ROOT / tree["reward"]["remote_url"])
    _check(shape, config_path)
    return shape


def _check(shape: IterationShape, config_path: Path) -> None:
    """The peers run one optimizer step per rollout batch (TRL: one generation batch per optimizer step), so the
    train batch must be the whole rollout batch and split into whole micro-batches."""
    if shape.train_batch_size != shape.samples_per_step:
        raise ValueError(f"{config_path}: train.batch_size must equal rollout.batch_size × n_samples_per_prompt for "
                         f"the peer benchmarks (one optimizer step a rollout): got {shape.train_batch_size} and "
                         f"{shape.prompts_per_step} × {shape.samples_per_prompt}")
    if shape.train_batch_size % shape.micro_batch_size:
        raise ValueError(f"{config_path}: train.micro_batch_size must divide train.batch_size: got "
                         f"{shape.micro_batch_size} and {shape.train_batch_size}")
    for path in (shape.prompt_file, shape.reward_file):
        if not path.is_file():
            raise FileNotFoundError(f"{config_path} names {path}, which does not exist")
