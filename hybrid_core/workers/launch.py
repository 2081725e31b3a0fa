"""Opening a run and starting or stopping its workers: named actors on their slots, re-attached or restored.

Owns what happens before the first step runs: the run directory's lease, refusing a directory that holds data but no
manifest, saving (or checking) the configuration, and deciding by the step contract where the run continues —
with the live workers when they hold exactly the version it needs, else with new ones restored from the newest
checkpoint before that step. It knows nothing about Prefect.
"""
from __future__ import annotations

import ray

from hybrid_core.config import RunConfig
from hybrid_core.data.rollout_store import RolloutStore
from hybrid_core.data.run_lease import RunLease
from hybrid_core.engines.checkpoint import newest_checkpoint
from hybrid_core.plan.run_plan import RunPlan, run_plan
from hybrid_core.plan.preflight import run_dir_problems
from hybrid_core.step_contract import LiveVersions, can_reattach, first_incomplete_step, restore_step
from hybrid_core.types import PermanentError, RunRef, WorkersStarted
from hybrid_core.workers import placement
from hybrid_core.workers.actor import ActorWorker
from hybrid_core.workers.critic import CriticWorker
from hybrid_core.workers.ref import RefWorker
from hybrid_core.workers.reward_model import RewardModelWorker
from hybrid_core.workers.rollout import RolloutWorker
from hybrid_core.workers.rollout_ahead import CONCURRENCY_GROUPS
from hybrid_core.workers.worker_args import (actor_args, ckpt_root, critic_args, model_output_uri, ref_settings,
                                             reward_model_settings, rollout_args)

LIVE_TIMEOUT_S = 120  # a live worker still finishing a call of the killed driver answers after it
CLOSE_TIMEOUT_S = 15  # flushing the metric sinks takes well under a second


class RunDirectoryError(PermanentError, ValueError):
    """The run directory cannot be used for this run: it holds data but no manifest, or another configuration."""


def lease_run_dir(run: RunRef) -> RunLease:
    """The run directory's lease (not yet taken: use it as a context manager around the whole run)."""
    return RunLease(run.run_dir, run.run_id)


def open_run(cfg: RunConfig, run: RunRef, must_exist: bool = False) -> bool:
    """Save the run's configuration on first use (manifest + config.yaml); on later use refuse a changed one.
    A directory with data but no manifest is refused, never overwritten. True when the run already existed;
    `must_exist` (a resume) refuses to start a new one."""
    from hybrid_core.flags import config_to_yaml

    if problems := run_dir_problems(cfg, run.run_dir, must_exist):
        raise RunDirectoryError("\n".join(problems))
    store = RolloutStore(run.run_dir)
    manifest = store.manifest()
    if "config" in manifest:
        return True
    store.write_json("manifest.json", manifest | {"config": cfg.model_dump(mode="json"), "run_id": run.run_id})
    store.fs.pipe_file(f"{store.root}/config.yaml", config_to_yaml(cfg).encode())
    return False


def _spawn_all(cfg: RunConfig, run: RunRef, plan: RunPlan) -> int:
    """Start every actor of the run at once (their processes import side by side), then build their engines; returns
    the run's number of steps. On a GPU the rollout engines are built first (their memory profile must run before
    the trainers allocate), then the actor's, reference's, critic's and reward model's ranks together; on CPU all at
    once."""
    slots = {row.role: placement.Slot(row.first_bundle, row.share) for row in plan.rows}
    on_cpu = cfg.train.device == "cpu"
    pg = placement.RunPlacement(run, plan.blocks, on_cpu)
    ranks = plan.role_ranks
    layout = plan.engines  # engine e's TP workers on bundles e·T … e·T + T − 1 of the rollout's
    groups = CONCURRENCY_GROUPS if run.async_queue_size else None  # async: batches generate beside other calls
    engines = [pg.spawn(RolloutWorker, "rollout", placement.Slot(layout.bundles(e).start, slots["rollout"].share),
                        rank=e, tp_bundles=layout.bundles(e) if layout.tensor_parallel_size > 1 else (),
                        concurrency_groups=groups)
               for e in range(layout.num_engines)]
    groups = {role: _spawn_ranks(pg, cls, role, slots[role], ranks[role])
              for role, cls, is_used in (("actor", ActorWorker, True), ("ref", RefWorker, cfg.uses_ref),
                                         ("critic", CriticWorker, cfg.uses_critic),
                                         ("reward", RewardModelWorker, cfg.uses_reward_model)) if is_used}
    faults, extensions = placement.injected_faults(), placement.extensions_dir()
    rollout = rollout_args(cfg, faults, plan=plan)
    num_steps = rollout.prompts.num_steps()  # counted here while the processes import: the trainers need it
    seen = _ask_sees_run_dir(run, {"rollout": engines} | groups)
    building = [e.construct.remote(run, rollout, rank) for rank, e in enumerate(engines)]
    if not on_cpu:
        ray.get(building, timeout=placement.READY_TIMEOUT_S)
    policy = actor_args(cfg, num_steps, run, extensions, faults, placement.has_wandb_key(), plan=plan)
    critic = critic_args(cfg, num_steps, run, extensions, plan=plan) if cfg.uses_critic else None
    args_of = {"actor": lambda rank: (run, policy, rank), "critic": lambda rank: (run, critic, rank),
               "ref": lambda rank: (ref_settings(cfg),),  # the reference's and reward model's replicas: no rank
               "reward": lambda rank: (reward_model_settings(cfg),)}
    building += _construct_where_they_meet(groups, args_of)
    _check_run_dir_shared(cfg, seen)
    ray.get(building, timeout=placement.READY_TIMEOUT_S)
    counted = ray.get(engines[0].info.remote(), timeout=placement.READY_TIMEOUT_S)["num_steps"]
    if counted != num_steps:  # the driver and the engine read the same dataset the same way: a changed file
        raise RuntimeError(f"data.prompt_dataset {cfg.data.prompt_dataset!r} changed while the run started: "
                           f"{num_steps} steps counted by the driver, {counted} by the rollout engine; start again")
    return num_steps


