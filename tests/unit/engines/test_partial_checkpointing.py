"""Partial activation checkpointing (`--actor.gradient_checkpointing_layers N`): `load_policy` checkpoints the first N
decoder layers of a real 4-layer Qwen3 and no others; what autograd keeps outside the checkpointed regions grows by
one layer's activations for each layer left out, exactly; the gradients are those of the uncheckpointed policy (fp32 on
CPU, bit for bit, reentrant or not); and a count the policy cannot meet, or one without checkpointing, is refused
with the field named."""
from pathlib import Path

import pytest
import torch

from hybrid_core.config import ActorConfig, ConfigError, DsConfig
from hybrid_core.engines.deepspeed_train import load_policy
from hybrid_core.flags import parse_cli
from hybrid_core.plan.refusals import preflight_problems

TINY_MODEL = Path(__file__).resolve().parents[3] / "data" / "tiny-qwen3"
NUM_LAYERS = 4
FP32 = DsConfig(param_dtype="fp32", use_liger_kernel=False)


@pytest.fixture(scope="module")
def four_layer_model(tmp_path_factory) -> str:
    """The tiny Qwen3's shape with 4 decoder layers, random weights drawn from seed 0."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(TINY_MODEL)
    config.num_hidden_layers, config.layer_types = NUM_LAYERS, ["full_attention"] * NUM_LAYERS
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder = tmp_path_factory.mktemp("four-layers")
    model.save_pretrained(folder)
    return str(folder)


def actor(layers: int | None, enabled: bool = True, reentrant: bool = False) -> ActorConfig:
    return ActorConfig(gradient_checkpointing_enable=enabled, gradient_checkpointing_layers=layers,
                       gradient_checkpointing_reentrant=reentrant)


def train_forward(model: torch.nn.Module) -> tuple[torch.Tensor, int]:
    """A training forward on a fixed batch: its loss, and the bytes autograd saved outside checkpointed layers
    (inside them the checkpoint's own hooks stand in, so nothing there reaches this one)."""
    input_ids = torch.arange(2 * 24).reshape(2, 24) % 128
    saved = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        logits = model(input_ids=input_ids).logits
    weights = torch.linspace(-1.0, 1.0, logits.numel()).reshape(logits.shape)
    return (logits * weights).sum(), sum(saved)


def test_only_the_first_layers_are_checkpointed(four_layer_model):
    flags = {n: [layer.gradient_checkpointing for layer in load_policy(four_layer_model, actor(n), FP32).model.layers]
             for n in (1, 3, None)}
    assert flags == {1: [True, False, False, False], 3: [True, True, True, False], None: [True] * 4}
    off = load_policy(four_layer_model, actor(None, enabled=False), FP32)
    assert [layer.gradient_checkpointing for layer in off.model.layers] == [False] * 4


def test_each_layer_left_out_keeps_one_layer_of_activations(four_layer_model):
    saved = {n: train_forward(load_policy(four_layer_model, actor(n or None, enabled=n != 0), FP32))[1]
             for n in (0, 1, 2, 3, 4)}
    per_layer, rest = divmod(saved[0] - saved[4], NUM_LAYERS)
    assert rest == 0 and per_layer > 0
    assert {n: saved[n] - saved[4] for n in saved} == {n: (NUM_LAYERS - n) * per_layer for n in saved}


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradients_are_the_uncheckpointed_policys(four_layer_model, reentrant):
    def gradients(config: ActorConfig) -> dict[str, torch.Tensor]:
        model = load_policy(four_layer_model, config, FP32)
        train_forward(model)[0].backward()
        return {name: p.grad for name, p in model.named_parameters()}

    plain = gradients(actor(None, enabled=False))
    for layers in (1, 3, None):
        grads = gradients(actor(layers, reentrant=reentrant))
        assert grads.keys() == plain.keys()
        for name, grad in grads.items():
            assert torch.equal(grad, plain[name]), (layers, name)


def test_more_layers_than_the_policy_has_are_refused(four_layer_model):
    with pytest.raises(ValueError, match=r"^actor.gradient_checkpointing_layers 5 is more than the policy's 4 "
                                         r"checkpointable decoder layers: give at most 4"):
        load_policy(four_layer_model, actor(5), FP32)
    cfg = parse_cli(["--actor.model_name_or_path=Qwen/Qwen3-1.7B", "--actor.gradient_checkpointing_enable",
                     "--actor.gradient_checkpointing_layers=29"])
    assert ("actor.gradient_checkpointing_layers 29 is more than the 28 decoder layers of actor.model_name_or_path "
            "'Qwen/Qwen3-1.7B': give at most 28, or drop the flag to checkpoint every layer") \
        in preflight_problems(cfg, num_gpus_found=None)
    at_most = parse_cli(["--actor.model_name_or_path=Qwen/Qwen3-1.7B", "--actor.gradient_checkpointing_enable",
                         "--actor.gradient_checkpointing_layers=28"])
    assert not [p for p in preflight_problems(at_most, num_gpus_found=None) if "checkpointing" in p]


def test_a_layer_count_without_checkpointing_is_refused():
    with pytest.raises(ConfigError) as info:
        parse_cli(["--actor.gradient_checkpointing_layers=20"])
    assert "actor.gradient_checkpointing_layers 20 says how many layers checkpointing recomputes, and " \
           "actor.gradient_checkpointing_enable is off: add --actor.gradient_checkpointing_enable or drop " \
           "--actor.gradient_checkpointing_layers" in str(info.value)
    assert actor(20).checkpointed_layers(28) == 20 and actor(None).checkpointed_layers(28) == 28
    assert actor(None, enabled=False).checkpointed_layers(28) == 0
