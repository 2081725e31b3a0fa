"""plan: placement groups, the not-implemented list and the preflight checks of `hybrid train`."""
import pytest

from hybrid_core.config import RunConfig, leaf_paths
from hybrid_core.flags import parse_cli
from hybrid_core.layout import NodeBlock
from hybrid_core.plan.placement import GpuGroup, make_placement
from hybrid_core.plan.run_plan import role_bundles, run_node_blocks, sync_transport
from hybrid_core.plan.refusals import IMPLEMENTED_FLAGS, IMPLEMENTED_VALUES, not_implemented, preflight_problems
from hybrid_core.plan.report import render_plan
from test_flags import SEED_ARGV  # the spec's launch recipe, verbatim

from tests.conftest import REPO_ROOT

# Local inputs that exist in the repository, so preflight finds nothing missing.
INPUTS = {"actor": {"model_name_or_path": str(REPO_ROOT / "data")},
          "data": {"prompt_dataset": str(REPO_ROOT / "data" / "demo_prompts.jsonl")},
          "reward": {"remote_url": str(REPO_ROOT / "data" / "letters_reward.py")}}
INPUT_FLAGS = [f"--{ns}.{key}={value}" for ns, block in INPUTS.items() for key, value in block.items()]

SEED_NOT_IMPLEMENTED: list[str] = []
SEED_RING_LINES = ["ring attention: each packed sample split over 2 ranks, 2 K/V head(s) all-gathered at a time",
                   "  actor: ring groups [0, 1] [2, 3] (2 data-parallel group(s))",
                   "  ref: ring groups [0, 1] [2, 3] (2 data-parallel group(s))"]


def config(**blocks) -> RunConfig:
    return RunConfig.model_validate(blocks)


def config_with_inputs(**blocks) -> RunConfig:
    """`config` plus existing model, prompts and reward files (merged into the given blocks)."""
    merged = {ns: dict(block) for ns, block in blocks.items()}
    for ns, block in INPUTS.items():
        merged[ns] = block | merged.get(ns, {})
    return RunConfig.model_validate(merged)


def test_implemented_flags_are_real_fields():
    assert IMPLEMENTED_FLAGS <= set(leaf_paths())
    assert "rollout.vllm_generate_batch_size" in IMPLEMENTED_FLAGS
    assert set(IMPLEMENTED_VALUES) <= IMPLEMENTED_FLAGS


def test_seed_placement_is_one_colocated_group():
    placement = make_placement(parse_cli(SEED_ARGV))
    # kl.init_coef 1e-5 > 0 keeps the ref; reinforce_baseline drops the critic; remote_url drops the reward model
    assert placement.groups == (GpuGroup(("actor", "ref", "rollout"), num_bundles=4, num_nodes=1),)
    assert placement.groups[0].gpu_share == 0.2
    assert (placement.num_gpus, placement.num_engines, placement.tensor_parallel_size) == (4, 2, 2)
    assert placement.group_of("critic") is None


def test_seed_plan_text():
    text = render_plan(parse_cli(SEED_ARGV))
    lines = text.splitlines()
    assert lines[0] == "device: cuda; needs 4 GPUs (4 bundles) on 1 node(s) of 4"
    assert lines[2] == ("  group 1: 4 bundles of 1 GPU on 1 node(s); roles and GPU share per bundle: "
                        "actor 0.2, ref 0.2, rollout 0.2")
    assert lines[3] == ("rollout: 2 vLLM engines × TP 2, shares the actor's GPUs, gpu_memory_utilization 0.7")
    assert lines[4:6] == [
        "    engine 0: TP workers on bundles 0-1, weights by CUDA IPC from actor ranks 0-1 (one per GPU)",
        "    engine 1: TP workers on bundles 2-3, weights by CUDA IPC from actor ranks 2-3 (one per GPU)"]
    assert lines[6:9] == SEED_RING_LINES
    assert lines[9] == "sleep: vLLM on (level 1), DeepSpeed on"
    assert lines[10:] == ["not implemented yet: none"]
    assert "--ds.packing_samples" not in text and "--train.dynamic_batch_enable" not in text  # issue #7


