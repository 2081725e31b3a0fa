"""Unit tests for hybrid_core.engines.minibatch_updates through the actor and critic trainers: one optimizer step
cut into micro-batches by token budget (dynamic batching), padded or packed, moves the parameters exactly as the fixed
micro-batch step does, keeps the accumulation boundary on its last micro-batch, and respects the budget.

The engine is `TorchTrainEngine`, DeepSpeedTrainEngine's train surface in plain torch (SGD, explicit accumulation);
DeepSpeed itself runs in the integration test `test_packing_and_dynamic_batching_match_the_padded_run`.
"""
from pathlib import Path

import pytest
import torch

from hybrid_core.algorithms.experience import ActorLossSettings
from hybrid_core.engines.actor_trainer import TrainSamples, fit_actor
from hybrid_core.engines.critic_trainer import CriticSamples, fit_critic
from hybrid_core.engines.minibatch_updates import BatchPlan
from hybrid_core.engines.sequence_batch import MicroBatching

TINY_MODEL = Path(__file__).resolve().parents[3] / "data" / "tiny-qwen3"
PROMPT_LENGTHS = [5, 1, 9, 3, 4, 7, 2, 6]
RESPONSE_LENGTHS = [4, 7, 1, 0, 6, 3, 8, 5]  # prompt+response: 9 8 10 3 10 10 10 11 → 71 tokens, 34 response tokens
BUDGET = 30


class TorchTrainEngine:
    """`train_micro_batch` as DeepSpeedTrainEngine does it: backward every micro-batch, step at the boundary."""

    def __init__(self, model: torch.nn.Module):
        self.module, self.pad_id = model, 0
        self.rank, self.world_size = 0, 1
        self.ring, self.data_parallel_rank, self.data_parallel_size = None, 0, 1
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        self.step_gradients: dict[str, torch.Tensor] = {}  # what the optimizer step applied
        self.boundaries: list[bool] = []
        self.micro_batches: list[tuple[int, int, int]] = []  # (rows, row length, samples) of each forward
        model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, _, args, kwargs):
        rows, length = kwargs["input_ids"].shape
        is_packed = kwargs["attention_mask"] is None  # packed: a sample starts at each position 0
        self.micro_batches.append((rows, length, int((kwargs["position_ids"] == 0).sum()) if is_packed else rows))

    def train_micro_batch(self, loss_fn, is_boundary: bool) -> dict:
        loss, stats = loss_fn(self.module)
        loss.backward()
        self.boundaries.append(is_boundary)
        if is_boundary:
            self.step_gradients = {n: p.grad.detach().clone() for n, p in self.module.named_parameters()}
            self.optimizer.step()
            self.optimizer.zero_grad()
        return stats


def _samples(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 100, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    responses = [torch.randint(3, 100, (n,), generator=g).tolist() for n in RESPONSE_LENGTHS]
    per_token = [(torch.randn(n, generator=g) * 0.5).tolist() for n in RESPONSE_LENGTHS]
    return prompts, responses, per_token


def _update(make_model, fit, batching: MicroBatching):
    """(gradients of one optimizer step over all 8 samples, the engine's record, the fit's statistics)."""
    engine = TorchTrainEngine(make_model())
    stats = fit(engine, BatchPlan(batch_size=len(PROMPT_LENGTHS), batching=batching, max_epochs=1, seed=7))
    return engine.step_gradients, engine, stats


def _assert_same_gradients(got: dict, expected: dict, label: str) -> None:
    """Equal up to fp32 rounding of sums taken in another order: 1e-5 of each tensor's largest entry."""
    assert got.keys() == expected.keys()
    for name, g in expected.items():
        assert float(g.abs().max()) > 0, name
        torch.testing.assert_close(got[name], g, rtol=0, atol=1e-5 * float(g.abs().max()), msg=f"{name} {label}")


def _check_same_update(make_model, fit):
    fixed, fixed_engine, fixed_stats = _update(make_model, fit, MicroBatching(num_samples=2))
    assert fixed_engine.boundaries == [False, False, False, True]
    for is_packed in (False, True):
        batching = MicroBatching(num_samples=2, max_tokens=BUDGET, is_packed=is_packed)
        gradients, engine, stats = _update(make_model, fit, batching)
        assert engine.boundaries == [False] * (len(engine.boundaries) - 1) + [True]  # one optimizer step
        assert [n for *_, n in engine.micro_batches] != [2, 2, 2, 2]  # the budget, not micro_batch_size, cut it
        for rows, length, _ in engine.micro_batches:
            assert rows * length <= BUDGET, engine.micro_batches  # every sample here fits the budget
            assert rows == 1 or not is_packed  # packed: a micro-batch is one row
        assert sum(n for *_, n in engine.micro_batches) == 8  # every sample once
        if is_packed:
            assert sum(length for _, length, _ in engine.micro_batches) == 71  # no padding at all
        _assert_same_gradients(gradients, fixed, f"packed={is_packed}")
        for key in ("policy_loss", "value_loss"):
            if key in fixed_stats:
                assert stats[key] == pytest.approx(fixed_stats[key], abs=1e-6)


def _policy():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32).eval()


