"""layout (engines): where an engine's TP workers sit and which actor rank feeds each; the run's layout from its
configuration (plan.engine_layout), what `hybrid plan` shows of it, what a GPU engine's process is told (placement)
where a GPU engine and its workers sit on several nodes (placement.seat), and how vLLM runs the workers
(vllm_rollout.executor_backend, among the engine's options) and where its core runs (vllm.engine_core_process)."""
import os

import pytest

from hybrid_core.config import ConfigError
from hybrid_core.layout import EngineLayout
from hybrid_core.engines.vllm_rollout import EngineSettings, engine_options, executor_backend
from hybrid_core.flags import parse_cli
from hybrid_core.plan.run_plan import engine_layout, role_bundles, run_node_blocks, sync_transport
from hybrid_core.plan.refusals import preflight_problems
from hybrid_core.plan.report import engine_lines, render_plan
from hybrid_core.workers.placement import pg_name, role_env, seat, tp_engine_env
from hybrid_core.workers.worker_args import run_ref
from test_plan import INPUT_FLAGS


def colocated(gpus: int, engines: int, tp: int, *extra: str):
    return parse_cli(["--actor.num_gpus_per_node", str(gpus), "--ref.num_gpus_per_node", str(gpus),
                      "--vllm.num_engines", str(engines), "--vllm.tensor_parallel_size", str(tp),
                      "--train.colocate_all", "--ds.zero_stage", "2", "--rollout.n_samples_per_prompt", "2",
                      *INPUT_FLAGS, *extra])