def test_seed_preflight_without_gpus():
    problems = preflight_problems(parse_cli(SEED_ARGV), num_gpus_found=0)
    num_flags = len(SEED_NOT_IMPLEMENTED)
    assert problems[:num_flags] == [f"flag not implemented yet: {line}" for line in SEED_NOT_IMPLEMENTED]
    assert not any("ZeRO-3" in p for p in problems)  # several ZeRO-3 ranks run their forwards in lockstep
    assert not any("tensor" in p or "engines ×" in p for p in problems)  # 2 engines × TP 2 colocated: accepted
    assert not any("model_name_or_path" in p for p in problems)  # a hub id: the preflight checks it, offline only
    assert problems[-1].startswith("needs 4 GPUs, found 0")
    assert not any("needs" in p for p in preflight_problems(parse_cli(SEED_ARGV), num_gpus_found=4))


def test_fully_implemented_config_has_no_problems():
    cfg = parse_cli(["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4",
                     "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
                     "--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep", *INPUT_FLAGS])
    assert not_implemented(cfg) == []
    assert preflight_problems(cfg, num_gpus_found=1) == []
    assert render_plan(cfg).splitlines()[-1] == "not implemented yet: none"


def test_two_colocated_ranks_with_one_engine_each_are_accepted_on_gpus():
    cfg = parse_cli(["--actor.num_gpus_per_node", "2", "--ref.num_gpus_per_node", "2", "--vllm.num_engines", "2",
                     "--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep", "--ds.zero_stage", "2",
                     "--rollout.n_samples_per_prompt", "2", *INPUT_FLAGS])
    assert preflight_problems(cfg, num_gpus_found=2) == []


def test_liger_kernels_need_cuda_and_the_package(monkeypatch):
    import importlib.util

    gpu = ["--ds.use_liger_kernel", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
           "--vllm.num_engines", "1", "--train.colocate_all", "--rollout.n_samples_per_prompt", "2", *INPUT_FLAGS]
    assert not_implemented(parse_cli(gpu)) == []
    on_cpu = preflight_problems(parse_cli([*gpu, "--train.device", "cpu"]), num_gpus_found=0)
    assert ("ds.use_liger_kernel needs CUDA (Liger's kernels are Triton): got train.device cpu; drop "
            "--ds.use_liger_kernel") in on_cpu
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel"
                        else real_find_spec(name, *a))
    assert preflight_problems(parse_cli(gpu), num_gpus_found=1) == [
        "ds.use_liger_kernel needs the liger-kernel package: pip install 'hybrid-engine[liger]'"]


def test_an_attention_backend_by_name_needs_cuda():
    gpu = ["--vllm.attention_backend", "TRITON_ATTN", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node",
           "1", "--vllm.num_engines", "1", "--train.colocate_all", "--rollout.n_samples_per_prompt", "2", *INPUT_FLAGS]
    assert preflight_problems(parse_cli(gpu), num_gpus_found=1) == []
    assert preflight_problems(parse_cli([*gpu, "--train.device", "cpu"]), num_gpus_found=0) == [
        "vllm.attention_backend TRITON_ATTN is one of vLLM's CUDA backends: got train.device cpu, whose vLLM build "
        "has its own; drop --vllm.attention_backend"]


def test_default_config_sets_nothing_unimplemented():
    assert not_implemented(RunConfig()) == []  # the default estimator gae has its critic since #3


def test_unimplemented_choice_values_are_reported(monkeypatch):
    from hybrid_core.plan import refusals as plan

    monkeypatch.setitem(plan.IMPLEMENTED_VALUES, "algo.advantage.estimator", frozenset({"rloo"}))
    assert not_implemented(RunConfig()) == ["--algo.advantage.estimator (value 'gae'; implemented: rloo)"]


