"""RunConfig: OpenRLHF 0.11 defaults, bounds, every cross-field rule and the derived values."""
import pytest
from pydantic import ValidationError

from hybrid_core.config import ConfigError, RunConfig, changed_fields, leaf_paths, leaf_values
from hybrid_core.workers.worker_args import eval_settings, rollout_args


def problems_of(data: dict) -> list[str]:
    """The cross-field problems RunConfig reports for `data` (fails if the fields themselves are invalid)."""
    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate(data)
    errors = info.value.errors()
    assert len(errors) == 1 and errors[0]["type"] == "value_error", errors
    cause = errors[0]["ctx"]["error"]
    assert isinstance(cause, ConfigError)
    return cause.problems


def test_defaults_match_openrlhf_0_11():
    cfg = RunConfig()
    assert cfg.actor.adam.lr == 1e-6 and cfg.critic.adam.lr == 9e-6
    assert cfg.actor.adam.betas == (0.9, 0.95) and cfg.critic.adam.betas == (0.9, 0.95)
    assert (cfg.actor.adam.eps, cfg.actor.adam.weight_decay) == (1e-8, 0.0)
    assert (cfg.critic.muon.lr, cfg.critic.muon.momentum, cfg.critic.muon.ns_steps) == (0.02, 0.95, 5)
    assert cfg.actor.muon.nesterov is True
    assert (cfg.actor.optim, cfg.actor.lr_scheduler) == ("adam", "cosine_with_min_lr")
    assert (cfg.actor.lr_warmup_ratio, cfg.actor.min_lr_ratio, cfg.actor.max_norm) == (0.03, 0.1, 1.0)
    assert (cfg.actor.num_nodes, cfg.actor.num_gpus_per_node, cfg.actor.eps_clip) == (1, 8, 0.2)
    assert cfg.actor.dual_clip is None and cfg.actor.entropy_coef is None
    assert (cfg.critic.value_clip, cfg.critic.freezing_steps) == (0.5, -1)
    assert cfg.reward.clip_range == (-10.0, 10.0)
    assert (cfg.reward.timeout_s, cfg.reward.max_retries) == (180.0, 5)
    assert (cfg.vllm.num_engines, cfg.vllm.gpu_memory_utilization, cfg.vllm.sync_backend) == (None, 0.95, "nccl")
    assert (cfg.vllm.sync_bucket_mb, cfg.vllm.sleep_level) == (1024, 1)
    assert (cfg.ds.zero_stage, cfg.ds.param_dtype, cfg.ds.attn_implementation) == (2, "bf16", "flash_attention_2")
    assert cfg.ds.lora.target_modules == ["all-linear"] and (cfg.ds.lora.rank, cfg.ds.lora.alpha) == (0, 16)
    assert (cfg.algo.advantage.estimator, cfg.algo.advantage.is_correction_threshold) == ("gae", (0.5, 5.0))
    assert (cfg.algo.kl.init_coef, cfg.algo.kl.horizon, cfg.algo.kl.estimator) == (0.01, 10000, "k1")
    assert cfg.algo.dynamic_filtering_range == (0.0, 1.0)
    assert (cfg.rollout.batch_size, cfg.rollout.n_samples_per_prompt, cfg.rollout.temperature) == (1024, 1, 1.0)
    assert (cfg.train.batch_size, cfg.train.seed, cfg.train.max_tokens_per_gpu) == (128, 42, 16192)
    assert (cfg.train.ema_beta, cfg.train.device, cfg.train.stage_timeout_s) == (0.992, "cuda", 3600.0)
    assert (cfg.data.input_key, cfg.data.max_len, cfg.data.max_samples) == ("input", 2048, 100_000_000)
    assert (cfg.eval.steps, cfg.eval.temperature, cfg.eval.n_samples_per_prompt) == (-1, 0.6, 4)
    assert (cfg.ckpt.path, cfg.ckpt.output_dir, cfg.ckpt.max_num) == ("./ckpt/checkpoints_ppo_ray", "./ckpt", 3)
    assert cfg.logger.wandb.project == "openrlhf_train_ppo" and cfg.store.root == "runs"
    assert cfg.use_ms is False