def _rank_slot(first: placement.Slot, rank: int) -> placement.Slot:
    """Rank r of a role sits on the r-th bundle of its group (with colocation, beside the other roles' rank r)."""
    return placement.Slot(first.bundle_index + rank, first.share)


def _spawn_ranks(pg: placement.RunPlacement, cls, role: str, first: placement.Slot, num_ranks: int) -> list:
    """The role's ranks, in order across its nodes (rank r on the r-th bundle of its group: see `layout.node_blocks`)."""
    return [pg.spawn(cls, role, _rank_slot(first, rank), rank=rank, rendezvous=placement.Rendezvous(rank, num_ranks))
            for rank in range(num_ranks)]


def _construct_where_they_meet(groups: dict[str, list], args_of: dict) -> list:
    """Construct each role's ranks as soon as its rank 0, once its process is up, has said where they meet: its
    node's address and a port free there (the driver may be on another node, and 127.0.0.1 reaches only a rank's
    own). A role's ranks are constructed together: each DeepSpeed rank's start-up waits until all have joined."""
    asked = {groups[role][0].rendezvous_point.remote(): role for role in groups}
    building = []
    while asked:
        answered, _ = ray.wait(list(asked), num_returns=1, timeout=placement.READY_TIMEOUT_S)
        if not answered:
            raise TimeoutError(f"rank 0 of {sorted(asked.values())} did not start within {placement.READY_TIMEOUT_S}s")
        role, meet_at = asked.pop(answered[0]), ray.get(answered[0])
        building += [handle.construct.remote(*args_of[role](rank), _meet_at=meet_at)
                     for rank, handle in enumerate(groups[role])]
    return building


def _ask_sees_run_dir(run: RunRef, workers: dict[str, list]) -> list[tuple[str, object, object]]:
    """Ask every worker whether its node sees the run's manifest, as the driver does: `(label, handle, object ref)`,
    answered once its process is up (nothing to ask when workers start before the run is opened, as in tests)."""
    if not RolloutStore(run.run_dir).exists("manifest.json"):
        return []
    return [(f"{role} rank {rank}", handle, handle.sees.remote(run.run_dir))
            for role, handles in workers.items() for rank, handle in enumerate(handles)]


def _check_run_dir_shared(cfg: RunConfig, seen: list[tuple[str, object, object]]) -> None:
    """Refuse a run whose workers do not all see its run directory: on several nodes store.root must be a shared
    filesystem or an object store, or each node's datasets and checkpoint shards would stay on its own disk."""
    answers = ray.get([ref for _, _, ref in seen], timeout=placement.READY_TIMEOUT_S)
    blind = [(label, handle) for (label, handle, _), sees in zip(seen, answers) if not sees]
    if not blind:
        return
    nodes = ray.get([handle.whereabouts.remote() for _, handle in blind], timeout=placement.READY_TIMEOUT_S)
    where = ", ".join(f"{label} (node {node['node_ip']})" for (label, _), node in zip(blind, nodes))
    raise RunDirectoryError(f"store.root {cfg.store.root!r} is not shared by the run's nodes: {where} cannot see "
                            "the run's manifest.json, which the driver wrote; on several nodes give --store.root a "
                            "filesystem every node mounts, or s3://bucket/prefix")


