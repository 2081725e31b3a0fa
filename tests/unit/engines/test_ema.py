"""The EMA of a module's trained parameters: hand-computed averages, frozen parameters left out, checkpoint state
and the export's state dict."""
from __future__ import annotations

import pytest
import torch

from hybrid_core.engines.ema import EmaWeights


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trained = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        self.frozen = torch.nn.Parameter(torch.tensor([7.0]), requires_grad=False)


def test_the_average_follows_each_update_by_hand():
    module = Two()
    ema = EmaWeights(module, beta=0.5)
    assert set(ema.average) == {"trained"}  # frozen parameters are not averaged (a LoRA policy's base)
    with torch.no_grad():
        module.trained.copy_(torch.tensor([3.0, 2.0]))
    ema.update()  # 0.5·[1, -2] + 0.5·[3, 2] = [2, 0]
    with torch.no_grad():
        module.trained.copy_(torch.tensor([5.0, 4.0]))
    ema.update()  # 0.5·[2, 0] + 0.5·[5, 4] = [3.5, 2]
    torch.testing.assert_close(ema.average["trained"], torch.tensor([3.5, 2.0]), rtol=0, atol=0)
    assert ema.num_updates == 2 and ema.average["trained"].dtype == torch.float32


def test_the_checkpoint_state_restores_the_average_and_the_export_holds_it():
    module = Two()
    ema = EmaWeights(module, beta=0.9)
    with torch.no_grad():
        module.trained.add_(10.0)
    ema.update()  # 0.9·[1, -2] + 0.1·[11, 8] = [2, -1]
    state = ema.state_dict()
    restored = EmaWeights(Two(), beta=0.9)
    restored.load_state_dict(state)
    torch.testing.assert_close(restored.average["trained"], torch.tensor([2.0, -1.0]), rtol=0, atol=1e-6)
    exported = restored.export_state_dict()
    torch.testing.assert_close(exported["trained"], torch.tensor([2.0, -1.0]), rtol=0, atol=1e-6)
    assert torch.equal(exported["frozen"], torch.tensor([7.0]))
    other = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="the checkpoint's EMA holds 1 tensors, this policy trains 2"):
        EmaWeights(other, beta=0.9).load_state_dict(state)
