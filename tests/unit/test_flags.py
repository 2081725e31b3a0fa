"""Flags and YAML into RunConfig: the seed recipe verbatim, suggestions for typos, overrides, round trips."""
import shlex

import pytest

from hybrid_core.config import RunConfig, changed_fields, leaf_values
from hybrid_core.flags import (ConfigError, config_from_dict, config_to_yaml, flag_names, load_config_file,
                               parse_cli)

# Verbatim from the spec's launch recipe (seed/hybrid-engine.md), everything after `train_ppo_ray`.
SEED_RECIPE = r"""
   --actor.model_name_or_path Qwen/Qwen3-4B-Thinking-2507 \
   --reward.remote_url examples/python/math_reward_func.py \
   --data.prompt_dataset zhuzilin/dapo-math-17k \
   --data.input_key prompt \
   --data.label_key label \
   --data.apply_chat_template \
   --ds.packing_samples \
   \
   --ref.num_nodes 1 \
   --ref.num_gpus_per_node 4 \
   --actor.num_nodes 1 \
   --actor.num_gpus_per_node 4 \
   --vllm.num_engines 2 \
   --vllm.tensor_parallel_size 2 \
   --train.colocate_all \
   --vllm.gpu_memory_utilization 0.7 \
   --vllm.enable_sleep \
   --ds.enable_sleep \
   --vllm.sync_backend nccl \
   --vllm.enforce_eager \
   \
   --algo.advantage.estimator reinforce_baseline \
   --algo.kl.use_loss \
   --algo.kl.estimator k2 \
   --algo.kl.init_coef 1e-5 \
   --actor.entropy_coef 0.0 \
   --algo.advantage.is_correction_enable \
   --algo.advantage.is_correction_type icepop \
   \
   --rollout.batch_size 128 \
   --rollout.n_samples_per_prompt 8 \
   --train.batch_size 1024 \
   --algo.dynamic_filtering_enable \
   --algo.dynamic_filtering_range 0.0 1.0 \
   --train.dynamic_batch_enable \
   --train.max_tokens_per_gpu 16192 \
   --rollout.max_tokens_per_gpu 32768 \
   --train.micro_batch_size 1 \
   --rollout.micro_batch_size 8 \
   --data.max_len 74240 \
   --rollout.max_new_tokens 64000 \
   --data.max_samples 128000 \
   --train.max_epochs 1 \
   --train.num_episodes 1 \
   \
   --ds.zero_stage 3 \
   --ds.param_dtype bf16 \
   --actor.gradient_checkpointing_enable \
   --ds.ring_attn_size 2 \
   --ds.ring_attn_head_stride 2 \
   --actor.adam.lr 5e-7 \
   \
   --ckpt.output_dir ./exp/Qwen3-4B-Thinking \
   --ckpt.path ./exp/Qwen3-4B-Thinking/ckpt \
   --ckpt.save_hf \
   --ckpt.max_num 3 \
   --ckpt.save_steps 10 \
   --logger.logging_steps 1 \
   --eval.steps -1
"""
SEED_ARGV = shlex.split(SEED_RECIPE.replace("\\\n", " "))

