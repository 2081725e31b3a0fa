"""flash-attn's padding helpers, as OpenRLHF and transformers call them: `unpad_input` lays a padded batch out as one
row of its real tokens (with the indices and cumulative lengths that undo it), `pad_input` puts a row back into the
padded batch, `index_first_axis` picks rows. Plain tensor indexing, so autograd carries the gradients both ways.
`rearrange`/`repeat` are einops', which OpenRLHF imports from here."""
import torch
import torch.nn.functional as F
from einops import rearrange, repeat

__all__ = ["index_first_axis", "pad_input", "rearrange", "repeat", "unpad_input"]


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows `indices` of `input` (first dimension: batch × sequence, flattened)."""
    return input[indices]


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None):
    """(B, S, ...) and a (B, S) mask of kept tokens → (the kept tokens (T, ...), their flat indices, cumulative
    sequence lengths (B + 1, int32, from 0), the longest sequence, each sequence's used length). `unused_mask` marks
    tokens kept in the layout but not counted as used, as flash-attn's."""
    kept = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    used_seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = rearrange(hidden_states, "b s ... -> (b s) ...")
    return index_first_axis(flat, indices), indices, cu_seqlens, int(seqlens.max().item()), used_seqlens


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """The inverse of `unpad_input`: (T, ...) rows back at `indices` of a zero (batch, seqlen, ...) tensor."""
    flat = hidden_states.new_zeros((batch * seqlen, *hidden_states.shape[1:]))
    flat = flat.index_put((indices,), hidden_states)
    return rearrange(flat, "(b s) ... -> b s ...", b=batch)