def test_models_are_frozen_and_reject_unknown_keys():
    cfg = RunConfig()
    with pytest.raises(ValidationError):
        cfg.actor.num_nodes = 2
    with pytest.raises(ValidationError, match="extra"):
        RunConfig.model_validate({"vllm": {"enable_slep": True}})


@pytest.mark.parametrize(("data", "field"), [
    ({"rollout": {"batch_size": 0}}, "batch_size"),
    ({"vllm": {"gpu_memory_utilization": 1.5}}, "gpu_memory_utilization"),
    ({"ds": {"zero_stage": 4}}, "zero_stage"),
    ({"actor": {"dual_clip": 1.0}}, "dual_clip"),
    ({"train": {"max_steps": 0}}, "max_steps"),
    ({"vllm": {"sleep_level": 3}}, "sleep_level"),
    ({"algo": {"advantage": {"estimator": "grpo"}}}, "estimator"),
])
def test_field_bounds(data, field):
    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate(data)
    assert info.value.errors()[0]["loc"][-1] == field


OVERSAMPLED = {"train": {"async_enable": True, "async_queue_size": 2}, "algo": {"dynamic_filtering_enable": True},
               "reward": {"remote_url": "r.py"}}


def test_oversampling_needs_dynamic_filtering_and_more_prompts_than_a_step_trains():
    def with_rollout(**rollout):
        return OVERSAMPLED | {"rollout": {"batch_size": 8, "n_samples_per_prompt": 2} | rollout}

    cfg = RunConfig.model_validate(with_rollout(vllm_generate_batch_size=12))
    assert cfg.is_oversampling and rollout_args(cfg).generate_batch_size == 12
    assert rollout_args(cfg).prompts.is_oversampling
    # above 2 x batch_size too: at a pass rate of 1/4, 32 prompts give the 8 groups a step trains
    assert RunConfig.model_validate(with_rollout(vllm_generate_batch_size=32)).is_oversampling
    partial = with_rollout(vllm_generate_batch_size=12)
    partial["train"] = partial["train"] | {"partial_rollout_enable": True}
    assert RunConfig.model_validate(partial).is_oversampling  # the two compose: the surplus is counted by its oldest
    same = RunConfig.model_validate(with_rollout(vllm_generate_batch_size=8))
    assert not same.is_oversampling and rollout_args(same).generate_batch_size is None
    assert problems_of(with_rollout(vllm_generate_batch_size=6)) == [
        "rollout.vllm_generate_batch_size 6 < rollout.batch_size 8: a step's prompts are generated in one call; give "
        "more than rollout.batch_size to oversample (with --train.async_enable and --algo.dynamic_filtering_enable), "
        "or drop --rollout.vllm_generate_batch_size"]
    unfiltered = with_rollout(vllm_generate_batch_size=12) | {"algo": {}}
    assert problems_of(unfiltered) == [
        "rollout.vllm_generate_batch_size 12 > rollout.batch_size 8 oversamples to replace the groups dynamic "
        "filtering drops, without a refill round: got algo.dynamic_filtering_enable=False, so 4 groups a step would "
        "be generated only to expire; add --algo.dynamic_filtering_enable or drop --rollout.vllm_generate_batch_size"]


def test_sleep_with_async_names_both_flags_and_the_fix():
    problems = problems_of({"vllm": {"enable_sleep": True}, "train": {"async_enable": True, "colocate_all": True}})
    assert problems == ["vllm.enable_sleep cannot be combined with train.async_enable: async mode keeps vLLM "
                        "generating; drop --vllm.enable_sleep or --train.async_enable"]