def test_separate_groups_without_colocation():
    placement = make_placement(config(vllm={"num_engines": 4, "tensor_parallel_size": 2}))
    assert [(g.roles, g.num_bundles, g.gpu_share) for g in placement.groups] == [
        (("actor",), 8, 1.0), (("ref",), 8, 1.0), (("critic",), 8, 1.0), (("reward",), 8, 1.0),
        (("rollout",), 8, 1.0)]
    assert placement.num_gpus == 40


def test_pairwise_colocation():
    cfg = config(train={"colocate_actor_ref": True, "colocate_critic_reward": True}, vllm={"num_engines": 2})
    assert [(g.roles, g.num_bundles) for g in make_placement(cfg).groups] == [
        (("actor", "ref"), 8), (("critic", "reward"), 8), (("rollout",), 2)]


def test_colocate_all_with_async_keeps_vllm_apart():
    cfg = config(train={"colocate_all": True, "async_enable": True},
                 actor={"num_nodes": 2, "num_gpus_per_node": 4}, ref={"num_nodes": 2, "num_gpus_per_node": 4},
                 vllm={"num_engines": 3})
    groups = make_placement(cfg).groups
    # the engines' group is as wide a node as the actor's: its 3 bundles fit one node of 4
    assert groups == (GpuGroup(("actor", "ref", "critic", "reward"), 8, 2), GpuGroup(("rollout",), 3, 1, per_node=4))
    assert groups[0].gpu_share == 0.2
    report = render_plan(cfg)
    assert "3 vLLM engines × TP 1, has its own GPUs" in report
    assert ("async: 1 batch(es) generated ahead; batch k by policy version max(0, k - 2), staleness at most 1; the "
            "engines generate while the DeepSpeed models train") in report.splitlines()
    assert "async:" not in render_plan(config(train={"colocate_all": True}))


@pytest.mark.parametrize(("queue_size", "overlap"), [
    (2, "the engines generate while the DeepSpeed models train"),
    (1, "with train.async_queue_size 1 no generation overlaps training (batch k starts after step k - 1's sync)")])
def test_the_async_line_says_the_oversampling_schedule(queue_size, overlap):
    cfg = config(train={"async_enable": True, "async_queue_size": queue_size},
                 rollout={"batch_size": 4, "vllm_generate_batch_size": 6, "n_samples_per_prompt": 2},
                 algo={"dynamic_filtering_enable": True},
                 reward={"remote_url": "r.py"})
    [line] = [line for line in render_plan(cfg).splitlines() if line.startswith("async:")]
    assert line == (f"async: oversampling 6 prompts a batch for 4 groups a step; batch k by policy version max(0, k - "
                    f"{queue_size}), one step less ahead, so its groups are at most {queue_size - 1} stale at step k "
                    f"and its surplus at most {queue_size} at step k + 1; {overlap}")


@pytest.mark.parametrize(("num_roles", "share"), [(1, 1.0), (2, 0.2), (5, 0.2), (6, 1 / 6)])
def test_gpu_shares_never_exceed_one_gpu(num_roles, share):
    group = GpuGroup(tuple(f"role{i}" for i in range(num_roles)), num_bundles=1, num_nodes=1)
    assert group.gpu_share == pytest.approx(share, abs=1e-12)
    assert group.gpu_share * num_roles <= 1.0


def test_cpu_device_asks_no_gpus():
    cfg = config_with_inputs(train={"device": "cpu", "colocate_all": True},
                             algo={"advantage": {"estimator": "reinforce"}}, actor={"num_gpus_per_node": 1},
                             ref={"num_gpus_per_node": 1}, vllm={"num_engines": 1})
    assert make_placement(cfg).num_gpus == 0
    assert preflight_problems(cfg, num_gpus_found=0) == []
    assert render_plan(cfg).startswith("device: cpu; needs 0 GPUs (1 bundles)")


