"""The peer benchmarks' CPU-checkable parts (benchmarks/peers/): the shape they copy from our iteration config, the
arguments they give TRL and OpenRLHF, the reward callable, the phase clock, OpenRLHF's step lines (an excerpt in its
logging format: `logging_utils._FORMAT`, `PPOTrainer.fit`'s `✨ Global step N: {status}`, Ray's actor prefix) and the
results they write after every step (run_all.py's real `Results`)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "benchmarks" / "peers"))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import openrlhf_ppo  # noqa: E402
import trl_grpo  # noqa: E402
from iteration_shape import read_iteration_shape  # noqa: E402
from run_all import Results  # noqa: E402

ITERATION_YAML = REPO_ROOT / "benchmarks" / "configs" / "h200-iteration.yaml"


def test_the_shape_is_our_iteration_benchmarks():
    shape = read_iteration_shape()
    assert (shape.prompts_per_step, shape.samples_per_prompt) == (32, 8)
    assert (shape.max_new_tokens, shape.max_len) == (1024, 1152)
    assert (shape.train_batch_size, shape.micro_batch_size, shape.gradient_accumulation_steps) == (256, 8, 32)
    assert (shape.max_tokens_per_gpu, shape.num_steps, shape.seed, shape.lr) == (16384, 3, 42, 1e-6)
    assert (shape.kl_coef, shape.kl_estimator, shape.advantage_estimator) == (0.001, "k2", "reinforce_baseline")
    assert shape.reward_file == REPO_ROOT / "data" / "letters_reward.py"


def test_a_shape_of_several_optimizer_steps_a_rollout_is_refused(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(ITERATION_YAML.read_text().replace("batch_size: 256", "batch_size: 128"))
    with pytest.raises(ValueError, match=r"train.batch_size must equal .*got 128 and 32 × 8"):
        read_iteration_shape(config)


def test_openrlhf_command_read_by_our_mirror_of_its_flags_is_our_run():
    """hybrid_core.flags parses OpenRLHF 0.11's dotted flags (unknown ones are refused): the peer's command line
    describes the run our config does, but for where files go and how the three steps are counted."""
    from hybrid_core.config import leaf_values
    from hybrid_core.flags import parse_cli

    model = "data/tiny-qwen3"
    argv = openrlhf_ppo.openrlhf_argv(read_iteration_shape(), Path(model), Path("/tmp/w"))
    assert argv[1:3] == ["-m", "openrlhf.cli.train_ppo_ray"]
    peer = leaf_values(parse_cli(argv[3:]))
    ours = leaf_values(parse_cli(["--config", str(ITERATION_YAML), "--actor.model_name_or_path", model]))
    differing = {path: (peer[path], ours[path]) for path in peer if peer[path] != ours[path]}
    assert differing == {
        "reward.remote_url": (str(REPO_ROOT / "data" / "letters_reward.py"), "data/letters_reward.py"),
        "data.prompt_dataset": (str(REPO_ROOT / "data" / "demo_prompts.jsonl"), "data/demo_prompts.jsonl"),
        "train.max_steps": (None, 3), "data.max_samples": (96, 100_000_000),  # 96 prompts = 3 rollouts of 32
        "ckpt.path": ("/tmp/w/ckpt", "./ckpt/checkpoints_ppo_ray"), "ckpt.output_dir": ("/tmp/w/model", "./ckpt"),
        "vllm.sleep_level": (1, 2),  # ours drops the weights every sync re-sends (as TRL's); OpenRLHF has no such flag
    }


def test_trl_config_is_one_generation_batch_per_optimizer_step():
    kwargs = trl_grpo.grpo_config_kwargs(read_iteration_shape(), Path("/tmp/t"))
    expected = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 32, "num_generations": 8,
                "max_completion_length": 1024, "max_steps": 3, "beta": 0.001, "learning_rate": 1e-6,
                "lr_scheduler_type": "constant", "bf16": True, "gradient_checkpointing": True, "use_vllm": True,
                "vllm_mode": "colocate", "vllm_enable_sleep_mode": True, "vllm_gpu_memory_utilization": 0.6,
                "vllm_max_model_length": 1152, "model_init_kwargs": {"dtype": "float32"}, "seed": 42}
    assert {key: kwargs[key] for key in expected} == expected
    # TRL's default generation batch = per-device batch × processes × steps_per_generation (= accumulation steps)
    assert kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"] == 32 * 8


def test_trl_rows_are_conversational_prompts_with_their_labels():
    rows = trl_grpo.prompt_rows(read_iteration_shape())
    assert len(rows) == 256
    assert rows[0] == {"prompt": [{"role": "user", "content": "Write a word made of eiou only."}], "label": "eiou"}


def test_trl_reward_scores_a_completion_as_the_reward_file_scores_its_query():
    reward = trl_grpo.letters_reward_callable(REPO_ROOT / "data" / "letters_reward.py")
    completions = [[{"role": "assistant", "content": "aaaa xyz"}], [{"role": "assistant", "content": "e" * 20}], "io"]
    # 4 of "aaaa xyz" in "aeiou" → 4/16; 20 e's capped at 16/16; "io" in "eiou" → 2/16
    assert reward(prompts=["p"] * 3, completions=completions, label=["aeiou", "aeiou", "eiou"],
                  completion_ids=None) == [0.25, 1.0, 0.125]


class ScriptedClock:
    """now() returns the scripted times in order; sync() is counted."""

    def __init__(self, times):
        self.times, self.syncs = list(times), 0

    def now(self):
        return self.times.pop(0)

    def sync(self):
        self.syncs += 1


def test_phase_clock_gives_each_phase_its_own_time():
    script = ScriptedClock([0.0, 1.0, 2.0, 5.0, 6.0, 6.0, 7.5, 10.0])
    clock = trl_grpo.PhaseClock(now=script.now, sync=script.sync)
    with clock.phase("update"):  # 0 → 10
        with clock.phase("experience"):  # 1 → 6
            with clock.phase("generation"):  # 2 → 5
                pass
        with clock.phase("update"):  # a grad forward inside the micro-step: 6 → 7.5
            pass
    # update 10 − 5 (experience) − 1.5 (its nested update) + 1.5; experience 5 − 3; generation 3
    assert clock.take() == {"generation": 3.0, "experience": 2.0, "update": 5.0}
    assert script.syncs == 8 and clock.take() == {}


def test_trl_steps_are_written_after_every_step(tmp_path):
    results = Results(tmp_path / "trl.json", {"git_sha": "abc"})
    script = ScriptedClock([0.0, 100.0, 110.0, 130.0, 150.0, 165.0, 180.0])
    clock = trl_grpo.PhaseClock(now=script.now, sync=script.sync)
    recorder = trl_grpo.StepRecorder(clock, results, now=script.now)
    recorder.begin()  # 0
    recorder.end_step(1)  # 100: step 1 is not timed
    assert "iteration_wall_s" not in json.loads((tmp_path / "trl.json").read_text())["figures"]
    with clock.phase("generation"):  # 110 → 130
        pass
    recorder.end_step(2)  # 150
    with clock.phase("generation"):  # 165 → 180: step 3 ends at 180 too
        pass
    script.times.append(200.0)
    recorder.end_step(3)
    written = json.loads((tmp_path / "trl.json").read_text())
    assert written["figures"]["iteration_wall_s"] == 50.0  # (50 + 50) / 2
    # generation (20 + 15) / 2; other 50 − 17.5
    assert written["figures"]["iteration_stage_s"] == {"generation": 17.5, "other": 32.5}
    assert written["trials"]["iteration_wall_s"] == {"1": 100.0, "2": 50.0, "3": 50.0}
    assert written["figures"]["iteration_steps_committed"] == 3


def _step_line(pid: int, step: int, generation: float, experience: float, train: float, broadcast: float) -> str:
    status = {"policy_loss": -0.0021, "actor_lr": 1e-06, "actor_grad_norm": 0.734, "kl": 0.0, "reward": 0.3046875,
              "response_length": 1024.0, "timing/make_experience": experience, "timing/ppo_train": train,
              "timing/broadcast": broadcast, "rollout/reward_mean": 0.3046875, "rollout/num_samples": 256.0}
    status["timing/generation"] = generation
    status["timing/step_total"] = generation + experience + train + broadcast
    return (f"\x1b[36m(PPOTrainer pid={pid})\x1b[0m INFO 12-05 10:1{step}:02 ppo_trainer.py:558] "
            f"✨ Global step {step}: {status}\n")


OPENRLHF_EXCERPT = [
    "(PPOTrainer pid=48213) INFO 12-05 10:12:40 ppo_trainer.py:350] Sample: ['<|im_start|>user ...', 0.25]\n",
    _step_line(48213, 1, 31.5, 9.0, 20.0, 2.5),
    "Episode [1/1]:  33%|███▎      | 32/96 [01:53<03:46, 113.1s/it]\r\n",
    _step_line(48213, 2, 12.4, 7.1, 16.1, 1.73),
    _step_line(48213, 3, 12.5, 7.0, 16.0, 1.75),
]


def test_openrlhf_step_line_is_parsed_item_by_item():
    assert openrlhf_ppo.parse_step_line(OPENRLHF_EXCERPT[0]) is None
    step, status = openrlhf_ppo.parse_step_line(OPENRLHF_EXCERPT[3])
    assert step == 2 and status["timing/ppo_train"] == 16.1 and status["actor_lr"] == 1e-06
    _, odd = openrlhf_ppo.parse_step_line("✨ Global step 7: {'kl': tensor(0.5), 'x': nan, 'n': np.float64(-2e-3)}")
    assert odd["kl"] == 0.5 and odd["n"] == -0.002 and odd["x"] != odd["x"]


def test_openrlhf_walls_are_the_gaps_between_step_lines(tmp_path):
    results = Results(tmp_path / "o.json", {"git_sha": "abc"})
    steps = openrlhf_ppo.StepLog(results, started=1000.0)
    for line, arrived in zip(OPENRLHF_EXCERPT, (1100.0, 1163.0, 1170.0, 1200.6, 1238.2)):
        steps.on_line(line, arrived)
    written = json.loads((tmp_path / "o.json").read_text())
    assert written["figures"]["startup_s"] == pytest.approx(163.0 - 63.0, abs=1e-9)  # launch → line 1, less step 1
    assert written["trials"]["iteration_wall_s"] == {"2": pytest.approx(37.6), "3": pytest.approx(37.6)}
    stages = written["figures"]["iteration_stage_s"]
    assert stages == pytest.approx({"generation": 12.45, "make_experience": 7.05, "ppo_train": 16.05,
                                    "broadcast": 1.74, "other": 37.6 - 37.29}, abs=1e-9)
    assert written["trials"]["openrlhf_status"]["3"]["timing/step_total"] == pytest.approx(37.25)


CHILD = """
import subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(helper.pid, flush=True)
print("✨ Global step 1: {'timing/generation': 1.5}", flush=True)
time.sleep(60)
"""


def test_openrlhf_run_is_cut_off_with_its_whole_process_group(tmp_path):
    seen = []
    started = time.perf_counter()
    code = openrlhf_ppo.run_streaming([sys.executable, "-c", CHILD], dict(os.environ), tmp_path / "run.log", 2.0,
                                      lambda line, arrived: seen.append(line))
    assert code == "cut off after 2 s" and time.perf_counter() - started < 15
    helper_pid = int(seen[0])
    assert openrlhf_ppo.parse_step_line(seen[1]) == (1, {"timing/generation": 1.5})
    assert (tmp_path / "run.log").read_text(encoding="utf-8").splitlines()[1].startswith("✨ Global step 1")
    assert not _is_running(helper_pid)  # the helper the child started died with the group


def _is_running(pid: int) -> bool:
    """Whether `pid` runs, after up to 5 s for a kill to land (a zombie awaiting its reaper counts as dead)."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.1)
    return True