def test_partial_rollout_and_oversampling_need_async_and_async_engines_take_no_ipc_buckets():
    assert problems_of({"train": {"partial_rollout_enable": True}}) == [
        "train.partial_rollout_enable needs train.async_enable (in-flight generation pauses for a weight push only "
        "while the engines generate ahead): add --train.async_enable or drop --train.partial_rollout_enable"]
    filtered = {"dynamic_filtering_enable": True}
    assert problems_of({"rollout": {"batch_size": 8, "vllm_generate_batch_size": 12, "n_samples_per_prompt": 2},
                        "algo": filtered, "reward": {"remote_url": "r.py"}}) == [
        "rollout.vllm_generate_batch_size 12 > rollout.batch_size 8 oversamples, which needs train.async_enable: add "
        "--train.async_enable or drop --rollout.vllm_generate_batch_size"]
    RunConfig.model_validate({"rollout": {"batch_size": 8, "vllm_generate_batch_size": 8}})
    async_mp = {"train": {"async_enable": True, "colocate_all": True}, "vllm": {"executor_backend": "mp"}}
    [problem] = problems_of(async_mp)
    assert problem.startswith("vllm.executor_backend 'mp' and vllm.engine_core_process take CUDA IPC buckets")
    assert problem.endswith("drop --vllm.executor_backend/--vllm.engine_core_process or --train.async_enable")
    RunConfig.model_validate({"train": {"async_enable": True, "async_queue_size": 2}})
    [lora] = problems_of({"train": {"async_enable": True, "partial_rollout_enable": True}, "ds": {"lora": {"rank": 8}},
                          "algo": {"advantage": {"estimator": "reinforce"}}})
    assert lora.startswith("train.partial_rollout_enable with ds.lora.rank 8: a LoRA sync activates a new adapter")
    agent = {"async_enable": True, "partial_rollout_enable": True, "agent_func_path": "data/agents/guess.py"}
    assert problems_of({"train": agent}) == [
        "train.partial_rollout_enable pauses single-turn generation between engine steps; an agent's episodes "
        "(train.agent_func_path 'data/agents/guess.py') do not pause: drop --train.partial_rollout_enable or "
        "--train.agent_func_path"]


def test_sleep_needs_colocate_all():
    problems = problems_of({"vllm": {"enable_sleep": True}})
    assert problems == ["vllm.enable_sleep requires train.colocate_all: got train.colocate_all=False; "
                        "add --train.colocate_all or drop --vllm.enable_sleep"]


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_baseline", "group_norm", "dr_grpo"])
def test_group_estimators_need_several_samples(estimator):
    problems = problems_of({"algo": {"advantage": {"estimator": estimator}}})
    assert problems == [f"algo.advantage.estimator {estimator!r} needs rollout.n_samples_per_prompt > 1: got 1; "
                        "pass --rollout.n_samples_per_prompt 2 or more, or use --algo.advantage.estimator reinforce"]
    RunConfig.model_validate({"algo": {"advantage": {"estimator": estimator}},
                              "rollout": {"n_samples_per_prompt": 2}})


def test_importance_sampling_correction_needs_the_engines_logprobs():
    problems = problems_of({"algo": {"advantage": {"is_correction_enable": True}}, "rollout": {"logprobs": False}})
    assert problems == ["algo.advantage.is_correction_enable needs the engine's logprobs: got rollout.logprobs=False; "
                        "drop --rollout.no_logprobs or --algo.advantage.is_correction_enable"]
    RunConfig.model_validate({"rollout": {"logprobs": False}})  # nothing else reads them
    RunConfig.model_validate({"algo": {"advantage": {"is_correction_enable": True}}})


@pytest.mark.parametrize(("asked", "correction", "expected"), [
    (None, False, False), (None, True, True), (True, False, True), (True, True, True), (False, False, False)])
def test_the_engine_is_asked_for_logprobs_when_told_or_when_the_correction_reads_them(asked, correction, expected):
    cfg = RunConfig.model_validate({"rollout": {"logprobs": asked},
                                    "algo": {"advantage": {"is_correction_enable": correction}}})
    assert cfg.asks_engine_logprobs is expected
    assert rollout_args(cfg).sampling.logprobs is expected
    eval_cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"dataset": "prompts.jsonl"})})
    assert eval_settings(eval_cfg).sampling.logprobs is expected


def test_dynamic_filtering_needs_remote_reward_and_groups():
    problems = problems_of({"algo": {"dynamic_filtering_enable": True}})
    assert len(problems) == 2
    assert problems[0].startswith("algo.dynamic_filtering_enable needs reward.remote_url or train.agent_func_path")
    assert problems[1].startswith("algo.dynamic_filtering_enable needs rollout.n_samples_per_prompt > 1: got 1;")
    RunConfig.model_validate({"algo": {"dynamic_filtering_enable": True}, "rollout": {"n_samples_per_prompt": 4},
                              "train": {"agent_func_path": "agent.py"}})


