"""Rotary embedding as a torch reference (flash-attn's ``apply_rotary_emb`` signature), for
the references of flash-attn's KV-cache tests."""

from __future__ import annotations

import torch


def apply_rotary_emb(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    inplace: bool = False,
    seqlen_offsets: int | torch.Tensor = 0,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """x rotated: its first rotary_dim = 2 * cos.shape[1] channels, token i of sequence b
    at position seqlen_offsets[b] + i (or seqlen_offsets + i), in float32, returned in x's
    dtype; positions past cos's rows are left as they are.

    Args:
        x: (batch, seqlen, nheads, headdim).
        cos, sin: (seqlen_ro, rotary_dim / 2).
        interleaved: rotate channel pairs (2c, 2c + 1); otherwise (c, c + rotary_dim / 2)
            (GPT-NeoX style).
        inplace: write the result into x too.
        seqlen_offsets: an int, or (batch,) integer tensor.
        cu_seqlens, max_seqlen: varlen x; not supported here (flash-attn's tests of
            this file do not use it).
    """
    if cu_seqlens is not None:
        raise NotImplementedError("apply_rotary_emb: varlen x (cu_seqlens) is not supported")
    batch, seqlen = x.shape[:2]
    half = cos.shape[1]
    rotary_dim = 2 * half
    positions = torch.arange(seqlen, device=x.device).expand(batch, seqlen)
    if isinstance(seqlen_offsets, torch.Tensor):
        positions = positions + seqlen_offsets.to(x.device, torch.long).view(-1, 1)
    else:
        positions = positions + int(seqlen_offsets)
    inside = positions < cos.shape[0]
    index = torch.where(inside, positions, torch.zeros_like(positions))
    # (batch, seqlen, 1, half): one angle per token and channel pair, for every head.
    c = torch.where(inside[..., None], cos.float()[index], 1.0).unsqueeze(2)
    s = torch.where(inside[..., None], sin.float()[index], 0.0).unsqueeze(2)
    rotated = x[..., :rotary_dim].float()
    if interleaved:
        first, second = rotated[..., 0::2], rotated[..., 1::2]
        out = torch.stack((first * c - second * s, first * s + second * c), dim=-1)
        out = out.flatten(-2)
    else:
        first, second = rotated[..., :half], rotated[..., half:]
        out = torch.cat((first * c - second * s, first * s + second * c), dim=-1)
    result = torch.cat((out.to(x.dtype), x[..., rotary_dim:]), dim=-1)
    if inplace:
        x.copy_(result)
        return x
    return result
