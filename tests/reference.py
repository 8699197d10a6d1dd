"""Float references that the test tiers share: attention (plain, with ALiBi and sinks,
with an attn_mask), the causal / window mask, rotary embedding, and what a FlashAttention
backward or a tf32 GEMM computes exactly. Test modules import it as `reference` (tests/ is
on sys.path: tests/conftest.py's folder); none imports another test module.

The functions compute in the dtype they are given (float64: the reference; the inputs'
dtype: torch's own computation, the baseline of the accuracy rule in
tests/gpu/gpu_checks.py). Index tensors they make themselves go on DEVICE.
"""

from __future__ import annotations

import math

import torch

DEVICE = "cuda"  # gpu_checks.DEVICE


# ---- attention, and the causal / window mask
def allowed_keys(sq, sk, causal, window, norm_seqlen_k=None, rows=None):
    """(sq, sk) bool: key j visible to query i, by flash-attn's documented rule
    i + sk - sq - left <= j <= i + sk - sq + right, a negative bound unbounded and causal
    fixing right = 0; taken literally, however far a bound reaches (flash-attn's own code
    unbounds any bound >= seqlen_k, which differs when sq > sk). norm_seqlen_k is unused:
    the rule needs no normalisation. rows: only these query indices (a 1-D tensor),
    giving (len(rows), sk)."""
    del norm_seqlen_k
    left, right = (-1 if w < 0 else w for w in window)
    if causal:
        right = 0
    i = (torch.arange(sq, device=DEVICE) if rows is None else rows.to(DEVICE))[:, None]
    j = torch.arange(sk, device=DEVICE)[None, :]
    diagonal = i + sk - sq
    ok = torch.ones(i.shape[0], sk, dtype=torch.bool, device=DEVICE)
    if left >= 0:
        ok &= j >= diagonal - left
    if right >= 0:
        ok &= j <= diagonal + right
    return ok


