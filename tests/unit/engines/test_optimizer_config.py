"""The optimizer half of the DeepSpeed config (engines/optimizer_config.py): AdamW on the device or the host, Muon with
its auxiliary Adam, and what each ZeRO stage needs."""
import pytest

from hybrid_core.config import ActorConfig, DsConfig, TrainConfig
from hybrid_core.engines.deepspeed_train import ds_config
from hybrid_core.engines.optimizer_config import optimizer_block, zero_block

ADAM = {"lr": 3e-6, "betas": (0.8, 0.99), "eps": 1e-7, "weight_decay": 0.1}


def test_adamw_on_the_device_is_torchs():
    block = optimizer_block(ActorConfig(adam=ADAM), DsConfig(), "cuda")
    assert block == {"type": "AdamW", "params": {"lr": 3e-6, "betas": [0.8, 0.99], "eps": 1e-7, "weight_decay": 0.1,
                                                 "torch_adam": True}}
    assert "offload_optimizer" not in zero_block(ActorConfig(), DsConfig(), "cuda")


@pytest.mark.parametrize(("device", "is_torch_adam", "is_pinned"), [("cuda", False, True), ("cpu", True, False)])
def test_adam_offload_steps_on_the_host(device, is_torch_adam, is_pinned):
    """GPUs: DeepSpeed's CPU Adam (torch_adam off) over pinned buffers; a CPU run keeps torch's AdamW."""
    ds = DsConfig(adam_offload=True, zero_stage=3)
    assert optimizer_block(ActorConfig(), ds, device)["params"]["torch_adam"] is is_torch_adam
    assert zero_block(ActorConfig(), ds, device) == {
        "stage": 3, "overlap_comm": False, "offload_optimizer": {"device": "cpu", "pin_memory": is_pinned}}


def test_muon_takes_its_own_lr_and_momentum_and_the_adam_block_for_the_rest():
    actor = ActorConfig(optim="muon", muon={"lr": 0.05, "momentum": 0.9}, adam=ADAM)
    assert optimizer_block(actor, DsConfig(), "cuda") == {"type": "Muon", "params": {
        "lr": 0.05, "muon_lr": 0.05, "adam_lr": 3e-6, "momentum": 0.9, "betas": [0.8, 0.99], "eps": 1e-7,
        "weight_decay": 0.1, "torch_adam": True}}
    assert "reduce_scatter" not in zero_block(actor, DsConfig(zero_stage=2), "cuda")
    assert zero_block(actor, DsConfig(zero_stage=3), "cuda")["reduce_scatter"] is False  # DeepSpeed refuses it


def test_muon_never_reaches_deepspeed_with_the_optimizer_on_the_host():
    with pytest.raises(ValueError, match="drop --ds.adam_offload"):
        optimizer_block(ActorConfig(optim="muon"), DsConfig(adam_offload=True), "cuda")


def test_max_norm_zero_turns_clipping_off():
    config = ds_config(ActorConfig(max_norm=0.0), DsConfig(), TrainConfig(batch_size=4, micro_batch_size=2), 2, "cpu")
    assert config["gradient_clipping"] == 0.0  # DeepSpeed clips only above 0
    assert config["gradient_accumulation_steps"] == 1
