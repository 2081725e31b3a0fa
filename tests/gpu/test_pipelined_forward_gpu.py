"""The no-grad forwards on CUDA with their host copies queued behind the next micro-batch (`HostCopy` in
`batched_response_forward`, the reference's and the old policy's logprobs): the same per-sample results, bit for bit,
as each micro-batch's forward read back at once, in sample order; and the on-policy update's old logprobs, copied
without waiting, equal the separate forward's."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
PROMPT_LENGTHS = [40, 7, 120, 16, 3, 64, 9, 30]
RESPONSE_LENGTHS = [300, 90, 512, 1, 0, 200, 77, 128]


def _samples():
    import torch

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 150000, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    responses = [torch.randint(3, 150000, (n,), generator=g).tolist() for n in RESPONSE_LENGTHS]
    return prompts, responses


def test_pipelined_copies_give_each_micro_batchs_own_results(standin):
    import torch

    from hybrid_core.engines.frozen_model import attn_implementation_for, load_causal_lm
    from hybrid_core.engines.sequence_batch import (MicroBatching, batched_response_forward, make_sequence_batch,
                                                    split_micro_batches, unpad)
    from hybrid_core.engines.vocab_head import response_logprobs

    model = load_causal_lm(str(standin), "bf16", attn_implementation_for(True)).cuda().eval()
    prompts, responses = _samples()
    batching = MicroBatching(num_samples=2, max_tokens=400, is_packed=True, logit_chunk_tokens=128)
    got = batched_response_forward(response_logprobs, model, prompts, responses, 0, batching)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    expected = []
    with torch.no_grad():
        for indices in split_micro_batches(list(range(len(prompts))), lengths, batching):
            batch = make_sequence_batch([prompts[i] for i in indices], [responses[i] for i in indices], 0, True)
            values = response_logprobs(model, batch.to("cuda"), 128).float().cpu()
            expected.extend(unpad(values, batch.response_mask))
    assert len(split_micro_batches(list(range(len(prompts))), lengths, batching)) >= 4
    assert [len(row) for row in got] == RESPONSE_LENGTHS
    assert got == expected
    assert all(value < 0 for row in got for value in row)  # real logprobs, not a zeroed or stale buffer