def test_cpu_device_runs_data_parallel_actor_ranks_on_one_node_or_several_at_every_zero_stage():
    def problems(**blocks):
        cfg = config_with_inputs(train={"device": "cpu"}, algo={"advantage": {"estimator": "reinforce"}}, **blocks)
        return preflight_problems(cfg, num_gpus_found=0)

    assert problems(actor={"num_gpus_per_node": 2}) == []
    assert problems(actor={"num_gpus_per_node": 2}, ds={"zero_stage": 3}) == []  # forwards in lockstep
    assert problems(actor={"num_nodes": 2, "num_gpus_per_node": 1}) == []
    assert problems(actor={"num_nodes": 2, "num_gpus_per_node": 1}, ds={"zero_stage": 3}) == []


def test_seed_plan_appends_the_memory_estimate():
    cfg = parse_cli(SEED_ARGV)
    without = render_plan(cfg).splitlines()
    lines = render_plan(cfg, 139.8, is_gpu_assumed=True).splitlines()
    assert lines[:len(without)] == without  # the memory section only adds lines
    assert lines[len(without)] == ("memory per GPU of the actor's group, estimated for a 139.80 GiB GPU "
                                   "(assumed: no GPU found, an H200):")
    assert lines[len(without) + 1].startswith("  phase rollout: ")
    assert "    vLLM reservation: 97.86 GiB" in lines  # 0.7 · 139.8 on each of the 4 GPUs
    assert any(line.startswith("  peak: ") for line in lines)
    assert any(line.startswith(("  fits on a 139.80 GiB GPU", "  does not fit: needs ")) for line in lines)
    assert "  note: model Qwen/Qwen3-4B-Thinking-2507: 4.02B parameters (tied embeddings)" in lines
    assert "(found by nvidia-smi)" in render_plan(cfg, 80.0)


def test_the_seed_recipe_on_eight_gpus_fits_with_four_tp_engines_and_four_rings():
    cfg = parse_cli([*SEED_ARGV, "--actor.num_gpus_per_node", "8", "--ref.num_gpus_per_node", "8",
                     "--vllm.num_engines", "4"])
    lines = render_plan(cfg, 139.8, is_gpu_assumed=True).splitlines()
    assert lines[0] == "device: cuda; needs 8 GPUs (8 bundles) on 1 node(s) of 8"
    assert lines[3] == "rollout: 4 vLLM engines × TP 2, shares the actor's GPUs, gpu_memory_utilization 0.7"
    assert lines[7] == "    engine 3: TP workers on bundles 6-7, weights by CUDA IPC from actor ranks 6-7 (one per GPU)"
    assert "  actor: ring groups [0, 1] [2, 3] [4, 5] [6, 7] (4 data-parallel group(s))" in lines
    assert "not implemented yet: none" in lines
    # ZeRO-3 over 8 ranks halves the 4-GPU run's optimizer share; vLLM's 0.7 reservation still sets the peak
    assert "  peak: 110.59 GiB in phase rollout" in lines and "    actor optimizer states: 5.62 GiB" in lines
    assert any(line.startswith("  fits on a 139.80 GiB GPU") for line in lines)
    problems = preflight_problems(cfg, num_gpus_found=8)
    assert not any("GPU" in p or "engines" in p or "ring" in p for p in problems), problems


def test_memory_section_says_why_it_is_missing():
    cpu = config_with_inputs(train={"device": "cpu", "colocate_all": True}, actor={"num_gpus_per_node": 1},
                             ref={"num_gpus_per_node": 1}, algo={"advantage": {"estimator": "reinforce"}})
    assert render_plan(cpu, 139.8).splitlines()[-1] == (
        "memory: the memory plan applies to GPU runs (--train.device cuda); skipped on cpu")
    unknown = config(actor={"model_name_or_path": "acme/llm-7b"})
    assert render_plan(unknown, 139.8).splitlines()[-1].startswith(
        "memory: no estimate: actor.model_name_or_path has no known model shape for the memory plan: "
        "got 'acme/llm-7b'")