# Every flag of the recipe with its typed value, written out by hand.
SEED_VALUES = {
    "actor.model_name_or_path": "Qwen/Qwen3-4B-Thinking-2507", "actor.num_nodes": 1, "actor.num_gpus_per_node": 4,
    "actor.entropy_coef": 0.0, "actor.gradient_checkpointing_enable": True, "actor.adam.lr": 5e-7,
    "reward.remote_url": "examples/python/math_reward_func.py",
    "data.prompt_dataset": "zhuzilin/dapo-math-17k", "data.input_key": "prompt", "data.label_key": "label",
    "data.apply_chat_template": True, "data.max_len": 74240, "data.max_samples": 128000,
    "ds.packing_samples": True, "ds.enable_sleep": True, "ds.zero_stage": 3, "ds.param_dtype": "bf16",
    "ds.ring_attn_size": 2, "ds.ring_attn_head_stride": 2,
    "ref.num_nodes": 1, "ref.num_gpus_per_node": 4,
    "vllm.num_engines": 2, "vllm.tensor_parallel_size": 2, "vllm.gpu_memory_utilization": 0.7,
    "vllm.enable_sleep": True, "vllm.sync_backend": "nccl", "vllm.enforce_eager": True,
    "train.colocate_all": True, "train.batch_size": 1024, "train.dynamic_batch_enable": True,
    "train.max_tokens_per_gpu": 16192, "train.micro_batch_size": 1, "train.max_epochs": 1, "train.num_episodes": 1,
    "algo.advantage.estimator": "reinforce_baseline", "algo.kl.use_loss": True, "algo.kl.estimator": "k2",
    "algo.kl.init_coef": 1e-5, "algo.advantage.is_correction_enable": True,
    "algo.advantage.is_correction_type": "icepop", "algo.dynamic_filtering_enable": True,
    "algo.dynamic_filtering_range": (0.0, 1.0),
    "rollout.batch_size": 128, "rollout.n_samples_per_prompt": 8, "rollout.max_tokens_per_gpu": 32768,
    "rollout.micro_batch_size": 8, "rollout.max_new_tokens": 64000,
    "ckpt.output_dir": "./exp/Qwen3-4B-Thinking", "ckpt.path": "./exp/Qwen3-4B-Thinking/ckpt", "ckpt.save_hf": True,
    "ckpt.max_num": 3, "ckpt.save_steps": 10, "logger.logging_steps": 1, "eval.steps": -1,
}
# Recipe flags that restate the OpenRLHF default, so they do not count as changed.
SEED_DEFAULTS = {"actor.num_nodes", "ref.num_nodes", "ds.param_dtype", "vllm.sync_backend",
                 "train.max_tokens_per_gpu", "train.micro_batch_size", "train.max_epochs", "train.num_episodes",
                 "algo.dynamic_filtering_range", "ckpt.max_num", "logger.logging_steps", "eval.steps"}