def attention(q, k, v, scale, softcap, mask, dtype):
    """(out, lse) of attention computed in `dtype` (float64: the reference; the input
    dtype: torch's own computation, the baseline). q (b, sq, h, d), k/v (b, sk, hk, d),
    mask (sq, sk) or None. Rows that see no key: out 0, lse +inf."""
    group = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
    kt = kt.repeat_interleave(group, dim=1)
    vt = vt.repeat_interleave(group, dim=1)
    scores = (qt @ kt.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(scores.to(torch.float64 if dtype == torch.float64 else torch.float32), -1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = (probs @ vt).transpose(1, 2)
    empty = torch.isneginf(lse)
    lse = lse.masked_fill(empty, math.inf)
    return out, lse


def attention_grads(q, k, v, dout, scale, softcap, mask, dtype):
    """(dq, dk, dv) of sum(attention(q, k, v) * dout) by torch autograd in `dtype`."""
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    out, _ = attention(*leaves, scale, softcap, mask, dtype)
    return torch.autograd.grad(out, leaves, dout.to(dtype))


# ---- attention with ALiBi and sinks
def slopes_of(alibi: torch.Tensor | None, b: int) -> torch.Tensor | None:
    """The slopes of batch entry b, (h,), or None."""
    if alibi is None:
        return None
    return alibi if alibi.dim() == 1 else alibi[b]


def attention_with_terms(
    q, k, v, *, scale, softcap, mask, dtype, alibi=None, sinks=None, delta=None
):
    """(out, lse) of attention with the score terms, computed in `dtype` (float64: the
    reference; the input dtype: torch's own, the baseline). q (b, sq, h, d), k/v (b, sk,
    hk, d), mask (sq, sk) bool (the causal / window mask: True where the key is visible) or
    None, alibi (h,) or (b, h) and sinks (h,) float32 or None. Rows that see no key: out 0;
    lse +inf, or the sink. masked_attention without an attn_mask."""
    return masked_attention(
        q, k, v, scale=scale, dtype=dtype, window=mask, softcap=softcap, alibi=alibi,
        sinks=sinks, delta=delta,
    )  # fmt: skip


def empty_rows(mask: torch.Tensor | None, sq: int, sk: int) -> torch.Tensor:
    """(sq,) bool: the query rows that see no key."""
    if sk == 0:
        return torch.ones(sq, dtype=torch.bool, device=DEVICE)
    if mask is None:
        return torch.zeros(sq, dtype=torch.bool, device=DEVICE)
    return ~mask.any(dim=-1)


def attention_with_terms_grads(q, k, v, dout, *, dtype, sinks=None, stored_dtype=None, mask=None,
                               **terms):  # fmt: skip
    """(dq, dk, dv, dsinks) of sum(attention_with_terms(...) * dout) by torch autograd in
    `dtype` (dsinks None without sinks); the slopes are constants. stored_dtype: the
    gradients a FlashAttention backward computes when the output is stored in that dtype
    (its D = rowsum(dout * out) reads the rounded output; with sinks, or a row's keys few,
    that rounding is a visible part of every gradient), exact otherwise."""
    return masked_attention_grads(
        q, k, v, dout, dtype=dtype, sinks=sinks, stored_dtype=stored_dtype, window=mask, **terms
    )[:4]


# ---- attention under an attn_mask
def blocked_pairs(attn_mask, window, b, h, sq, sk):
    """(b, h, sq, sk) bool: the pairs the mask (False, or -inf) or the causal / window
    mask (window: (sq, sk) bool of the visible keys, or None) remove."""
    blocked = torch.zeros(b, h, sq, sk, dtype=torch.bool, device=DEVICE)
    if attn_mask is not None:
        removed = ~attn_mask if attn_mask.dtype == torch.bool else torch.isneginf(attn_mask)
        blocked = blocked | removed
    if window is not None:
        blocked = blocked | ~window
    return blocked


def masked_attention(q, k, v, *, scale, dtype, attn_mask=None, window=None, softcap=0.0, alibi=None,
              sinks=None, delta=None):  # fmt: skip
    """(out (b, sq, h, d), lse (b, h, sq)) of attention computed in `dtype` (float64: the
    reference; the input dtype: torch's own, the baseline). Differentiable in q, k, v, a
    float attn_mask and sinks (-inf entries of the mask get gradient 0, as in samattn)."""
    b, sq, h, _ = q.shape
    sk = k.shape[1]
    group = h // k.shape[2]
    qt, kt, vt = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
    kt, vt = kt.repeat_interleave(group, dim=1), vt.repeat_interleave(group, dim=1)
    scores = (qt @ kt.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi is not None:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        distance = (i + sk - sq - j).abs().to(dtype)
        scores = scores - alibi.to(dtype).reshape(-1, h, 1, 1) * distance
    blocked = blocked_pairs(attn_mask, window, b, h, sq, sk)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        scores = scores + attn_mask.to(dtype).masked_fill(torch.isneginf(attn_mask), 0.0)
    scores = scores.masked_fill(blocked, -math.inf)
    if sinks is not None:
        sink = sinks.to(dtype).reshape(1, h, 1, 1).expand(b, h, sq, 1)
        scores = torch.cat([scores, sink], dim=-1)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    lse = torch.logsumexp(scores.to(wide), dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if sinks is not None:
        probs = probs[..., :-1]
    out = (probs @ vt).transpose(1, 2)
    if delta is not None:  # for masked_attention_grads: the backward from the stored output
        return out, stored_output_term(scores, delta)
    return out, lse.masked_fill(torch.isneginf(lse), math.inf)


def masked_attention_grads(q, k, v, dout, *, dtype, attn_mask=None, sinks=None, mask_grad=False,
                    stored_dtype=None, **terms):  # fmt: skip
    """(dq, dk, dv, dsinks, dmask) of sum(masked_attention(...) * dout) by torch autograd in
    `dtype` (dsinks None without sinks, dmask None without mask_grad). stored_dtype: the
    gradients of a FlashAttention backward that reads the output stored in that dtype
    (as attention_with_terms_grads), exact otherwise."""
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    sink_leaf = None if sinks is None else sinks.detach().to(dtype).requires_grad_(True)
    mask = attn_mask
    if mask_grad:
        mask = attn_mask.detach().to(dtype).requires_grad_(True)
    inputs = leaves + [t for t in (sink_leaf, mask if mask_grad else None) if t is not None]
    call = dict(dtype=dtype, attn_mask=mask, sinks=sink_leaf, **terms)
    if stored_dtype is None:
        out, _ = masked_attention(*leaves, **call)
        grads = list(torch.autograd.grad(out, inputs, dout.to(dtype)))
    else:
        with torch.no_grad():
            exact, _ = masked_attention(*leaves, **call)
        delta = stored_output_delta(exact, dout, stored_dtype).to(dtype)
        out, term = masked_attention(*leaves, delta=delta, **call)
        grads = list(torch.autograd.grad((out * dout.to(dtype)).sum() - term, inputs))
    dsinks = grads.pop(3) if sink_leaf is not None else None
    dmask = grads.pop(3) if mask_grad else None
    return (*grads, dsinks, dmask)


# ---- rotary embedding
def rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    interleaved: bool,
) -> torch.Tensor:
    """Rotary embedding of the first 2 * cos.shape[1] channels of x (b, s, h, d), in
    float64; positions (b, s) index cos and sin (seqlen_ro, rotary_dim / 2)."""
    half = cos.shape[1]
    c = cos.double()[positions][:, :, None, :]
    s = sin.double()[positions][:, :, None, :]
    x = x.double()
    rotated = x[..., : 2 * half]
    if interleaved:
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
        rotated = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)
    else:
        x1, x2 = rotated[..., :half], rotated[..., half:]
        rotated = torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)
    return torch.cat([rotated, x[..., 2 * half :]], dim=-1)


# ---- a backward from the stored output; a tf32 GEMM
def stored_output_delta(out: torch.Tensor, dout: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(b, h, sq) float64: how much a FlashAttention backward's D_i = dout_i . out_i moves
    when out (b, sq, h, d), float64, is the output stored in `dtype`, as the kernels read it."""
    stored = out.to(dtype).double()
    return ((stored - out) * dout.double()).sum(-1).transpose(1, 2)


def stored_output_term(scores: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """A scalar whose gradient, subtracted from the loss's, turns the exact softmax backward
    into the one a FlashAttention kernel computes from the stored output: dS_ij gains
    -delta_i * P_ij (d lse_i / d S_ij = P_ij). scores (b, h, sq, n) with -inf where blocked
    (and the sink column, if any); delta from stored_output_delta."""
    live = torch.isfinite(scores).any(-1, keepdim=True)  # rows with no key: kept finite
    lse = torch.logsumexp(torch.where(live, scores, torch.zeros_like(scores)), dim=-1)
    return (delta * lse).sum()


def round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to tf32 (10 mantissa bits, ties away from zero, like cvt.rna)."""
    bits = t.float().contiguous().view(torch.int32)
    bits = (bits + 0x1000) & ~0x1FFF
    return bits.view(torch.float32).view(t.shape)


def tf32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The exact product of tf32-rounded inputs, in fp32: the baseline for tf32 kernels.

    torch.matmul is no baseline there: cuBLAS runs small or batched problems in exact fp32
    even when tf32 is allowed.
    """
    return (round_to_tf32(a).double() @ round_to_tf32(b).double()).float()
