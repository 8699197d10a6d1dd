"""Attention dropout's host side: the torch-ops Philox that recomputes the kernels' keep
decisions (samattn/_dropout.py), the threshold, and the argument checks."""

from __future__ import annotations

import random

import pytest
import torch

import samattn
from samattn import _checks, _dropout

MASK32 = 0xFFFFFFFF


def philox_ints(counter: list[int], key: int) -> list[int]:
    """Philox4x32-7 on Python ints: the reference for the tensor version's wraparound."""
    c0, c1, c2, c3 = counter
    k0, k1 = key & MASK32, key >> 32
    for _ in range(7):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
        k0, k1 = (k0 + 0x9E3779B9) & MASK32, (k1 + 0xBB67AE85) & MASK32
    return [c0, c1, c2, c3]


def test_tensor_philox_matches_integer_philox():
    rng = random.Random(5)
    counters = [[rng.getrandbits(32) for _ in range(4)] for _ in range(64)]
    counters += [[MASK32] * 4, [0] * 4]
    key = rng.getrandbits(64)
    columns = [torch.tensor([c[i] for c in counters], dtype=torch.int64) for i in range(4)]
    out = _dropout.philox(columns, key)
    for n, counter in enumerate(counters):
        assert [int(o[n]) for o in out] == philox_ints(counter, key)