def test_preflight_refuses_a_plan_that_does_not_fit():
    cfg = config(actor={"model_name_or_path": "Qwen/Qwen3-8B", "num_gpus_per_node": 1},
                 ref={"num_gpus_per_node": 1}, vllm={"num_engines": 1, "gpu_memory_utilization": 0.5},
                 train={"colocate_all": True}, ds={"zero_stage": 0})
    memory = [p for p in preflight_problems(cfg, 1, gpu_total_gib=139.8) if p.startswith("GPU memory: ")]
    assert len(memory) == 1
    # 8.19e9 parameters · 12 bytes of fp32 master weights and Adam moments, unpartitioned
    assert memory[0].startswith("GPU memory: does not fit: needs ")
    assert memory[0].endswith("largest term: actor optimizer states (91.54 GiB), in phase experience; "
                              "`hybrid plan` lists every term")
    assert not any(p.startswith("GPU memory") for p in preflight_problems(cfg, 1))  # no GPU size: no check
    assert not any(p.startswith("GPU memory") for p in preflight_problems(cfg, 1, gpu_total_gib=2000.0))


ONE_GPU = ["--actor.model_name_or_path", "m", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
           "--algo.advantage.estimator", "reinforce", "--reward.remote_url", "r.py"]


def test_colocated_roles_share_bundle_zero_and_weights_go_by_cuda_ipc():
    cfg = parse_cli([*ONE_GPU, "--train.colocate_all", "--train.device",
                     "cuda", "--vllm.num_engines", "1", "--algo.kl.init_coef", "0.01"])
    assert role_bundles(cfg) == (1, {"actor": (0, 0.2), "ref": (0, 0.2), "rollout": (0, 0.2)})
    assert sync_transport(cfg) == "cuda_ipc"
    on_cpu = cfg.model_copy(update={"train": cfg.train.model_copy(update={"device": "cpu"})})
    # on CPU one logical CPU is split between the three roles
    assert role_bundles(on_cpu) == (1, {"actor": (0, 0.333), "ref": (0, 0.333), "rollout": (0, 0.333)})
    assert sync_transport(on_cpu) == "object_store"
    # two ranks: two bundles of 0.5 CPU, each split in three shares rounded down (0.167 × 3 would not fit 0.5)
    two = parse_cli([*ONE_GPU, "--train.colocate_all", "--train.device", "cpu", "--vllm.num_engines", "2",
                     "--algo.kl.init_coef", "0.01", "--actor.num_gpus_per_node", "2", "--ref.num_gpus_per_node", "2"])
    assert role_bundles(two) == (2, {"actor": (0, 0.166), "ref": (0, 0.166), "rollout": (0, 0.166)})


def test_separate_groups_get_bundles_of_their_own_and_a_process_group_sync():
    cfg = parse_cli([*ONE_GPU, "--train.device", "cuda", "--vllm.num_engines", "1",
                     "--algo.kl.init_coef", "0.01", "--train.colocate_actor_ref"])
    # actor+ref share bundle 0 (0.2 each, as OpenRLHF asks), the engine has bundle 1 to itself
    assert role_bundles(cfg) == (2, {"actor": (0, 0.2), "ref": (0, 0.2), "rollout": (1, 1.0)})
    assert sync_transport(cfg) == "process_group:nccl"
    gloo = parse_cli([*ONE_GPU, "--train.device", "cpu", "--vllm.num_engines", "1",
                      "--algo.kl.init_coef", "0.01", "--vllm.sync_backend", "nccl"])
    # three groups on CPU: bundles of a third of a CPU each; CPU runs broadcast with gloo whatever the backend
    assert role_bundles(gloo) == (3, {"actor": (0, 0.333), "ref": (1, 0.333), "rollout": (2, 0.333)})
    assert sync_transport(gloo) == "process_group:gloo"
    assert not [p for p in preflight_problems(gloo, 0) if "separate" in p]


# actor and reference ranks on 2 nodes × 2 GPUs
TWO_NODES = ["--actor.model_name_or_path", "m", "--actor.num_nodes", "2", "--actor.num_gpus_per_node", "2",
             "--ref.num_nodes", "2", "--ref.num_gpus_per_node", "2", "--algo.advantage.estimator", "reinforce",
             "--reward.remote_url", "r.py", "--algo.kl.init_coef", "0.01"]


