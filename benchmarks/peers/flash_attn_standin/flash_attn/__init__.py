"""A stand-in for flash-attn 2.8.3, written for the Hybrid Engine's peer benchmarks (benchmarks/peers/): no CUDA
build, the attention served by PyTorch's variable-length flash attention (`torch.nn.attention.varlen.varlen_attn`).

OpenRLHF 0.11.2 imports `flash_attn.bert_padding` and `flash_attn.utils.distributed` at module top, and
transformers 5 takes its `flash_attention_2` path (`flash_attn_func`, `flash_attn_varlen_func`, `bert_padding`) when
a distribution named flash-attn ≥ 2.3.3 is installed: the dist-info beside this package says flash-attn 2.8.3. There
is no `flash_attn.ops`: OpenRLHF then computes logprobs with its own torch fallback. Knows nothing about OpenRLHF.
"""
from flash_attn.flash_attn_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

__version__ = "2.8.3"
__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]
