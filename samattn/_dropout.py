"""Attention dropout: the per-call seed, and the kernels' keep decisions in torch ops.

The kernels (``cpp/src/attention/dropout.cuh``) keep probability (b, h, i, j) iff its
8-bit random byte is at least ``threshold(p)`` and scale a kept one by ``scale(p)``; the
bytes come from Philox4x32-7 keyed by the call's 64-bit seed, one counter
``(j // 32, i // 16, b * nheads + h, lane)`` per lane of each 16 x 32 block. The seed
lives on the device and is drawn by torch's CUDA generator for every call
(``new_seed``): ``torch.manual_seed`` reproduces a run, two calls differ, and a CUDA graph
draws a new seed on every replay. ``keep_mask`` recomputes the decisions with torch ops,
for tests and for ``return_attn_probs``.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ._checks import AttentionParams

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_LOW32 = 0xFFFFFFFF
ROUNDS = 7


def new_seed(device: torch.device) -> torch.Tensor:
    """A fresh 64-bit seed (an int64 tensor of one element) on `device`, from torch's
    generator of that device: a kernel launch, no host synchronization, captured by CUDA
    graphs (each replay draws anew)."""
    # Out of place (randint, not random_): torch.compile traces it into the graph.
    return torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64, device=device)


def _as_float32(p: float) -> float:
    return struct.unpack("f", struct.pack("f", p))[0]


def threshold(p: float) -> int:
    """The smallest kept byte for dropout_p = p: round(p * 256), at most 255 (the library
    rounds p to float32 first). The p used is threshold(p) / 256."""
    return min(255, round(_as_float32(p) * 256.0))


def scale(p: float) -> float:
    """The factor of a kept probability: 1 / (1 - p) in float32 arithmetic, as the kernels
    (and flash-attn) compute it, for the p asked for rather than the p the byte threshold
    keeps (docs/attention_dropout.md)."""
    # Each float32 operation rounded once: double rounding is exact for / and -.
    return _as_float32(1.0 / _as_float32(1.0 - _as_float32(p)))


def _mulhilo(multiplier: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    product = x * multiplier  # < 2^64: int64 wraps, the bit pattern is exact
    return (product >> 32) & _LOW32, product & _LOW32


def philox(counter: list[torch.Tensor], key: int | torch.Tensor) -> list[torch.Tensor]:
    """Philox4x32-7 of int64 tensors holding 32-bit counter words, under a 64-bit key (an
    int, or an int64 tensor that broadcasts: its bits are the key)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key & _LOW32, (key >> 32) & _LOW32
    for _ in range(ROUNDS):
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & _LOW32, (k1 + _W1) & _LOW32
    return [c0, c1, c2, c3]