def on_device(cfg: RunConfig, device: str) -> RunConfig:
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"device": device})})


def test_colocated_roles_on_two_nodes_get_one_placement_group_a_node_ranks_in_order():
    cfg = parse_cli([*TWO_NODES, "--train.colocate_all", "--train.device", "cuda", "--vllm.num_engines", "4"])
    assert make_placement(cfg).groups == (GpuGroup(("actor", "ref", "rollout"), num_bundles=4, num_nodes=2),)
    assert run_node_blocks(cfg) == (NodeBlock(group=0, node=0, first_bundle=0, num_bundles=2),
                                    NodeBlock(group=0, node=1, first_bundle=2, num_bundles=2))
    # rank r of every role (and engine r) on bundle r: ranks 0-1 on node 0, ranks 2-3 on node 1, each engine on the
    # GPU of the actor rank that pushes its weights by CUDA IPC
    assert role_bundles(cfg) == (4, {"actor": (0, 0.2), "ref": (0, 0.2), "rollout": (0, 0.2)})
    assert sync_transport(cfg) == "cuda_ipc"
    lines = render_plan(cfg).splitlines()
    assert lines[0] == "device: cuda; needs 4 GPUs (4 bundles) on 2 node(s) of 2"
    assert lines[2:5] == [
        "  group 1: 4 bundles of 1 GPU on 2 node(s); roles and GPU share per bundle: actor 0.2, ref 0.2, rollout 0.2",
        "    node 0: 2 bundles (a placement group of its own), ranks 0-1",
        "    node 1: 2 bundles (a placement group of its own), ranks 2-3"]
    # on CPU each node lends one CPU: two bundles of 0.5 a node, each split in three shares rounded down
    assert role_bundles(on_device(cfg, "cpu")) == (4, {"actor": (0, 0.166), "ref": (0, 0.166), "rollout": (0, 0.166)})
    assert not [p for p in preflight_problems(cfg, 4) if "node" in p]


def test_separate_groups_on_two_nodes_each_get_a_placement_group_a_node():
    cfg = parse_cli([*TWO_NODES, "--train.device", "cuda", "--vllm.num_engines", "3"])
    # the engines' group has no per-node flag: its nodes are as wide as the actor's, the last takes the rest
    assert make_placement(cfg).groups == (GpuGroup(("actor",), 4, 2), GpuGroup(("ref",), 4, 2),
                                          GpuGroup(("rollout",), 3, 2, per_node=2))
    assert run_node_blocks(cfg) == (NodeBlock(group=0, node=0, first_bundle=0, num_bundles=2),
                                    NodeBlock(group=0, node=1, first_bundle=2, num_bundles=2),
                                    NodeBlock(group=1, node=0, first_bundle=4, num_bundles=2),
                                    NodeBlock(group=1, node=1, first_bundle=6, num_bundles=2),
                                    NodeBlock(group=2, node=0, first_bundle=8, num_bundles=2),
                                    NodeBlock(group=2, node=1, first_bundle=10, num_bundles=1))
    assert role_bundles(cfg) == (11, {"actor": (0, 1.0), "ref": (4, 1.0), "rollout": (8, 1.0)})
    assert sync_transport(cfg) == "process_group:nccl"
    # on CPU node 0 of the three groups holds 2 + 2 + 2 bundles, sharing one CPU
    assert role_bundles(on_device(cfg, "cpu")) == (11, {"actor": (0, 0.166), "ref": (4, 0.166), "rollout": (8, 0.166)})
    assert render_plan(cfg).splitlines()[8:11] == [
        "  group 3: 3 bundles of 1 GPU on 2 node(s); roles and GPU share per bundle: rollout 1",
        "    node 0: 2 bundles (a placement group of its own), ranks 0-1",
        "    node 1: 1 bundle (a placement group of its own), rank 2"]