@pytest.mark.parametrize("loss_type", ["ppo", "gspo"])
def test_dynamic_batching_gives_the_fixed_micro_batch_update_actor(loss_type):
    prompts, responses, advantages = _samples()
    _, _, ref_noise = _samples(seed=1)
    old = [[-4.0 + x for x in row] for row in ref_noise]
    ref = [[-4.5 + x for x in row] for row in ref_noise]
    samples = TrainSamples(prompts, responses, old, ref, advantages)
    settings = ActorLossSettings(loss_type=loss_type, kl_coef=0.1 if loss_type == "ppo" else 0.0,
                                 kl_estimator="k3", kl_use_loss=True, entropy_coef=0.01 if loss_type == "ppo" else None)
    _check_same_update(_policy, lambda engine, plan: fit_actor(engine, samples, settings, plan))


def test_dynamic_batching_gives_the_fixed_micro_batch_update_critic():
    from hybrid_core.engines.value_model import load_value_model

    def value_model():
        model = load_value_model(str(TINY_MODEL), "fp32", "score").eval()
        torch.nn.init.normal_(model.score.weight, std=0.1, generator=torch.Generator().manual_seed(3))
        return model

    prompts, responses, returns = _samples(seed=2)
    old_values = [[0.1 * x for x in row] for row in returns]
    samples = CriticSamples(prompts, responses, old_values, returns)
    _check_same_update(value_model, lambda engine, plan: fit_critic(engine, samples, 0.2, plan))


def test_a_sample_longer_than_the_budget_trains_alone():
    prompts, responses, advantages = _samples()
    samples = TrainSamples(prompts, responses, advantages, None, advantages)
    fit = lambda e, plan: fit_actor(e, samples, ActorLossSettings(kl_coef=0.0), plan)  # noqa: E731
    fixed, _, _ = _update(_policy, fit, MicroBatching(num_samples=8))
    gradients, engine, _ = _update(_policy, fit,
                               MicroBatching(num_samples=1, max_tokens=9, is_packed=True))
    # lengths 9 8 10 3 10 10 10 11: the 10- and 11-token samples exceed 9 and each form a micro-batch of one
    assert sum(n for *_, n in engine.micro_batches) == 8 and sum(n for _, n, _ in engine.micro_batches) == 71
    for _, length, num_samples in engine.micro_batches:
        assert length <= 9 or num_samples == 1, engine.micro_batches
    assert max(n for _, n, _ in engine.micro_batches) == 11
    assert engine.boundaries == [False] * (len(engine.boundaries) - 1) + [True]
    _assert_same_gradients(gradients, fixed, "budget 9")


def test_ranks_cut_their_shares_and_pad_to_the_same_number_of_micro_batches():
    from hybrid_core.engines.minibatch_updates import rank_micro_batches

    lengths = [p + r for p, r in zip(PROMPT_LENGTHS, RESPONSE_LENGTHS)]  # 9 8 10 3 10 10 10 11
    step = list(range(8))
    fixed = MicroBatching(num_samples=3, max_tokens=None, is_packed=False)
    # rank 0 takes samples 0 2 4 6, rank 1 takes 1 3 5 7; three at a time
    assert rank_micro_batches(step, lengths, fixed, 0, 2) == [[0, 2, 4], [6]]
    assert rank_micro_batches(step, lengths, fixed, 1, 2) == [[1, 3, 5], [7]]
    packed = MicroBatching(num_samples=3, max_tokens=20, is_packed=True)
    # packed within 20 tokens: rank 0 9+10 | 10+10; rank 1 8+3 | 10 | 11 → rank 0 gets one empty micro-batch
    assert rank_micro_batches(step, lengths, packed, 0, 2) == [[0, 2], [4, 6], []]
    assert rank_micro_batches(step, lengths, packed, 1, 2) == [[1, 3], [5], [7]]
    assert rank_micro_batches(step, lengths, packed, 0, 1) == [[0, 1], [2, 3], [4, 5], [6], [7]]