def random_bytes(seed: int | torch.Tensor, batch: int, nheads: int, seqlen_q: int, seqlen_k: int,
          device: torch.device | str = "cpu") -> torch.Tensor:  # fmt: skip
    """The random byte of every (b, h, i, j), int64 (batch, nheads, seqlen_q, seqlen_k).
    seed: the call's seed, an int or the seed tensor itself (read on its device: no
    host synchronization, and traceable)."""
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(nheads, device=device).view(1, -1, 1, 1)
    i = torch.arange(seqlen_q, device=device).view(1, 1, -1, 1)
    j = torch.arange(seqlen_k, device=device).view(1, 1, 1, -1)
    shape = (batch, nheads, seqlen_q, seqlen_k)
    r, c = i % 16, j % 32
    lane = (r % 8) * 4 + (c % 8) // 2
    counter = [
        (j // 32).expand(shape),
        (i // 16).expand(shape),
        (b * nheads + h).expand(shape),
        lane.expand(shape),
    ]
    key = seed.reshape(()) if isinstance(seed, torch.Tensor) else seed & 0xFFFFFFFFFFFFFFFF
    out = philox(counter, key)
    word = torch.stack(out).gather(0, (c // 8).expand(shape).unsqueeze(0)).squeeze(0)
    byte = (r // 8) * 2 + c % 2
    return (word >> (8 * byte)) & 0xFF


def keep_mask(seed: int | torch.Tensor, p: float, batch: int, nheads: int, seqlen_q: int,
              seqlen_k: int, device: torch.device | str = "cpu") -> torch.Tensor:  # fmt: skip
    """Which probabilities a call with this seed and dropout_p keeps: bool (batch, nheads,
    seqlen_q, seqlen_k), i and j counted within each sequence (varlen: take sequence b's
    corner)."""
    return random_bytes(seed, batch, nheads, seqlen_q, seqlen_k, device) >= threshold(p)


def seed_value(seed: torch.Tensor) -> int:
    """The seed tensor's value as the kernels read it (an unsigned 64-bit key)."""
    return int(seed.item()) & 0xFFFFFFFFFFFFFFFF


def attention_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    params: AttentionParams,
    lengths: tuple[torch.Tensor, torch.Tensor] | None = None,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The attention probabilities of a fixed-length call, float32 (batch, nheads,
    seqlen_q, seqlen_k), from the forward's lse (sinks included) and params (its scale,
    causal, window, softcap and ALiBi slopes): exp(score - lse), 0 where the window or a
    bool attn_mask hides the key; a float attn_mask is added to the scores after ALiBi, as
    the kernels add it. For return_attn_probs on small problems. lengths: (seqlen_q,
    seqlen_k) per batch entry, (batch,) tensors, when q and k are sequences padded to their
    seqlen (varlen_probs): causal, the window and ALiBi then align each sequence's own
    corner, and the padding gets 0."""
    softmax_scale, causal, window_left, window_right, softcap = params[:5]
    alibi_slopes = params.alibi_slopes
    _batch, seqlen_q, nheads, _ = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    kf = k.float().repeat_interleave(nheads // nheads_k, dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", q.float(), kf) * softmax_scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(seqlen_q, device=q.device).view(1, 1, -1, 1)
    j = torch.arange(seqlen_k, device=q.device).view(1, 1, 1, -1)
    if lengths is None:
        diagonal = i + seqlen_k - seqlen_q
        visible = torch.ones(1, 1, seqlen_q, seqlen_k, dtype=torch.bool, device=q.device)
    else:
        length_q, length_k = (t.view(-1, 1, 1, 1) for t in lengths)
        diagonal = i + length_k - length_q
        visible = (i < length_q) & (j < length_k)
    if alibi_slopes is not None:
        slopes = alibi_slopes.float().reshape(-1, nheads, 1, 1)  # (nheads,) or (batch, nheads)
        scores = scores - slopes * (diagonal - j).abs()
    if attn_mask is not None:  # broadcasts to (batch, nheads, seqlen_q, seqlen_k)
        if attn_mask.dtype == torch.bool:
            visible = visible & attn_mask
        else:
            scores = scores + attn_mask.float()
    right = 0 if causal else window_right
    if right >= 0:
        visible = visible & (j <= diagonal + right)
    if window_left >= 0:
        visible = visible & (j >= diagonal - window_left)
    probs = torch.exp(scores - lse.float().unsqueeze(-1))
    # A row that sees no key has lse +inf: exp(-inf) = 0 already.
    return torch.where(visible, probs, 0.0)


def _padded(packed: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int) -> torch.Tensor:
    """Rows of a packed (total, ...) tensor as (batch, max_len, ...), zero past each
    sequence's end; indices computed on the device (no host read)."""
    starts, lengths = cu_seqlens[:-1].long(), (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    position = torch.arange(max_len, device=packed.device)
    valid = position < lengths.view(-1, 1)
    index = (starts.view(-1, 1) + position).clamp(0, max(packed.shape[0] - 1, 0))
    rows = packed[index] if packed.shape[0] else packed.new_zeros((*index.shape, *packed.shape[1:]))
    return rows * valid.view(*valid.shape, *(1,) * (packed.dim() - 1)).to(rows.dtype)


def varlen_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    params: AttentionParams,
) -> torch.Tensor:
    """attention_probs of a varlen call (q (total_q, nheads, d), k (total_k, nheads_k, d),
    lse (nheads, total_q)): float32 (batch, nheads, max_seqlen_q, max_seqlen_k), sequence
    b's probabilities in its top-left corner, 0 elsewhere."""
    qp = _padded(q, cu_seqlens_q, max_seqlen_q)
    kp = _padded(k, cu_seqlens_k, max_seqlen_k)
    lse_p = _padded(lse.t(), cu_seqlens_q, max_seqlen_q).transpose(1, 2)  # (b, h, max_q)
    lengths = (cu_seqlens_q[1:] - cu_seqlens_q[:-1], cu_seqlens_k[1:] - cu_seqlens_k[:-1])
    return attention_probs(qp, kp, lse_p, params, lengths)