def test_colocate_all_needs_as_many_rollout_gpus_as_actor_gpus():
    data = {"train": {"colocate_all": True}, "algo": {"kl": {"init_coef": 0.0}},
            "actor": {"num_gpus_per_node": 8}, "vllm": {"num_engines": 2, "tensor_parallel_size": 2}}
    problems = problems_of(data)
    assert problems == ["train.colocate_all needs actor.num_nodes × actor.num_gpus_per_node == vllm.num_engines × "
                        "vllm.tensor_parallel_size: got 8 actor GPUs and 2 engines × TP 2 = 4; use "
                        "--vllm.num_engines 4 (8 ÷ TP 2), or change --actor.num_gpus_per_node to 4 (with "
                        "--actor.num_nodes 1)"]
    # async keeps vLLM on its own GPUs, so the sizes need not match
    RunConfig.model_validate({**data, "train": {"colocate_all": True, "async_enable": True}})


def test_colocated_tp_must_divide_the_actor_gpus_of_a_node():
    base = {"train": {"colocate_all": True}, "algo": {"kl": {"init_coef": 0.0}}}
    # 4 GPUs in engines of 3 workers: no engine count fits, and a fourth worker would straddle two engines
    assert problems_of({**base, "actor": {"num_gpus_per_node": 4},
                        "vllm": {"num_engines": 1, "tensor_parallel_size": 3}}) == [
        "train.colocate_all needs actor.num_nodes × actor.num_gpus_per_node == vllm.num_engines × "
        "vllm.tensor_parallel_size: got 4 actor GPUs and 1 engines × TP 3 = 3; use a --vllm.tensor_parallel_size "
        "that divides 4 with --vllm.num_engines 4 ÷ TP, or change --actor.num_gpus_per_node to 3 (with "
        "--actor.num_nodes 1)",
        "vllm.tensor_parallel_size must divide actor.num_gpus_per_node when colocated (an engine's TP workers "
        "share the GPUs of one node's actor ranks): got 3 and 4; use --vllm.tensor_parallel_size 1 or 2 or 4"]
    # 2 nodes × 3 GPUs = 3 engines × TP 2 in number, but an engine would take GPUs of both nodes
    problems = problems_of({**base, "actor": {"num_nodes": 2, "num_gpus_per_node": 3},
                            "vllm": {"num_engines": 3, "tensor_parallel_size": 2}})
    assert problems == ["vllm.tensor_parallel_size must divide actor.num_gpus_per_node when colocated (an engine's "
                        "TP workers share the GPUs of one node's actor ranks): got 2 and 3; use "
                        "--vllm.tensor_parallel_size 1 or 3"]
    RunConfig.model_validate({**base, "actor": {"num_gpus_per_node": 4},
                              "vllm": {"num_engines": 2, "tensor_parallel_size": 2}})


def test_colocated_ref_must_match_actor_size():
    problems = problems_of({"train": {"colocate_actor_ref": True}, "actor": {"num_gpus_per_node": 4}})
    assert problems == ["ref.num_nodes and ref.num_gpus_per_node must equal actor's when colocated: got (1, 8) "
                        "and (1, 4); pass --ref.num_nodes 1 --ref.num_gpus_per_node 4"]
    # without a reference model (kl.init_coef 0) there is nothing to colocate
    RunConfig.model_validate({"train": {"colocate_actor_ref": True}, "actor": {"num_gpus_per_node": 4},
                              "algo": {"kl": {"init_coef": 0.0}}})


def test_colocated_reward_must_match_critic_size():
    problems = problems_of({"train": {"colocate_critic_reward": True}, "reward": {"num_nodes": 2}})
    assert problems == ["reward.num_nodes and reward.num_gpus_per_node must equal critic's when colocated: got "
                        "(2, 8) and (1, 8); pass --reward.num_nodes 1 --reward.num_gpus_per_node 8"]


@pytest.mark.parametrize(("data", "name", "value"), [
    ({"reward": {"clip_range": (5.0, -5.0)}}, "reward.clip_range", (5.0, -5.0)),
    ({"algo": {"dynamic_filtering_range": (0.5, 0.5)}}, "algo.dynamic_filtering_range", (0.5, 0.5)),
    ({"algo": {"advantage": {"is_correction_threshold": (5.0, 0.5)}}},
     "algo.advantage.is_correction_threshold", (5.0, 0.5)),
])
def test_ranges_need_low_below_high(data, name, value):
    assert problems_of(data) == [f"{name} must have low < high: got {value!r}; pass --{name} LOW HIGH with LOW < HIGH"]


