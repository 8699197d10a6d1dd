"""Packing padded batches into varlen form and back (flash-attn's ``bert_padding`` names),
with plain torch indexing: both directions are differentiable."""

from __future__ import annotations

import torch


def index_first_axis(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """values[indices] along the first axis."""
    return values.index_select(0, indices)


def unpad_input(
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor,
    unused_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """The tokens of a padded batch, packed.

    Args:
        hidden_states: (batch, seqlen, ...).
        attention_mask: (batch, seqlen) bool (or 0/1), True for the tokens to keep.
        unused_mask: None, or (batch, seqlen): tokens packed too but not counted as used.

    Returns:
        (packed (total, ...), indices (total,) of the kept tokens in the flattened batch,
        cu_seqlens (batch + 1,) int32, max_seqlen (int), used_seqlens (batch,) int32).
    """
    used = attention_mask.bool()
    kept = used if unused_mask is None else used | unused_mask.bool()
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    indices = kept.flatten().nonzero().flatten()
    cu_seqlens = torch.zeros(seqlens.numel() + 1, dtype=torch.int32, device=seqlens.device)
    cu_seqlens[1:] = seqlens.cumsum(0)
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return (
        index_first_axis(flat, indices),
        indices,
        cu_seqlens,
        int(seqlens.max().item()) if seqlens.numel() else 0,
        used.sum(dim=-1, dtype=torch.int32),
    )


def pad_input(
    hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int
) -> torch.Tensor:
    """The inverse of unpad_input: (total, ...) packed tokens back to (batch, seqlen, ...),
    zeros at the padding."""
    rest = hidden_states.shape[1:]
    padded = hidden_states.new_zeros(batch * seqlen, *rest)
    padded = padded.index_copy(0, indices, hidden_states)
    return padded.view(batch, seqlen, *rest)