def test_bytes_follow_the_block_map():
    # Byte (b, h, i, j) is 8 bits of the Philox output of its 16 x 32 block's lane.
    seed = 0x123456789ABCDEF0
    random_bytes = _dropout.random_bytes(seed, 2, 3, 40, 70)
    points = [(0, 0, 0, 0), (1, 2, 39, 69), (0, 1, 17, 9), (1, 0, 8, 31), (0, 2, 15, 48),
              (1, 1, 9, 63), (0, 0, 33, 40)]  # fmt: skip
    for b, h, i, j in points:
        r, c = i % 16, j % 32
        lane = (r % 8) * 4 + (c % 8) // 2
        out = philox_ints([j // 32, i // 16, b * 3 + h, lane], seed)
        byte = (r // 8) * 2 + c % 2
        assert int(random_bytes[b, h, i, j]) == (out[c // 8] >> (8 * byte)) & 0xFF


def test_each_draw_serves_one_block_once():
    # The 512 elements of a 16 x 32 block take the 32 lanes' 16 bytes, each exactly once.
    slots = set()
    for r in range(16):
        for c in range(32):
            slots.add(((r % 8) * 4 + (c % 8) // 2, c // 8, (r // 8) * 2 + c % 2))
    assert len(slots) == 16 * 32


def test_kept_fraction_and_threshold():
    assert _dropout.threshold(0.0) == 0 and _dropout.threshold(0.5) == 128
    assert _dropout.threshold(0.999999) == 255 and _dropout.threshold(0.1) == 26
    assert _dropout.threshold(0.001) == 0  # below 1/512: nothing dropped
    # The scale is flash-attn's 1 / (1 - p) of the p asked for, in float32 arithmetic.
    one = torch.tensor(1.0, dtype=torch.float32)
    for p in (0.1, 0.17, 0.5, 0.001, 0.3333):
        p32 = torch.tensor(p, dtype=torch.float32)
        assert _dropout.scale(p) == (one / (one - p32)).item(), p
    assert _dropout.scale(0.5) == 2.0 and _dropout.scale(0.17) != 256 / 212
    keep = _dropout.keep_mask(7, 0.3, 4, 8, 128, 128)
    assert abs(keep.float().mean().item() - 0.7) < 0.005
    other = _dropout.keep_mask(8, 0.3, 4, 8, 128, 128)
    assert (keep != other).float().mean().item() > 0.3  # another seed, another pattern
    assert not torch.equal(keep[0, 0], keep[0, 1])  # heads draw their own


def test_dropout_arguments_are_checked():
    q = torch.empty(1, 4, 1, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="dropout_p must be < 1"):
        _checks.check_dropout("op", 1.0)
    with pytest.raises(TypeError, match="dropout_p must be a float"):
        _checks.check_dropout("op", True)
    _checks.attention_dropout("op", 0.0, None, q)  # off: no seed needed
    with pytest.raises(TypeError, match=r"dropout_seed must be a torch\.Tensor"):
        _checks.attention_dropout("op", 0.1, None, q)
    with pytest.raises(ValueError, match="dropout_seed must be an int64 tensor of one element"):
        _checks.attention_dropout("op", 0.1, torch.zeros(2, dtype=torch.int64), q)
    _checks.attention_dropout("op", 0.1, torch.zeros(1, dtype=torch.int64), q)


# ------------------------------------------------------- torch.compile ----
def meta(*shape: int, dtype: torch.dtype = torch.float16, grad: bool = False) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)


def train_dropout(q, k, v):
    return samattn.flash_attn_func(q, k, v, 0.1, causal=True).float().sum()


def train_dropout_varlen(q, k, v, cu_q, cu_k):
    return samattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 30, 0.1).float().sum()


def train_dropout_masked(q, k, v, mask):
    return samattn.flash_attn_func(q, k, v, 0.25, attn_mask=mask).float().sum()


def probs_with_dropout(q, k, v):
    out, lse, s_dmask = samattn.flash_attn_func(q, k, v, 0.1, return_attn_probs=True)
    return out, lse, s_dmask


def _inputs(which: str):
    if which == "varlen":
        offsets = torch.empty(3, dtype=torch.int32, device="meta")
        return (meta(40, 4, 64, grad=True), meta(50, 2, 64, grad=True),
                meta(50, 2, 64, grad=True), offsets, offsets)  # fmt: skip
    leaves = (meta(2, 17, 4, 64, grad=True), meta(2, 33, 2, 64, grad=True),
              meta(2, 33, 2, 64, grad=True))  # fmt: skip
    if which == "masked":
        return (*leaves, meta(2, 1, 17, 33, dtype=torch.float32, grad=True))
    return leaves


TRAINING = {"fixed": train_dropout, "varlen": train_dropout_varlen, "masked": train_dropout_masked}


@pytest.mark.parametrize("which", TRAINING)
def test_compiled_training_with_dropout(which):
    # The seed is drawn inside the graph (a random op) and reaches the ops' fakes; the
    # backward traces through them: no graph break, gradients with their shapes.
    torch._dynamo.reset()
    args = _inputs(which)
    explanation = torch._dynamo.explain(TRAINING[which])(*args)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    loss = torch.compile(TRAINING[which], fullgraph=True, backend="aot_eager")(*args)
    loss.backward()
    for t in args:
        if t.requires_grad:
            assert t.grad is not None and t.grad.shape == t.shape


def test_s_dmask_traces_without_a_host_read():
    # S_dmask is computed from the seed tensor on its device: fullgraph compiles.
    torch._dynamo.reset()
    q, k, v = (meta(2, 17, 4, 64), meta(2, 33, 2, 64), meta(2, 33, 2, 64))
    out, lse, s_dmask = torch.compile(probs_with_dropout, fullgraph=True, backend="eager")(q, k, v)
    assert out.shape == q.shape and lse.shape == (2, 4, 17)
    assert s_dmask.shape == (2, 4, 17, 33) and s_dmask.dtype == q.dtype


def test_masked_s_dmask_traces_without_a_host_read():
    torch._dynamo.reset()
    q, k, v = (meta(2, 17, 4, 64), meta(2, 33, 2, 64), meta(2, 33, 2, 64))
    mask = torch.empty(2, 1, 17, 33, dtype=torch.bool, device="meta")

    def masked(q, k, v, mask):
        return samattn.flash_attn_func(q, k, v, 0.1, attn_mask=mask, return_attn_probs=True)

    out, lse, s_dmask = torch.compile(masked, fullgraph=True, backend="eager")(q, k, v, mask)
    assert out.shape == q.shape and lse.shape == (2, 4, 17)
    assert s_dmask.shape == (2, 4, 17, 33) and s_dmask.dtype == q.dtype


# ------------------------------------------------------------- S_dmask ----
def reference_lse(q, k, scale, causal):
    """(b, h, sq) natural-log sum of exp of the scaled scores (fp64), causal bottom-right."""
    scores = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        i = torch.arange(sq).view(-1, 1)
        j = torch.arange(sk).view(1, -1)
        scores = scores.masked_fill(j > i + sk - sq, float("-inf"))
    return torch.logsumexp(scores, -1)


def test_varlen_probs_are_each_sequences_probs():
    torch.manual_seed(0)
    lengths_q, lengths_k = [5, 0, 12, 7], [9, 4, 12, 3]
    h, d, scale = 2, 16, 0.25
    params = _checks.AttentionParams(scale, True, -1, -1, 0.0)
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(lengths_q), h, d)
    k = torch.randn(sum(lengths_k), h, d)
    lse = torch.empty(h, sum(lengths_q))
    singles = []
    for b, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
        qs = q[cu_q[b] : cu_q[b] + lq][None]
        ks = k[cu_k[b] : cu_k[b] + lk][None]
        seq_lse = reference_lse(qs, ks, scale, causal=True)[0].float()  # (h, lq)
        lse[:, cu_q[b] : cu_q[b] + lq] = seq_lse
        singles.append(_dropout.attention_probs(qs, ks, seq_lse[None], params)[0])
    probs = _dropout.varlen_probs(q, k, lse, cu_q, cu_k, max(lengths_q), max(lengths_k), params)
    assert probs.shape == (4, h, max(lengths_q), max(lengths_k))
    for b, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
        torch.testing.assert_close(probs[b, :, :lq, :lk], singles[b])
        assert not probs[b, :, lq:].any() and not probs[b, :, :, lk:].any()
        rows = probs[b, :, :lq, :lk].sum(-1)
        seen = torch.arange(lq).view(-1, 1) + lk - lq >= 0  # rows that see a key
        torch.testing.assert_close(rows[:, seen[:, 0]], torch.ones_like(rows[:, seen[:, 0]]))


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_probs_apply_the_mask_as_the_kernels_do(mask_kind):
    """attention_probs with attn_mask: a False or -inf pair gets 0, a float mask is added
    after the scale and ALiBi; rows are the softmax of the masked scores (fp64), and a row
    whose keys are all masked (lse +inf) is all zero."""
    torch.manual_seed(0)
    b, sq, sk, h, d, scale = 2, 9, 13, 2, 16, 0.3
    q, k = torch.randn(b, sq, h, d), torch.randn(b, sk, h, d)
    slopes = torch.rand(h)
    scores = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) * scale
    i, j = torch.arange(sq).view(-1, 1), torch.arange(sk).view(1, -1)
    scores = scores - slopes.double().view(1, h, 1, 1) * (i + sk - sq - j).abs()
    if mask_kind == "bool":
        mask = torch.rand(b, 1, sq, sk) > 0.4
        mask[1, 0, 4] = False  # a row that sees no key
        masked = scores.masked_fill(~mask, float("-inf"))
    else:
        mask = torch.randn(1, h, sq, sk) * 2
        mask[0, 1, 2, ::2] = float("-inf")
        masked = scores + mask.double()
    lse = torch.logsumexp(masked, -1)
    probs = _dropout.attention_probs(
        q,
        k,
        lse.float(),
        _checks.AttentionParams(scale, False, -1, -1, 0.0, alibi_slopes=slopes),
        attn_mask=mask,
    )
    expected = torch.exp(masked - lse.unsqueeze(-1)).nan_to_num(0.0)  # -inf - inf rows: NaN
    torch.testing.assert_close(probs.double(), expected, atol=1e-5, rtol=1e-4)
    if mask_kind == "bool":
        assert not probs[1, :, 4].any()