def test_engines_take_consecutive_bundles_and_each_rank_feeds_the_worker_on_its_gpu():
    layout = EngineLayout(num_engines=2, tensor_parallel_size=4)
    assert [list(layout.bundles(e)) for e in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # rank r's GPU (bundle r) holds a worker of engine r // 4; ranks 0 and 4 send their engine every rank's handles
    assert [layout.engine_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [r for r in range(8) if layout.leads(r)] == [0, 4]
    assert [list(layout.feeders(e)) for e in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # TP 1: one engine per rank, each rank its own engine's only feeder
    single = EngineLayout(num_engines=3, tensor_parallel_size=1)
    assert [(single.engine_of(r), single.leads(r), list(single.feeders(r))) for r in range(3)] == [
        (0, True, [0]), (1, True, [1]), (2, True, [2])]
    # a run without vllm.num_engines: one engine, beside rank 0; rank 1 feeds nothing
    assert (EngineLayout(1, 1).engine_of(1), EngineLayout(1, 1).leads(1)) == (None, False)


def test_engine_bundles_start_at_the_rollout_group_and_bad_shapes_are_refused():
    assert list(EngineLayout(num_engines=2, tensor_parallel_size=2, first_bundle=3).bundles(1)) == [5, 6]
    with pytest.raises(ValueError, match="engine 2 is outside the run's 2 engines"):
        EngineLayout(2, 2).bundles(2)
    with pytest.raises(ValueError, match="got 0 engines of 2 TP workers"):
        EngineLayout(0, 2)


def test_the_run_layout_follows_the_rollout_bundles():
    cfg = colocated(4, 2, 2)
    assert engine_layout(cfg) == EngineLayout(num_engines=2, tensor_parallel_size=2, first_bundle=0)
    assert sync_transport(cfg) == "cuda_ipc" and preflight_problems(cfg, num_gpus_found=4) == []
    # distributed mode on CPU: actor, ref, then the engines' own bundles
    apart = parse_cli(["--train.device", "cpu", "--vllm.num_engines", "2", "--algo.kl.init_coef", "0.01",
                       "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--critic.num_gpus_per_node",
                       "2", *INPUT_FLAGS])
    assert role_bundles(apart)[1]["rollout"][0] == 4  # after the actor's, the reference's and the critic's 2
    assert engine_layout(apart) == EngineLayout(num_engines=2, tensor_parallel_size=1, first_bundle=4)


def test_plan_shows_each_engines_bundles_and_feeders():
    lines = render_plan(colocated(4, 2, 2)).splitlines()
    start = lines.index("rollout: 2 vLLM engines × TP 2, shares the actor's GPUs, gpu_memory_utilization 0.95")
    assert lines[start + 1:start + 3] == [
        "    engine 0: TP workers on bundles 0-1, weights by CUDA IPC from actor ranks 0-1 (one per GPU)",
        "    engine 1: TP workers on bundles 2-3, weights by CUDA IPC from actor ranks 2-3 (one per GPU)"]
    # on CPU the weights go by value: only the bundles are shown; TP 1 shows nothing more
    assert engine_lines(EngineLayout(1, 2), by_cuda_ipc=False) == ["    engine 0: TP workers on bundles 0-1"]
    assert engine_lines(EngineLayout(4, 1), by_cuda_ipc=True) == []


def test_tp_engines_on_their_own_gpus_are_refused_naming_the_fix():
    apart = parse_cli(["--train.device", "cuda", "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "2",
                       "--algo.kl.init_coef", "0.01", "--actor.num_gpus_per_node", "1",
                       "--ref.num_gpus_per_node", "1", *INPUT_FLAGS])
    assert ("not implemented yet: vLLM tensor parallelism (vllm.tensor_parallel_size 2) on engines' own GPUs (the "
            "weights' broadcast reaches an engine's process, not its TP workers); add --train.colocate_all (engines "
            "× TP = the actor's GPUs), or use --vllm.tensor_parallel_size 1") in preflight_problems(apart, 4)


def test_tp_needs_an_engine_count():
    with pytest.raises(ValueError, match=r"vllm.tensor_parallel_size 2 needs vllm.num_engines: got none; pass "
                                         r"--vllm.num_engines 2 \(engines × TP = the actor's 4 GPUs\)"):
        parse_cli(["--actor.num_gpus_per_node", "4", "--ref.num_gpus_per_node", "4", "--train.colocate_all",
                   "--vllm.tensor_parallel_size", "2"])


def test_an_engine_of_tp_workers_is_told_their_bundles_and_share_on_gpus_and_not_to_bind_threads_on_cpu():
    assert tp_engine_env([4, 5], 0.2) == {"VLLM_RAY_BUNDLE_INDICES": "4,5", "VLLM_RAY_PER_WORKER_GPUS": "0.2"}
    # vLLM's CPU build binds each TP worker's threads to a NUMA node of its own unless told not to (one node here)
    assert role_env("rollout", on_cpu=True)["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in role_env("rollout", on_cpu=False)


def test_on_two_nodes_an_engine_and_its_tp_workers_sit_in_their_nodes_placement_group_beside_their_feeders():
    cfg = colocated(4, 4, 2, "--actor.num_nodes", "2", "--ref.num_nodes", "2")
    assert preflight_problems(cfg, num_gpus_found=8) == []
    run, blocks, layout = run_ref(cfg, "r"), run_node_blocks(cfg), engine_layout(cfg)
    share = role_bundles(cfg)[1]["rollout"][1]

    def spawned(engine: int) -> tuple[str, int, dict[str, str]]:
        """What `launch` asks `RunPlacement.spawn` for engine `engine` and where it goes: its placement group, its
        process's bundle there and the env that places its TP workers."""
        block, index, workers = seat(blocks, layout.bundles(engine).start, layout.bundles(engine))
        return pg_name(run, block), index, tp_engine_env(workers, share)

    # 8 bundles (actor rank r on bundle r), one STRICT_PACK group a node: bundles 0-3 on node 0, 4-7 on node 1;
    # engine e's workers on run-wide bundles 2e, 2e + 1: engines 0, 1 in node 0's group, 2, 3 in node 1's, their
    # indices counted within that group (what VLLM_RAY_BUNDLE_INDICES means to vLLM's Ray executor)
    assert [spawned(engine) for engine in range(4)] == [
        ("r/pg/0/0", 0, {"VLLM_RAY_BUNDLE_INDICES": "0,1", "VLLM_RAY_PER_WORKER_GPUS": "0.2"}),
        ("r/pg/0/0", 2, {"VLLM_RAY_BUNDLE_INDICES": "2,3", "VLLM_RAY_PER_WORKER_GPUS": "0.2"}),
        ("r/pg/0/1", 0, {"VLLM_RAY_BUNDLE_INDICES": "0,1", "VLLM_RAY_PER_WORKER_GPUS": "0.2"}),
        ("r/pg/0/1", 2, {"VLLM_RAY_BUNDLE_INDICES": "2,3", "VLLM_RAY_PER_WORKER_GPUS": "0.2"})]
    # the actor ranks feeding each engine (CUDA IPC, one per GPU) sit on exactly its workers' bundles
    actor_first = role_bundles(cfg)[1]["actor"][0]
    for engine in range(4):
        block, _, worker_indices = seat(blocks, layout.bundles(engine).start, layout.bundles(engine))
        assert [seat(blocks, actor_first + rank)[:2] for rank in layout.feeders(engine)] == [
            (block, index) for index in worker_indices]
    # an engine whose workers would straddle two nodes' groups is refused, naming both and the rule
    with pytest.raises(ValueError, match=r"bundles \[3, 3, 4\] must share one node's placement group: they fall in "
                                         r"group 1 node 0, group 1 node 1; .* must divide actor.num_gpus_per_node"):
        seat(blocks, 3, (3, 4))


def test_tp_workers_run_as_ray_actors_on_gpus_and_as_child_processes_on_cpu():
    assert [executor_backend("cuda", 1), executor_backend("cuda", 2), executor_backend("cpu", 2)] == [
        None, "ray", "mp"]
    # one worker: in this process unless the configuration asks for a child process
    assert [executor_backend("cuda", 1, "uni"), executor_backend("cuda", 1, "mp"), executor_backend("cpu", 1, "mp")
            ] == [None, "mp", "mp"]


def test_a_one_worker_engine_can_run_its_model_runner_in_a_child_process_and_only_it():
    from hybrid_core.workers.worker_args import engine_settings

    cfg = parse_cli(["--actor.model_name_or_path", "m", "--vllm.executor_backend", "mp", "--train.colocate_all"])
    assert engine_options(engine_settings(cfg), "cuda") == {"distributed_executor_backend": "mp"}
    with pytest.raises(ConfigError) as info:
        colocated(2, 1, 2, "--vllm.executor_backend", "mp")
    assert info.value.problems == ["vllm.executor_backend 'mp' is for engines of one TP worker: got "
                                   "vllm.tensor_parallel_size 2 (its workers run as Ray actors on GPUs, as child "
                                   "processes on CPU); drop --vllm.executor_backend"]
    with pytest.raises(ConfigError, match=r"vllm.executor_backend 'mp' on GPUs needs train.colocate_all .* got "
                                          r"train.colocate_all=False; add --train.colocate_all or drop"):
        parse_cli(["--actor.model_name_or_path", "m", "--vllm.executor_backend", "mp", "--vllm.num_engines", "1"])


def test_a_colocated_one_worker_gpu_engine_runs_its_model_runner_in_a_child_process_by_default():
    from hybrid_core.workers.worker_args import engine_settings

    default = colocated(1, 1, 1)
    assert default.vllm.executor_backend is None and default.engine_executor == "mp"
    assert engine_options(engine_settings(default), "cuda") == {"distributed_executor_backend": "mp"}
    # asked for: in the rollout worker's own process, as vLLM's own default
    inside = colocated(1, 1, 1, "--vllm.executor_backend", "uni")
    assert inside.engine_executor == "uni" and engine_options(engine_settings(inside), "cuda") == {}
    # on CPU, and on GPUs apart from the actor, in the worker's process; TP > 1 is the engine's own rule
    on_cpu = colocated(1, 1, 1, "--train.device", "cpu")
    apart = parse_cli(["--vllm.num_engines", "1", *INPUT_FLAGS])
    assert [on_cpu.engine_executor, apart.engine_executor, colocated(2, 1, 2).engine_executor] == ["uni", "uni", None]
    assert engine_settings(colocated(2, 1, 2)).executor_backend is None
    # `hybrid plan` says where the model runner runs
    assert ("rollout: 1 vLLM engines × TP 1, shares the actor's GPUs, gpu_memory_utilization 0.95, model runner in "
            "a child process (vllm.executor_backend mp)") in render_plan(default).splitlines()
    assert render_plan(on_cpu).splitlines()[3].endswith(
        ", model runner in the rollout worker's process (vllm.executor_backend uni)")


def test_the_engine_core_goes_apart_only_where_the_weights_reach_it_as_cuda_ipc_buckets():
    from hybrid_core.workers.worker_args import engine_settings

    apart = colocated(1, 1, 1, "--vllm.engine_core_process")
    assert engine_settings(apart).engine_core_process and not engine_settings(colocated(1, 1, 1)).engine_core_process
    assert render_plan(apart).splitlines()[3].endswith(", model runner in a child process (vllm.executor_backend mp),"
                                                       " engine core in a process of its own")
    assert not render_plan(colocated(1, 1, 1)).splitlines()[3].endswith("of its own")
    refused = {"cpu": ("--train.device", "cpu"), "tp2": ("--vllm.tensor_parallel_size", "2"), "apart": ()}
    expected = {"cpu": "train.device='cpu', train.colocate_all=True, vllm.tensor_parallel_size 1",
                "tp2": "train.device='cuda', train.colocate_all=True, vllm.tensor_parallel_size 2",
                "apart": "train.device='cuda', train.colocate_all=False, vllm.tensor_parallel_size 1"}
    for case, flags in refused.items():
        with pytest.raises(ConfigError) as info:
            if case == "apart":
                parse_cli(["--vllm.num_engines", "1", "--vllm.engine_core_process", *INPUT_FLAGS])
            else:
                colocated(1, 1, 1, "--vllm.engine_core_process", *flags)
        assert (f"vllm.engine_core_process needs GPUs, train.colocate_all and vllm.tensor_parallel_size 1 (its "
                f"weights come as CUDA IPC buckets): got {expected[case]}; drop --vllm.engine_core_process"
                ) in info.value.problems, case


def test_vllm_is_told_where_the_engine_core_runs_until_it_keeps_its_environment(monkeypatch):
    import vllm.envs as envs

    from hybrid_core.engines.vllm_rollout import place_engine_core

    cached = envs._is_envs_cache_enabled()
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    place_engine_core(True)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1" and envs.VLLM_ENABLE_V1_MULTIPROCESSING is True
    place_engine_core(False)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and envs.VLLM_ENABLE_V1_MULTIPROCESSING is False
    envs.enable_envs_cache()  # what vLLM does once an engine core or a worker process starts
    try:
        place_engine_core(False)  # the same place: nothing to move
        with pytest.raises(RuntimeError, match=r"vLLM cannot put this engine's core in a process of its own: an "
                                               r"engine already ran in this process"):
            place_engine_core(True)
    finally:
        if not cached:
            envs.disable_envs_cache()


def test_the_engine_options_pass_what_the_configuration_sets_and_leave_the_rest_to_vllm():
    from hybrid_core.workers.worker_args import engine_settings

    cfg = parse_cli(["--actor.model_name_or_path", "m", "--vllm.attention_backend", "TRITON_ATTN",
                     "--vllm.max_num_seqs", "64", "--vllm.tensor_parallel_size", "2", "--data.max_len", "1152",
                     "--vllm.block_size", "64", "--vllm.kv_cache_dtype", "fp8"])
    assert engine_options(engine_settings(cfg), "cuda") == {"max_num_seqs": 64, "block_size": 64,
                                                            "kv_cache_dtype": "fp8",
                                                            "attention_config": {"backend": "TRITON_ATTN"},
                                                            "distributed_executor_backend": "ray"}
    plain = EngineSettings(model_path="m", gpu_memory_utilization=0.5, seed=0, max_model_len=1152)
    assert engine_options(plain, "cuda") == {}
    # the CPU build prefills a prompt whole: its token budget covers the longest sequence, at least vLLM's 4096
    assert engine_options(plain, "cpu") == {"enable_chunked_prefill": False, "max_num_batched_tokens": 4096}