def test_muon_with_the_optimizer_on_the_host_is_refused_naming_both_and_the_fix():
    gpu = ["--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
           "--train.colocate_all", "--rollout.n_samples_per_prompt", "2", *INPUT_FLAGS]
    assert not_implemented(parse_cli([*gpu, "--actor.optim", "muon", "--actor.muon.lr", "0.01"])) == []
    problems = preflight_problems(parse_cli([*gpu, "--actor.optim", "muon", "--ds.adam_offload"]), num_gpus_found=1)
    assert ("actor.optim muon cannot be combined with ds.adam_offload: DeepSpeed's Muon orthogonalises each weight "
            "matrix's update on the GPU, and the seed drops CPU Adam with Muon; drop --ds.adam_offload, or train the "
            "actor with --actor.optim adam") in problems
    gae = [*gpu, "--algo.advantage.estimator", "gae", "--critic.num_gpus_per_node", "1"]
    critic = preflight_problems(parse_cli([*gae, "--critic.optim", "muon", "--ds.adam_offload"]), num_gpus_found=1)
    assert [p for p in critic if "muon" in p] == [
        "critic.optim muon cannot be combined with ds.adam_offload: DeepSpeed's Muon orthogonalises each weight "
        "matrix's update on the GPU, and the seed drops CPU Adam with Muon; drop --ds.adam_offload, or train the "
        "critic with --critic.optim adam"]
    # DeepSpeed's Muon always runs 5 Newton–Schulz steps with Nesterov momentum: other values are not honoured
    assert not_implemented(parse_cli([*gpu, "--actor.optim", "muon", "--actor.muon.ns_steps", "3"])) == [
        "--actor.muon.ns_steps (set to 3)"]


def test_the_optimizer_on_the_host_needs_zero_and_a_compiler_on_gpus(monkeypatch):
    gpu = ["--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
           "--train.colocate_all", "--rollout.n_samples_per_prompt", "2", "--ds.adam_offload", *INPUT_FLAGS]
    monkeypatch.setenv("CXX", "/bin/true")  # any executable: only its presence is checked
    assert preflight_problems(parse_cli(gpu), num_gpus_found=1) == []
    assert preflight_problems(parse_cli([*gpu, "--ds.zero_stage", "0"]), num_gpus_found=1) == [
        "ds.adam_offload needs ZeRO stage 1, 2 or 3 (ZeRO-Offload moves the partitioned optimizer to the host): got "
        "ds.zero_stage 0; pass --ds.zero_stage 2, or drop --ds.adam_offload"]
    monkeypatch.setenv("CXX", "no-such-compiler")
    assert preflight_problems(parse_cli(gpu), num_gpus_found=1) == [
        "ds.adam_offload on GPUs steps with DeepSpeed's CPU Adam, a C++ op built on first use: no C++ compiler "
        "('no-such-compiler', from $CXX or PATH) here; install g++ (and ninja), or drop --ds.adam_offload"]
    assert preflight_problems(parse_cli([*gpu, "--train.device", "cpu"]), num_gpus_found=0) == []  # torch's AdamW


def test_the_plan_says_where_each_optimizer_lives():
    base = ["--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
            "--train.colocate_all", "--algo.advantage.estimator", "gae", "--critic.num_gpus_per_node", "1",
            *INPUT_FLAGS]
    assert not any(line.startswith("optimizer") for line in render_plan(parse_cli(base)).splitlines())
    lines = render_plan(parse_cli([*base, "--actor.optim", "muon", "--actor.muon.lr", "0.01"])).splitlines()
    assert [line for line in lines if line.startswith("optimizer")] == [
        "optimizer (actor): DeepSpeed's Muon, lr 0.01, momentum 0.95 (2-D hidden weights) + Adam, lr 1e-06 "
        "(embeddings, head, norms); states on the device",
        "optimizer (critic): AdamW, lr 9e-06; states on the device"]
    offload = render_plan(parse_cli([*base, "--ds.adam_offload"])).splitlines()
    assert "optimizer (actor): AdamW, lr 1e-06; states and step on the host (ds.adam_offload: DeepSpeed's CPU Adam)" \
        in offload