def test_eps_clip_low_high_must_be_non_negative():
    assert problems_of({"actor": {"eps_clip_low_high": (-0.1, 0.28)}}) == [
        "actor.eps_clip_low_high must be >= 0: got (-0.1, 0.28); e.g. pass 0.2 0.28"]


def test_input_template_needs_a_placeholder():
    assert problems_of({"data": {"input_template": "Question:"}}) == [
        "data.input_template must contain '{}' where the prompt goes: got 'Question:'; "
        "e.g. --data.input_template 'Question: {} Answer:'"]
    assert RunConfig.model_validate({"data": {"input_template": "Q: {} A:"}}).data.input_template == "Q: {} A:"


def test_all_broken_rules_are_reported_together():
    problems = problems_of({"vllm": {"enable_sleep": True}, "reward": {"clip_range": (1.0, 0.0)},
                            "algo": {"advantage": {"estimator": "rloo"}}})
    assert [p.split(" ")[0] for p in problems] == ["vllm.enable_sleep", "algo.advantage.estimator",
                                                   "reward.clip_range"]


def test_derived_values():
    cfg = RunConfig.model_validate({"actor": {"num_nodes": 2, "num_gpus_per_node": 4},
                                    "vllm": {"num_engines": 4, "tensor_parallel_size": 2},
                                    "algo": {"advantage": {"estimator": "reinforce"}, "kl": {"init_coef": 0.0}},
                                    "reward": {"remote_url": "http://localhost:5000/reward"}})
    assert (cfg.actor_world_size, cfg.num_rollout_gpus) == (8, 8)
    assert (cfg.uses_critic, cfg.uses_ref, cfg.uses_reward_model) == (False, False, False)
    default = RunConfig()
    assert (default.num_rollout_gpus, default.uses_critic, default.uses_ref, default.uses_reward_model) == (
        0, True, True, True)


def test_leaf_paths_and_changed_fields():
    paths = leaf_paths()
    # OpenRLHF 0.11's and PROJECT ones; the newest: vllm.kv_cache_dtype
    assert len(paths) == 193
    assert paths["vllm.kv_cache_dtype"].default == "auto"
    assert paths["ds.logit_chunk_tokens"].default == 4096
    assert "reward.remote_batch_size" in paths and paths["reward.remote_batch_size"].default == 32
    assert paths["actor.adam.lr"].default == 1e-6
    assert "critic.muon.nesterov" in paths and "logger.wandb.project" in paths and "use_ms" in paths
    assert not any(path in paths for path in ("actor", "actor.adam", "algo.kl"))
    cfg = RunConfig.model_validate({"actor": {"adam": {"lr": 5e-7}}, "ds": {"packing_samples": True},
                                    "train": {"seed": 42}})
    assert changed_fields(cfg) == ["actor.adam.lr", "ds.packing_samples"]
    assert leaf_values(cfg)["actor.adam.lr"] == 5e-7
    assert changed_fields(RunConfig()) == []


def test_the_flow_parameter_schema_admits_only_offline_as_wandb_key_and_its_refusal_does_not_repeat_the_key():
    """Prefect's server validates a deployment run's parameters against this schema before storing them; the
    message it answers is jsonschema's best match, which must not hold the key."""
    import jsonschema

    schema = RunConfig.model_json_schema()
    key = "wandb-key-0123456789abcdef-never-stored"
    jsonschema.validate({"logger": {"wandb": {"key": "offline"}}}, schema)
    jsonschema.validate({"logger": {"wandb": {"key": None}}}, schema)
    with pytest.raises(jsonschema.ValidationError) as err:
        jsonschema.validate({"logger": {"wandb": {"key": key}}}, schema)
    assert err.value.message == "'offline' was expected"
    assert key not in err.value.message
    from hybrid_core.flags import config_from_dict

    with pytest.raises(ConfigError) as refused:  # pydantic takes the string: the rule refuses it, unshown
        config_from_dict({"logger": {"wandb": {"key": key}}})
    assert str(refused.value).startswith("logger.wandb.key holds an API key (39 characters, not shown)")
    assert key not in str(refused.value)
