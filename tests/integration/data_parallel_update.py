"""Policy updates with DeepSpeed on CPU, run by `torchrun` at 1 or 2 ranks (test_data_parallel_updates.py): one
update for each layout named on the command line, each from freshly loaded weights.

Every rank gets the same 8 samples and seed; rank 0 writes the update (parameter deltas) and the returned statistics
to the output file. Adam's eps is so large that its first step is lr·g/(|g| + eps) ≈ the gradient itself, so the
deltas of two runs compare like their gradients (Adam near eps → 0 would turn tiny gradients into ±lr).
The layout "ring" runs ring attention: at 2 ranks one ring of 2 (`ds.ring_attn_size 2`), each rank computing half of
every packed row, at 1 rank the same work whole; it also writes the policy's logprobs, a value model's values and
the critic's update.
"""
from __future__ import annotations

import os
import sys

import torch


def samples():
    from hybrid_core.engines.actor_trainer import TrainSamples

    g = torch.Generator().manual_seed(7)
    lengths = [3, 5, 8, 2, 6, 4, 7, 1]
    prompts = [torch.randint(3, 100, (4,), generator=g).tolist() for _ in lengths]
    responses = [torch.randint(3, 100, (n,), generator=g).tolist() for n in lengths]
    old = [(-torch.rand(n, generator=g) * 5).tolist() for n in lengths]
    advantages = [torch.randn(n, generator=g).tolist() for n in lengths]
    return TrainSamples(prompts, responses, old, None, advantages)


def full_parameters(module: torch.nn.Module, is_zero3: bool) -> dict[str, torch.Tensor]:
    """Every parameter whole (ZeRO-3 gathers its shards: a collective, so every rank calls it)."""
    if not is_zero3:
        return {n: p.detach().clone() for n, p in module.named_parameters()}
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(module.parameters())):
        return {n: p.detach().clone() for n, p in module.named_parameters()}


def update(model_dir: str, out_path: str, zero_stage: int, packed: bool) -> None:
    from hybrid_core.algorithms.experience import ActorLossSettings
    from hybrid_core.config import ActorConfig, DsConfig, TrainConfig
    from hybrid_core.engines.actor_trainer import fit_actor
    from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine, load_policy
    from hybrid_core.engines.minibatch_updates import BatchPlan
    from hybrid_core.engines.sequence_batch import MicroBatching

    torch.manual_seed(0)
    actor = ActorConfig(model_name_or_path=model_dir, lr_scheduler="constant",
                        adam={"lr": 1e3, "eps": 1e3, "betas": (0.9, 0.95)})
    ds = DsConfig(zero_stage=zero_stage, param_dtype="fp32", packing_samples=packed)
    train = TrainConfig(batch_size=8, micro_batch_size=2, device="cpu", dynamic_batch_enable=packed,
                        max_tokens_per_gpu=16)
    engine = DeepSpeedTrainEngine(load_policy(model_dir, actor, ds), actor, ds, train, 10, pad_id=0)
    before = full_parameters(engine.module, zero_stage == 3)
    batching = MicroBatching(num_samples=2, max_tokens=16 if packed else None, is_packed=packed)
    plan = BatchPlan(batch_size=8, batching=batching, max_epochs=1, seed=3)
    stats = fit_actor(engine, samples(), ActorLossSettings(kl_coef=0.0), plan)
    after = full_parameters(engine.module, zero_stage == 3)
    if engine.rank == 0:
        deltas = {n: after[n] - before[n] for n in before}
        torch.save({"deltas": deltas, "stats": stats, "world_size": engine.world_size}, out_path)


def ring(model_dir: str, out_path: str) -> None:
    """Layout "ring": logprobs and values (no-grad forwards), then a GSPO update with an entropy bonus (sequence-
    level ratios and per-token entropies both span the ranks' chunks) and a critic update, all on packed
    micro-batches of at most 16 tokens split over the ring."""
    from hybrid_core.algorithms.experience import ActorLossSettings
    from hybrid_core.config import ActorConfig, CriticConfig, DsConfig, TrainConfig
    from hybrid_core.engines.actor_trainer import fit_actor
    from hybrid_core.engines.critic_trainer import CriticSamples, fit_critic
    from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine, load_policy
    from hybrid_core.engines.frozen_model import attn_implementation_for
    from hybrid_core.engines.minibatch_updates import BatchPlan
    from hybrid_core.engines.sequence_batch import MicroBatching
    from hybrid_core.engines.value_model import batched_values, load_value_model

    torch.manual_seed(0)
    adam = {"lr": 1e3, "eps": 1e3, "betas": (0.9, 0.95)}
    actor = ActorConfig(model_name_or_path=model_dir, lr_scheduler="constant", adam=adam)
    ds = DsConfig(zero_stage=2, param_dtype="fp32", packing_samples=True,
                  ring_attn_size=int(os.environ.get("WORLD_SIZE", "1")))
    train = TrainConfig(batch_size=8, micro_batch_size=2, device="cpu", dynamic_batch_enable=True,
                        max_tokens_per_gpu=16)
    batching = MicroBatching(num_samples=2, max_tokens=16, is_packed=True)
    plan = BatchPlan(batch_size=8, batching=batching, max_epochs=1, seed=3)
    policy = DeepSpeedTrainEngine(load_policy(model_dir, actor, ds), actor, ds, train, 10, pad_id=0)
    data = samples()
    logprobs = policy.logprobs(data.prompt_ids, data.response_ids, batching)
    value_model = load_value_model(model_dir, "fp32", "score", attn_implementation_for(True, ds.ring_attn_size > 1))
    g = torch.Generator().manual_seed(5)  # the same head and returns on every rank and in both runs
    torch.nn.init.normal_(value_model.score.weight, std=0.5, generator=g)
    values = batched_values(value_model, data.prompt_ids, data.response_ids, 0, batching, policy.ring)
    before = full_parameters(policy.module, False)
    loss = ActorLossSettings(kl_coef=0.0, loss_type="gspo", entropy_coef=0.01)
    stats = fit_actor(policy, data, loss, plan)
    policy_deltas = {n: p.detach() - before[n] for n, p in policy.module.named_parameters()}
    critic_config = CriticConfig(lr_scheduler="constant", adam=adam)
    critic = DeepSpeedTrainEngine(value_model, critic_config, ds, train, 10, pad_id=0)
    before = full_parameters(critic.module, False)
    returns = [(torch.randn(len(r), generator=g) * 0.5).tolist() for r in data.response_ids]
    critic_stats = fit_critic(critic, CriticSamples(data.prompt_ids, data.response_ids, values, returns), 0.2, plan)
    if policy.rank == 0:
        critic_deltas = {n: p.detach() - before[n] for n, p in critic.module.named_parameters()}
        torch.save({"logprobs": logprobs, "values": values, "deltas": policy_deltas, "stats": stats,
                    "critic_deltas": critic_deltas, "critic_stats": critic_stats, "world_size": policy.world_size,
                    "ring_size": ds.ring_attn_size}, out_path)


def main(model_dir: str, out_dir: str, layouts: list[str]) -> None:
    """One update per layout ("<zero stage>-<padded|packed>"), one engine after another in this process: rank 0
    writes `<out_dir>/<layout>.pt`."""
    import torch.distributed as dist

    for layout in layouts:
        if layout == "ring":
            ring(model_dir, f"{out_dir}/{layout}.pt")
            continue
        zero_stage, batching = layout.split("-")
        update(model_dir, f"{out_dir}/{layout}.pt", int(zero_stage), batching == "packed")
    dist.barrier()  # an orderly teardown: a rank leaving while the group's threads run aborts ("terminate called")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
