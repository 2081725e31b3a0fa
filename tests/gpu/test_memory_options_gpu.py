"""The memory options on the GPU: the optimizer on the host (`--ds.adam_offload`: DeepSpeed's CPU Adam steps there,
and DeepSpeed sleep moves nothing the host already holds), DeepSpeed's Muon on bf16 weights under ZeRO-2 and ZeRO-3,
and a frozen reference whose weights visit the GPU for its forwards only (`--ref.offload`)."""
from __future__ import annotations

import pytest
from gpu_helpers import fixed_sequence
from test_weight_sync_gpu import sft_loss

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def build(make_trainer, standin):
    """Factory of one-rank bf16 trainers of the stand-in with the given ZeRO stage, optimizer and offload (the
    make_trainer fixture has set up the one-rank process group)."""
    from hybrid_core.config import ActorConfig, DsConfig, TrainConfig
    from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine, load_policy, start_sleep_buffer

    def make(zero_stage: int, adam_offload: bool = False, optim: str = "adam", lr: float = 1e-4):
        actor = ActorConfig(model_name_or_path=str(standin), lr_scheduler="constant", adam={"lr": 1e-4}, optim=optim,
                            muon={"lr": lr}, max_norm=0.0)  # Muon's auxiliary Adam (embeddings, norms) keeps 1e-4
        ds = DsConfig(zero_stage=zero_stage, param_dtype="bf16", enable_sleep=True, adam_offload=adam_offload)
        train = TrainConfig(batch_size=1, micro_batch_size=1, device="cuda")
        return DeepSpeedTrainEngine(load_policy(str(standin), actor, ds), actor, ds, train, 10, pad_id=0,
                                    sleep_buffer=start_sleep_buffer(str(standin), ds))
    return make


def loss_after_one_step(trainer) -> float:
    import torch

    prompt, response = fixed_sequence(16, 500), fixed_sequence(128, 501)
    trainer.wake_up()
    trainer.train_micro_batch(sft_loss(prompt, response), is_boundary=True)
    trainer.sleep()
    with torch.no_grad():
        loss, _ = sft_loss(prompt, response)(trainer.engine)
    return float(loss)


def test_the_optimizer_on_the_host_steps_with_cpu_adam_and_sleep_moves_nothing(build, cuda):
    torch = cuda
    trainer = build(zero_stage=2, adam_offload=True)
    assert type(trainer.engine.basic_optimizer).__name__ == "DeepSpeedCPUAdam" and trainer.state_mover is None
    masters = trainer.engine.optimizer.single_partition_of_fp32_groups
    where = [(m.device.type, m.is_pinned(), m.data_ptr()) for m in masters]
    assert all(device == "cpu" and pinned for device, pinned, _ in where)
    offloaded = loss_after_one_step(trainer)
    assert [(m.device.type, m.is_pinned(), m.data_ptr()) for m in masters] == where  # never moved
    numel = sum(p.numel() for p in trainer.module.parameters())
    largest = max(p.numel() for p in trainer.module.parameters())
    torch.cuda.synchronize()
    # asleep: the bf16 weights and DeepSpeed's one-parameter gradient staging buffer, no fp32 state (12 bytes/param)
    # (measured on the H200: 1.466 GiB for the 0.6B stand-in, whose fp32 state would add 6.7 GiB)
    assert torch.cuda.memory_allocated() <= 2 * numel + 2 * largest + 2**27, torch.cuda.memory_allocated() / 2**30
    on_device = loss_after_one_step(build(zero_stage=2))
    assert abs(offloaded - on_device) <= 2e-3 * abs(on_device), (offloaded, on_device)


def test_zero3_with_the_optimizer_on_the_host_frees_only_its_gradient_bucket(build, cuda):
    torch = cuda
    trainer = build(zero_stage=3, adam_offload=True)
    before = loss_after_one_step(trainer)  # trains, then sleeps: the reduce bucket is dropped
    torch.cuda.synchronize()
    asleep = torch.cuda.memory_allocated()
    trainer.wake_up()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() > asleep  # the bucket is allocated again for the next step
    assert loss_after_one_step(trainer) < before  # and the second step trains


