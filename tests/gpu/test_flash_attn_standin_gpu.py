"""The OpenRLHF peer benchmark's flash_attn stand-in (benchmarks/peers/flash_attn_standin) on CUDA, the way OpenRLHF
uses it: transformers loads a model with `attn_implementation="flash_attention_2"` (it must take the stand-in for
flash-attn 2.8.3) and runs packed samples as one row with per-sample position ids. In bf16 the packed logits and
gradients must be as close to the fp32 per-sample result as bf16 sdpa's are, through torch's varlen flash kernel.

Runs in a child process: transformers reads the installed distributions once, when it is first imported.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.gpu
STANDIN = REPO_ROOT / "benchmarks" / "peers" / "flash_attn_standin"

CHILD = r"""
import json, sys, tempfile
sys.path.insert(0, sys.argv[1])
import torch
import flash_attn.flash_attn_interface as interface
from transformers import Qwen3Config, Qwen3ForCausalLM

kernel_calls = []
real_kernel = interface._torch_varlen
interface._torch_varlen = lambda *a: kernel_calls.append(1) or real_kernel(*a)
config = Qwen3Config(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512)
torch.manual_seed(0)
folder = tempfile.mkdtemp()
Qwen3ForCausalLM(config).save_pretrained(folder)
g = torch.Generator().manual_seed(1)
lengths = [37, 5, 120, 64]
samples = [torch.randint(3, 128, (n,), generator=g).cuda() for n in lengths]
weights = torch.randn(sum(lengths), 128, generator=g).cuda()

def load(attention, dtype):
    model = Qwen3ForCausalLM.from_pretrained(folder, attn_implementation=attention, dtype=dtype).cuda()
    assert model.config._attn_implementation == attention, model.config._attn_implementation
    return model

def run(model, packed):
    model.zero_grad()
    if packed:
        positions = torch.cat([torch.arange(n) for n in lengths]).cuda()[None]
        logits = model(torch.cat(samples)[None], position_ids=positions).logits[0].float()
    else:
        logits = torch.cat([model(s[None]).logits[0].float() for s in samples])
    (logits * weights).sum().backward()
    return logits.detach(), {n: p.grad.float() for n, p in model.named_parameters()}

def grad_error(grads, exact):
    return float(torch.sqrt(sum(((grads[n] - g) ** 2).sum() for n, g in exact.items())
                            / sum((g ** 2).sum() for g in exact.values())))

exact, exact_grads = run(load("sdpa", torch.float32), packed=False)
padded, padded_grads = run(load("sdpa", torch.bfloat16), packed=False)
packed, packed_grads = run(load("flash_attention_2", torch.bfloat16), packed=True)
print(json.dumps({"padded_error": float((padded - exact).abs().max()),
                  "packed_error": float((packed - exact).abs().max()),
                  "padded_grad_error": grad_error(padded_grads, exact_grads),
                  "packed_grad_error": grad_error(packed_grads, exact_grads), "kernel_calls": len(kernel_calls)}))
"""


def test_transformers_flash_attention_2_on_the_standin_matches_sdpa(cuda):
    proc = subprocess.run([sys.executable, "-c", CHILD, str(STANDIN)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    print(found)
    assert found["kernel_calls"] >= 2  # the packed forward of both layers went through torch's varlen kernel
    assert found["packed_error"] <= 2 * found["padded_error"] + 1e-3
    assert found["packed_grad_error"] <= 2 * found["padded_grad_error"] + 1e-3