def problems_of(argv: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_cli(argv)
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


def test_seed_recipe_parses_to_the_expected_values():
    assert len(SEED_ARGV) == 97  # 54 flags, 43 values
    assert sorted(t[2:] for t in SEED_ARGV if t.startswith("--")) == sorted(SEED_VALUES)
    cfg = parse_cli(SEED_ARGV)
    values = leaf_values(cfg)
    got = {path: values[path] for path in SEED_VALUES}
    assert got == SEED_VALUES
    assert {path: type(value) for path, value in got.items()} == {p: type(v) for p, v in SEED_VALUES.items()}
    assert set(changed_fields(cfg)) == set(SEED_VALUES) - SEED_DEFAULTS


def test_seed_recipe_namespaces_dump_as_typed_dicts():
    dump = parse_cli(SEED_ARGV).model_dump()
    assert dump["ref"] == {"num_nodes": 1, "num_gpus_per_node": 4, "offload": False}
    assert dump["vllm"] == {"num_engines": 2, "tensor_parallel_size": 2, "sync_backend": "nccl",
                            "sync_with_ray": False, "enable_prefix_caching": False, "enforce_eager": True,
                            "enable_sleep": True, "gpu_memory_utilization": 0.7, "sync_bucket_mb": 1024,
                            "sleep_level": 1, "max_num_seqs": None,
                            "attention_backend": None, "block_size": None, "kv_cache_dtype": "auto",
                            "executor_backend": None, "engine_core_process": False}
    assert dump["algo"] == {
        "advantage": {"estimator": "reinforce_baseline", "gamma": 1.0, "lambd": 1.0, "no_std_norm": False,
                      "is_correction_enable": True, "is_correction_threshold": (0.5, 5.0),
                      "is_correction_type": "icepop"},
        "kl": {"init_coef": 1e-5, "target": None, "horizon": 10000, "estimator": "k2", "use_loss": True},
        "dynamic_filtering_enable": True, "dynamic_filtering_range": (0.0, 1.0)}
    assert dump["rollout"] == {"batch_size": 128, "n_samples_per_prompt": 8, "micro_batch_size": 8,
                               "vllm_generate_batch_size": None, "max_new_tokens": 64000,
                               "max_tokens_per_gpu": 32768, "temperature": 1.0, "top_p": 1.0,
                               "seed_per_prompt": True, "logprobs": None}  # None: the correction above asks


def test_flag_typo_suggests_the_closest_flag():
    assert problems_of(["--vllm.enable_slep"]) == [
        "--vllm.enable_slep is not a flag: got '--vllm.enable_slep'; did you mean --vllm.enable_sleep?"]
    assert "did you mean --actor.adam.lr?" in problems_of(["--actor.adam_lr", "1e-6"])[0]


def test_sleep_with_async_fails_naming_both_flags():
    problems = problems_of(["--vllm.enable_sleep", "--train.async_enable", "--train.colocate_all"])
    assert len(problems) == 1
    assert "vllm.enable_sleep" in problems[0] and "train.async_enable" in problems[0]
    assert "drop --vllm.enable_sleep or --train.async_enable" in problems[0]


def test_value_kinds():
    cfg = parse_cli(["--actor.adam.betas", "0.8", "0.99", "--actor.muon.no_nesterov", "--vllm.sleep_level", "2",
                     "--ds.lora.target_modules", "q_proj", "v_proj", "--reward.clip_range", "-5", "5",
                     "--train.seed=7", "--vllm.enforce_eager=false", "--ds.enable_sleep=true",
                     "--actor.eps_clip_low_high=0.2,0.28", "--rollout.max_new_tokens", "None",
                     "--critic.adam.lr", "1e-5", "--data.input_template", "Q: {} A:"])
    assert cfg.actor.adam.betas == (0.8, 0.99) and cfg.actor.muon.nesterov is False
    assert cfg.vllm.sleep_level == 2 and cfg.ds.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.reward.clip_range == (-5.0, 5.0) and cfg.train.seed == 7
    assert cfg.vllm.enforce_eager is False and cfg.ds.enable_sleep is True
    assert cfg.actor.eps_clip_low_high == (0.2, 0.28) and cfg.rollout.max_new_tokens is None
    assert cfg.critic.adam.lr == 1e-5 and isinstance(cfg.critic.adam.lr, float)
    assert cfg.data.input_template == "Q: {} A:"
    # a three-way switch: unset (the default: Liger on CUDA where it applies), required, off
    assert parse_cli([]).ds.use_liger_kernel is None
    assert parse_cli(["--ds.use_liger_kernel"]).ds.use_liger_kernel is True
    assert parse_cli(["--ds.use_liger_kernel=false"]).ds.use_liger_kernel is False
    assert parse_cli(["--ds.no_use_liger_kernel"]).ds.use_liger_kernel is False


def test_every_problem_is_reported_at_once():
    problems = problems_of(["--actor.adam.betas", "0.9", "--vllm.enable_sleep", "yes!", "--rollout.batch_size",
                            "0", "--actor.adam.lr", "--nope", "--vllm.sleep_level", "3"])
    assert problems == [
        "--actor.adam.betas needs 2 value(s): got ['0.9']; write --actor.adam.betas VALUE VALUE",
        "--vllm.enable_sleep takes no value: got ['yes!']; write --vllm.enable_sleep alone",
        "--actor.adam.lr needs 1 value(s): got []; write --actor.adam.lr VALUE",
        "--nope is not a flag: got '--nope'; names start with one of: actor, critic, ref, reward, vllm, ds, algo, "
        "rollout, train, data, eval, ckpt, logger, store, use_ms",
        "vllm.sleep_level is invalid: got 3; input should be 1 or 2",  # field order, not flag order
        "rollout.batch_size is invalid: got '0'; input should be greater than 0",
    ]


def test_bad_values_name_field_value_and_fix():
    assert problems_of(["--algo.advantage.estimator", "grpo"]) == [
        "algo.advantage.estimator is invalid: got 'grpo'; input should be 'gae', 'reinforce', 'rloo', "
        "'reinforce_baseline', 'group_norm' or 'dr_grpo'"]
    assert problems_of(["--actor.adam.betas", "0.9", "x"]) == [
        "actor.adam.betas[1] is invalid: got 'x'; input should be a valid number, unable to parse string as a number"]
    assert problems_of(["stray", "--use_ms"]) == [
        "arguments must start with a --flag: got ['stray']; e.g. --actor.num_nodes 1"]


def test_yaml_then_flags_override(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("actor:\n  adam:\n    lr: 1.0e-6\n    betas: [0.9, 0.99]\n  num_gpus_per_node: 2\n"
                    "rollout:\n  n_samples_per_prompt: 4\nalgo:\n  advantage:\n    estimator: rloo\n")
    cfg = parse_cli(["--config", str(path), "--actor.adam.lr", "5e-7", "--rollout.n_samples_per_prompt", "8"])
    assert (cfg.actor.adam.lr, cfg.actor.adam.betas, cfg.actor.num_gpus_per_node) == (5e-7, (0.9, 0.99), 2)
    assert (cfg.rollout.n_samples_per_prompt, cfg.algo.advantage.estimator) == (8, "rloo")
    assert parse_cli([f"--config={path}"]).rollout.n_samples_per_prompt == 4


def test_unknown_yaml_keys_suggest_the_closest_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("vllm:\n  enable_slep: true\nvlm:\n  num_engines: 2\nrollout:\n  batch_size: 0\n")
    assert problems_of(["--config", str(path)]) == [
        "vllm.enable_slep is not a config key: got True; did you mean vllm.enable_sleep?",
        "vlm is not a config key: got {'num_engines': 2}; did you mean vllm?",
        "rollout.batch_size is invalid: got 0; input should be greater than 0",
    ]


def test_config_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="--config must name a YAML file: got .*missing.yaml"):
        parse_cli(["--config", str(tmp_path / "missing.yaml")])
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="--config must hold a mapping at the top: got \\[1, 2\\]"):
        load_config_file(tmp_path / "list.yaml")
    (tmp_path / "empty.yaml").write_text("")
    assert load_config_file(tmp_path / "empty.yaml") == {}