def test_zero3_sleep_moves_the_torch_optimizers_states_through_the_pinned_buffer(build, cuda):
    """DeepSpeed's own offload_states refuses a torch optimizer under ZeRO-3; the project's mover takes its fp32
    sub-group partitions and Adam moments, DeepSpeed its gradient partitions, and the round trip changes nothing."""
    torch = cuda
    trainer = build(zero_stage=3)
    assert trainer.state_mover is not None
    numel = sum(p.ds_numel for p in trainer.module.parameters())
    slept = loss_after_one_step(trainer)
    torch.cuda.synchronize()
    free_asleep = torch.cuda.mem_get_info()[0]
    assert trainer.wake_up() >= 12 * numel  # fp32 masters and two Adam moments came back
    torch.cuda.synchronize()
    assert free_asleep - torch.cuda.mem_get_info()[0] >= 0.9 * 12 * numel
    trainer.sleep()
    awake = build(zero_stage=3)
    awake.state_mover, awake.can_sleep = None, False  # the same step without any sleep
    assert abs(slept - loss_after_one_step(awake)) <= 1e-3 * abs(slept)


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_muon_moves_each_hidden_matrix_by_a_bounded_orthogonal_step(build, cuda, zero_stage):
    """Newton–Schulz leaves singular values of about 0.7–1.2 whatever the gradient's scale, so a hidden matrix's
    fp32 master moves by at most ~1.2 · lr · sqrt(max(1, rows / cols)) in spectral norm (Adam's step would be of
    order lr · sqrt(rows · cols))."""
    torch = cuda
    from deepspeed.utils import safe_get_full_fp32_param

    lr = 0.02
    trainer = build(zero_stage=zero_stage, optim="muon", lr=lr)
    assert type(trainer.engine.basic_optimizer).__name__ == "MuonWithAuxAdam"
    matrices = [(n, p) for n, p in trainer.module.named_parameters() if p.use_muon]
    before = {n: safe_get_full_fp32_param(p).clone() for n, p in matrices}
    first = loss_after_one_step(trainer)
    trainer.wake_up()  # ZeRO-2's bf16↔fp32 fragment links exist while awake only
    for name, param in matrices:
        delta = safe_get_full_fp32_param(param) - before[name]
        rows, cols = delta.shape
        spectral = torch.linalg.matrix_norm(delta.float(), ord=2).item()
        assert 0 < spectral <= 1.3 * lr * max(1.0, rows / cols) ** 0.5, (name, spectral)
    assert loss_after_one_step(trainer) < first


def test_the_reference_visits_the_gpu_for_its_forwards_only(cuda, standin):
    torch = cuda
    from hybrid_core.engines.frozen_model import FrozenModel, FrozenModelSettings
    from hybrid_core.engines.ring_attention import RingSettings
    from hybrid_core.engines.sequence_batch import MicroBatching

    def reference(is_offloaded: bool) -> FrozenModel:
        settings = FrozenModelSettings(model_path=str(standin), param_dtype="bf16", batching=MicroBatching(
            num_samples=4), use_liger=None, is_offloaded=is_offloaded, ring=RingSettings(size=1, head_stride=1))
        return FrozenModel(settings, pad_id=0)

    prompts = [fixed_sequence(32, 600 + i) for i in range(4)]
    responses = [fixed_sequence(64, 700 + i) for i in range(4)]
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    offloaded = reference(is_offloaded=True)
    assert torch.cuda.memory_allocated() == allocated  # its weights are in host memory
    assert all(host.is_pinned() for host in offloaded.weights.host_copies)
    got = offloaded.logprobs(prompts, responses)
    assert torch.cuda.memory_allocated() == allocated  # and back there after the forwards
    expected = reference(is_offloaded=False).logprobs(prompts, responses)
    for row, expected_row in zip(got, expected):
        assert row == pytest.approx(expected_row, abs=1e-6)