def test_openrlhf_environment_puts_the_flash_attn_standin_first():
    env = openrlhf_ppo.child_env({"PYTHONPATH": "/tmp/peersite:/tmp/site", "HOME": "/root"}, Path("/tmp/ext"))
    assert env["PYTHONPATH"] == f"{openrlhf_ppo.STANDIN_DIR}:/tmp/peersite:/tmp/site"
    assert (env["TORCH_CUDA_ARCH_LIST"], env["HOME"]) == ("9.0", "/root")
    assert (openrlhf_ppo.STANDIN_DIR / "flash_attn" / "bert_padding.py").is_file()


def test_results_meta_says_how_the_peer_ran_and_at_what_shape(tmp_path):
    from step_figures import open_results

    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 2048, "num_hidden_layers": 28}))
    open_results(tmp_path / "r.json", peer="trl", how="one process", model_dir=tmp_path,
                 shape=read_iteration_shape(), git_sha="abc", packages=("datasets",))
    meta = json.loads((tmp_path / "r.json").read_text())["meta"]
    assert (meta["peer"], meta["how"], meta["git_sha"], meta["shape"]["num_hidden_layers"]) == (
        "trl", "one process", "abc", 28)
    assert meta["iteration_shape"]["reward_file"] == str(REPO_ROOT / "data" / "letters_reward.py")
    assert meta["versions"]["datasets"] == "5.2.0" and "gpu" in meta["versions"]


def test_the_peers_descriptions_say_whether_they_checkpoint_activations():
    from dataclasses import replace

    shape = read_iteration_shape()
    on, off = replace(shape, gradient_checkpointing=True), replace(shape, gradient_checkpointing=False)
    assert ", gradient checkpointing," in trl_grpo.how_trl_runs(on)
    assert ", no gradient checkpointing," in trl_grpo.how_trl_runs(off)
    assert openrlhf_ppo.HOW.format(checkpointing=off.checkpointing_words).count("no gradient checkpointing") == 1