def test_yaml_round_trip(tmp_path):
    cfg = parse_cli(SEED_ARGV + ["--actor.muon.no_nesterov", "--ds.lora.target_modules", "q_proj", "k_proj"])
    path = tmp_path / "seed.yaml"
    path.write_text(config_to_yaml(cfg))
    assert parse_cli(["--config", str(path)]) == cfg
    assert config_from_dict(load_config_file(path)) == cfg
    assert config_from_dict({}) == RunConfig()


def test_flag_names():
    names = flag_names()
    assert len(names) == 198  # 193 fields + the negations of the booleans that default to true or to the run's choice:
    # --actor.muon.no_nesterov, --critic.muon.no_nesterov, --rollout.no_seed_per_prompt, --rollout.no_logprobs,
    # --ds.no_use_liger_kernel
    assert names[:2] == ["--actor.optim", "--actor.adam.lr"]
    assert {"--vllm.enable_sleep", "--critic.muon.no_nesterov", "--logger.wandb.project", "--use_ms",
            "--rollout.no_seed_per_prompt", "--rollout.no_logprobs", "--ds.no_use_liger_kernel",
            "--vllm.attention_backend", "--vllm.executor_backend", "--vllm.block_size",
            "--vllm.engine_core_process", "--ds.lora.save_merged"} <= set(names)
    assert "--config" not in names and len(set(names)) == len(names)
