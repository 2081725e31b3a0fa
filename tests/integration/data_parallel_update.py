"""Policy updates with DeepSpeed on CPU, run by `torchrun` at 1 or 2 ranks (test_data_parallel_updates.py): one
update for each layout named on the command line, each from freshly loaded weights. A layout is
`<ZeRO stage>-<padded|packed>[-tied][-chunk<C>]`: `tied` trains the model with tied embeddings (the second model
directory), `chunk<C>` runs the vocabulary head C response tokens at a time (default: all of them in one chunk).

Every rank gets the same 8 samples and seed; rank 0 writes the update (parameter deltas) and the returned statistics
to the output file. Adam's eps is so large that its first step is lr·g/(|g| + eps) ≈ the gradient itself, so the
deltas of two runs compare like their gradients (Adam near eps → 0 would turn tiny gradients into ±lr).
"""
from __future__ import annotations

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


def update(model_dir: str, out_path: str, zero_stage: int, packed: bool, chunk_tokens: int) -> None:
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
    batching = MicroBatching(num_samples=2, max_tokens=16 if packed else None, is_packed=packed,
                             logit_chunk_tokens=chunk_tokens)
    plan = BatchPlan(batch_size=8, batching=batching, max_epochs=1, seed=3)
    stats = fit_actor(engine, samples(), ActorLossSettings(kl_coef=0.0), plan)
    after = full_parameters(engine.module, zero_stage == 3)
    if engine.rank == 0:
        deltas = {n: after[n] - before[n] for n in before}
        torch.save({"deltas": deltas, "stats": stats, "world_size": engine.world_size}, out_path)


def main(model_dir: str, tied_model_dir: str, out_dir: str, layouts: list[str]) -> None:
    """One update per layout (see the module docstring), one engine after another in this process: rank 0 writes
    `<out_dir>/<layout>.pt`."""
    import torch.distributed as dist

    from hybrid_core.config import LOGIT_CHUNK_TOKENS

    for layout in layouts:
        zero_stage, batching, *options = layout.split("-")
        chunks = [int(option.removeprefix("chunk")) for option in options if option.startswith("chunk")]
        update(tied_model_dir if "tied" in options else model_dir, f"{out_dir}/{layout}.pt", int(zero_stage),
               batching == "packed", chunks[0] if chunks else LOGIT_CHUNK_TOKENS)
    dist.barrier()  # an orderly teardown: a rank leaving while the group's threads run aborts ("terminate called")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