def live_versions(run: RunRef, engines: int, ranks: dict[str, int]) -> tuple[LiveVersions | None, int]:
    """What the run's live actors hold and the run's step count, or (None, 0) when any rank of any role is gone
    or the roles disagree (a lone rank 0 would wait forever for its peers in DeepSpeed's collectives)."""
    try:
        actor = ray.get(placement.get_worker(run, "actor").ready.remote(), timeout=LIVE_TIMEOUT_S)
        infos = ray.get([placement.get_worker(run, "rollout", rank).info.remote() for rank in range(engines)],
                        timeout=LIVE_TIMEOUT_S)
        others = [(role, rank) for role, count in ranks.items() for rank in range(count)
                  if (role, rank) != ("actor", 0)]
        answers = ray.get([placement.get_worker(run, role, rank).ready.remote() for role, rank in others],
                          timeout=LIVE_TIMEOUT_S)
    except (ValueError, ray.exceptions.RayError):
        return None, 0
    trained = {actor["trained_step"]} | {a["trained_step"] for a in answers if isinstance(a, dict)}
    if len(trained) != 1:  # e.g. the critic trained a step the policy did not
        return None, 0
    live = LiveVersions(trained_step=actor["trained_step"], policy_version=actor["policy_version"],
                        rollout_version=min(info["policy_version"] for info in infos))
    return live, infos[0]["num_steps"]


def settle_generation(run: RunRef) -> None:
    """Async mode, re-attaching: wait for a batch the killed driver's call is still generating, and say which
    batches are kept (written ahead, not yet consumed) and which were lost with an earlier process (generated
    again when their step comes; never one a step consumed)."""
    settled = ray.get(placement.get_worker(run, "rollout").settle.remote(), timeout=run.stage_timeout_s)
    print(f"async rollout: waited {settled['waited_s']:.1f}s for in-flight generation; batches kept for steps "
          f"{settled['ready'] or 'none'}, lost in flight and generated again: {settled['lost'] or 'none'}")


def start_workers(cfg: RunConfig, run: RunRef, plan: RunPlan | None = None) -> WorkersStarted:
    """Re-attach to the run's live actors when they hold exactly the version its first incomplete step needs;
    otherwise create them on the run's plan (the preflight's; made here without one) and restore the newest
    checkpoint before that step (the steps after it are replayed from the store)."""
    plan = plan or run_plan(cfg)
    placement.connect()
    # first the live workers: one still finishing the killed driver's last call answers after it has committed, so
    # the manifest read next holds that stage (read before, it would miss it and the workers would look a step ahead)
    live, num_steps = live_versions(run, plan.engines.num_engines, plan.role_ranks)
    store = RolloutStore(run.run_dir)
    steps, committed = store.manifest()["steps"], store.committed_markers()
    first = first_incomplete_step(steps, committed, save_steps=cfg.ckpt.save_steps, eval_steps=cfg.eval.steps)
    done = {stage for k, stage in committed if k == first}
    model_uri = model_output_uri(cfg, run)
    if can_reattach(live, first, steps.get(str(first), {}), done):
        if run.async_queue_size:
            settle_generation(run)
        return WorkersStarted(num_steps=num_steps, next_step=first, restored_step=live.trained_step, is_attached=True,
                              model_uri=model_uri)
    placement.kill_run(run)
    num_steps = _spawn_all(cfg, run, plan)
    restored = restore_step(first, steps)
    if not steps and cfg.ckpt.load_enable:  # a new run that starts from the newest checkpoint under ckpt.path
        restored = newest_checkpoint(ckpt_root(cfg, run))
    if restored:
        actor = placement.get_worker(run, "actor")
        ray.get(actor.restore.remote(restored), timeout=placement.READY_TIMEOUT_S)
        ray.get(actor.push_to_engines.remote(restored), timeout=placement.READY_TIMEOUT_S)
    if run.async_queue_size:
        settle_generation(run)
    return WorkersStarted(num_steps=num_steps, next_step=restored + 1, restored_step=restored, is_attached=False,
                          model_uri=model_uri)


def stop_workers(run: RunRef) -> None:
    """Let the actor flush its metric sinks, then kill every actor of the run."""
    if not ray.is_initialized():
        return
    try:  # a worker still busy (a hung stage) gets a short wait: the run is over either way
        ray.get(placement.get_worker(run, "actor").close.remote(), timeout=CLOSE_TIMEOUT_S)
    except (ValueError, ray.exceptions.RayError):
        pass  # no live actor, or a busy one: nothing more to flush
    placement.kill_run(run)
