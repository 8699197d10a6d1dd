"""FlashAttention forward and backward on the GPU against a float64 reference.

Accuracy rule (gpu_checks.assert_close_to_reference): samattn's error against the
float64 reference must be at most twice that of the same computation done by torch in
the input dtype (scores, softmax and P @ V each rounded to fp16/bf16), plus one output
rounding. softmax_lse follows the same rule, its baseline the log-sum-exp of the
dtype-rounded scores; +inf (a query that sees no key) must match exactly, where the
output must be exactly 0. Gradients (dq, dk, dv) follow the same rule: the reference is
torch autograd on float64 copies, the baseline torch autograd in the input dtype.

The sm80 family runs fp16 and bf16, the sm75 family fp16 only (Turing's tensor cores have
no bf16: a forced sm75 refuses bf16 with a message that says it needs sm80); both are
forced on any newer GPU. The sm90 family (Hopper only) runs the forward and the backward
in fp16 and bf16 on wgmma + TMA and hands what its plans decline to sm80, also when
forced: with sm90 forced a call may run on either (gpu_checks.forced_runs; the sm90 tests
below check that sm90 itself runs the calls it is for).
"""

from __future__ import annotations

import ctypes
import itertools
import math

import pytest
import torch
from attention_checks import (
    FEATURES,
    Guarded,
    check_attention,
    check_fixed,
    check_fixed_grads,
    check_grads,
    last_dtype,
    make_qkv,
    need_dtype,
    run_c_backward,
    run_fixed,
    run_grads,
)
from gpu_checks import (
    DEVICE,
    UNIT_ROUNDOFF,
    assert_close_to_reference,
    assert_cuda_healthy,
    call_forced,
    forced_runs,
    has_triton,
    poison_allocator,
    randn,
    runnable_families,
)
from reference import allowed_keys, attention, attention_grads

import samattn
from samattn import _lib

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
ATTENTION_FAMILIES = ("sm90", "sm80", "sm75")


@pytest.fixture(params=ATTENTION_FAMILIES)
def attn_family(request) -> str:
    if request.param not in runnable_families():
        pytest.skip(f"{request.param} is not built or cannot run on this GPU")
    return request.param


# ------------------------------------------------------------ reference ----


# -------------------------------------------------------------- fixed ----
HEAD_DIMS = [8, 32, 40, 64, 80, 96, 128, 136, 192, 200, 256]
# Not multiples of 8: rows are not 16-byte aligned, so the kernels move them element by
# element, rounded up inside the kernel to the next instantiated head dim.
ODD_HEAD_DIMS = [1, 3, 17, 33, 100, 129, 255]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("sq, sk", [(17, 17), (113, 203)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_head_dims(attn_family, dtype, d, sq, sk, causal):
    need_dtype(attn_family, dtype)
    check_fixed(attn_family, 2, sq, sk, 4, 2, d, dtype, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", ODD_HEAD_DIMS)
@pytest.mark.parametrize("sq, sk", [(17, 17), (113, 203)], ids=str)
@pytest.mark.parametrize("heads", [(4, 2), (3, 3)], ids=["GQA", "MHA"])
def test_odd_head_dims(attn_family, dtype, d, sq, sk, heads):
    need_dtype(attn_family, dtype)
    check_fixed(attn_family, 2, sq, sk, *heads, d, dtype, causal=sq == sk)


LENGTHS = [(1, 1), (17, 17), (113, 113), (1000, 1000), (4099, 4099), (113, 203), (203, 113)]
LENGTHS += [(1, 4099), (4099, 17), (17, 1000), (1000, 1)]
# Either side of the sm80 forward's short-key-loop tiles (two K/V stages up to 1536 keys
# without a mask, flash_fwd_dispatch.h).
LENGTHS += [(300, 1536), (300, 1537)]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("sq, sk", LENGTHS, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_lengths(attn_family, dtype, d, sq, sk, causal):
    need_dtype(attn_family, dtype)
    b, h = (1, 2) if max(sq, sk) > 2000 else (2, 4)
    check_fixed(attn_family, b, sq, sk, h, h, d, dtype, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq, sk", [(113, 203), (203, 113), (1000, 1000), (1, 300)], ids=str)
@pytest.mark.parametrize("feature", FEATURES)
def test_features(attn_family, dtype, d, sq, sk, feature):
    need_dtype(attn_family, dtype)
    options = dict(FEATURES[feature])
    hk = options.pop("hk", 8)
    check_fixed(attn_family, 2, sq, sk, 8, hk, d, dtype, **options)


def test_rows_with_nothing_to_attend(attn_family):
    # Causal with more queries than keys: the first sq - sk queries see nothing.
    q, k, v = make_qkv(2, 50, 20, 4, 4, 64, torch.float16)
    out, lse = run_fixed(attn_family, q, k, v, causal=True)
    assert torch.all(out[:, :30] == 0) and torch.all(lse[:, :, :30] == math.inf)
    assert torch.isfinite(out[:, 30:]).all() and torch.isfinite(lse[:, :, 30:]).all()
    # No keys at all.
    q, k, v = make_qkv(2, 7, 0, 4, 4, 64, last_dtype(attn_family))
    out, lse = run_fixed(attn_family, q, k, v)
    assert torch.all(out == 0) and torch.all(lse == math.inf)


WINDOW_SEMANTICS = {
    # (sq, sk, causal, window): bounds that reach past seqlen_k but not past every row,
    # and the first bounds that do (right = sq - 1 and beyond: nothing masked).
    "right >= sk, sq > sk": (100, 40, False, (-1, 50)),
    "right = sk, sq > 2 sk": (90, 30, False, (-1, 30)),
    "left >= sk, sq > sk": (70, 30, False, (45, 0)),
    "both bounded, sq > sk": (64, 16, False, (20, 40)),
    "causal, sq > sk": (80, 33, True, (-1, -1)),
    "causal and left >= sk": (80, 33, True, (40, -1)),
    "right just below sq - 1": (50, 10, False, (-1, 48)),
    "right = sq - 1": (50, 10, False, (-1, 49)),
    "huge bounds": (50, 10, False, (2**40, 2**40)),
}


@pytest.mark.parametrize("case", WINDOW_SEMANTICS.values(), ids=WINDOW_SEMANTICS.keys())
def test_window_semantics_with_more_queries_than_keys(attn_family, case):
    """The documented window rule holds literally, including rows that then see no key
    (out 0, lse +inf), forward and backward."""
    sq, sk, causal, window = case
    dtype = last_dtype(attn_family)
    check_fixed(attn_family, 2, sq, sk, 4, 2, 64, dtype, causal=causal, window=window)
    check_fixed_grads(attn_family, 2, sq, sk, 4, 2, 64, dtype, causal=causal, window=window)


def test_window_accepts_int_likes(attn_family):
    """window_size takes any pair of int-likes, as flash-attn does."""
    import numpy as np

    dtype = last_dtype(attn_family)
    q, k, v = make_qkv(1, 40, 60, 2, 2, 64, dtype)
    expected, _ = run_fixed(attn_family, q, k, v, window_size=(7, 3))
    for window in ([7, 3], (np.int64(7), np.int32(3)), (torch.tensor(7), torch.tensor(3))):
        out, _ = run_fixed(attn_family, q, k, v, window_size=window)
        assert torch.equal(out, expected), window


def test_long_sequence(attn_family):
    """128k tokens, causal: a sample of query rows against the reference."""
    n, d, dtype = 131072, 64, last_dtype(attn_family)
    q, k, v = make_qkv(1, n, n, 1, 1, d, dtype)
    out, lse = run_fixed(attn_family, q, k, v, causal=True)
    rows = torch.cat(
        [torch.arange(0, 64), torch.arange(n // 2, n // 2 + 64), torch.arange(n - 128, n)]
    )
    rows = rows.to(DEVICE)
    mask = allowed_keys(n, n, True, (-1, -1), rows=rows)
    check_attention(
        out[:, rows], lse[:, :, rows], q[:, rows], k, v,
        scale=d**-0.5, softcap=0.0, mask=mask, what="128k causal",
    )  # fmt: skip


def test_scale_and_strided_inputs(attn_family):
    # q, k, v as slices of one packed buffer (strides multiples of 8: read in place), and
    # as views with a padded head dim (strides not multiples of 8: copied first).
    b, s, h, d = 2, 77, 4, 64
    qkv = randn(b, s, 3, h, d, dtype=torch.float16)
    q, k, v = qkv.unbind(2)
    out, lse = run_fixed(attn_family, q, k, v, softmax_scale=0.3)
    check_attention(out, lse, q, k, v, scale=0.3, softcap=0.0, mask=None, what="packed views")
    wide = randn(b, s, h, d + 4, dtype=torch.float16)
    q = wide[..., :d]
    out, lse = run_fixed(attn_family, q, k, v)
    check_attention(out, lse, q, k, v, scale=d**-0.5, softcap=0.0, mask=None, what="odd strides")


def test_packed_variants_match(attn_family):
    b, s, h, d = 2, 65, 4, 64
    qkv = randn(b, s, 3, h, d, dtype=last_dtype(attn_family))
    q, k, v = qkv.unbind(2)

    def run(fn):
        """fn()'s output and the family that ran it."""
        _lib.set_last_family(_lib.FAMILY_AUTO)
        out = fn()
        assert _lib.last_family() in forced_runs(attn_family), _lib.last_family()
        return out, _lib.last_family()

    def same(got, want):
        # Bit-identical from the same family's kernel; with sm90 forced, a variant its plan
        # declines (varlen) runs on sm80, whose rounding differs.
        (out, family), (expected, expected_family) = got, want
        if family == expected_family:
            assert torch.equal(out, expected)
        else:
            torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)

    with samattn.use_family(attn_family):
        fixed = run(lambda: samattn.flash_attn_func(q, k, v, causal=True))
        same(run(lambda: samattn.flash_attn_qkvpacked_func(qkv, causal=True)), fixed)
        kv = torch.stack([k, v], dim=2)
        same(run(lambda: samattn.flash_attn_kvpacked_func(q, kv, causal=True)), fixed)
        cu = torch.tensor([0, s, 2 * s], dtype=torch.int32, device=DEVICE)
        flat_fixed = (fixed[0].flatten(0, 1), fixed[1])
        flat = qkv.flatten(0, 1)
        same(run(lambda: samattn.flash_attn_varlen_qkvpacked_func(flat, cu, s, causal=True)),
             flat_fixed)  # fmt: skip
        varlen_kv = run(
            lambda: samattn.flash_attn_varlen_kvpacked_func(
                q.flatten(0, 1), kv.flatten(0, 1), cu, cu, s, s, causal=True
            )
        )
        same(varlen_kv, flat_fixed)


# ------------------------------------------------------------- varlen ----
VARLEN_BATCHES = {
    "mixed": ([0, 1, 17, 300, 1000, 5], [5, 1, 17, 300, 999, 0]),
    "more queries": ([113, 1, 64], [17, 1, 3]),
    "more keys": ([17, 1, 3], [203, 1, 64]),
    "all empty": ([0, 0], [0, 7]),
    "one": ([4099], [4099]),
}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("batch", VARLEN_BATCHES)
@pytest.mark.parametrize("feature", ["plain", "causal", "window", "softcap", "GQA"])
def test_varlen(attn_family, dtype, d, batch, feature):
    need_dtype(attn_family, dtype)
    lens_q, lens_k = VARLEN_BATCHES[batch]
    h = 4
    hk = 2 if feature == "GQA" else h
    causal = feature == "causal"
    window = (24, 8) if feature == "window" else (-1, -1)
    softcap = 25.0 if feature == "softcap" else 0.0
    total_q, total_k = sum(lens_q), sum(lens_k)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(total_q, h, d, dtype=dtype, scale=3.0 if softcap else 1.0)
    k = randn(total_k, hk, d, dtype=dtype, scale=3.0 if softcap else 1.0)
    v = randn(total_k, hk, d, dtype=dtype)
    max_q, max_k = max(lens_q), max(lens_k)
    poison_allocator(q.shape, dtype)
    out, lse, _ = call_forced(
        attn_family,
        lambda: samattn.flash_attn_varlen_func(
            q,
            k,
            v,
            cu_q.to(DEVICE),
            cu_k.to(DEVICE),
            max_q,
            max_k,
            causal=causal,
            window_size=window,
            softcap=softcap,
            return_attn_probs=True,
        ),
        may_launch_nothing=total_q == 0,
        expected=forced_runs(attn_family),
    )
    assert out.shape == q.shape and lse.shape == (h, total_q)
    for i, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        if sq == 0:
            continue
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rk = slice(int(cu_k[i]), int(cu_k[i + 1]))
        mask = allowed_keys(sq, sk, causal, window, norm_seqlen_k=max_k)
        check_attention(
            out[rq][None], lse[:, rq][None], q[rq][None], k[rk][None], v[rk][None],
            scale=d**-0.5, softcap=softcap, mask=mask, what=f"{batch} sequence {i} ({sq}x{sk})",
        )  # fmt: skip


def test_varlen_bad_offsets_are_refused_before_the_launch(attn_family):
    q = randn(40, 4, 64, dtype=torch.float16)
    k = v = randn(50, 4, 64, dtype=torch.float16)
    good = torch.tensor([0, 10, 40], dtype=torch.int32, device=DEVICE)
    for cu_q, fragment in [
        ([0, 30, 20], "non-decreasing"),
        ([0, 10, 41], "exceeds the 40 tokens"),
        ([0, 5, 40], "max_seqlen_q is 30"),
    ]:
        cu = torch.tensor(cu_q, dtype=torch.int32, device=DEVICE)
        with pytest.raises(ValueError, match=fragment), samattn.use_family(attn_family):
            samattn.flash_attn_varlen_func(q, k, v, cu, good, 30, 40)
    assert_cuda_healthy()


def test_varlen_in_a_cuda_graph(attn_family):
    from gpu_checks import capture_graph

    q = randn(40, 4, 64, dtype=torch.float16)
    k = v = randn(50, 4, 64, dtype=torch.float16)
    cu_q = torch.tensor([0, 10, 40], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 20, 50], dtype=torch.int32, device=DEVICE)
    with samattn.use_family(attn_family):
        expected = samattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 30)
        graph, out = capture_graph(
            lambda: samattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 30)
        )
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


# --------------------------------------------------------------- SDPA ----
SDPA_CASES = [
    # b, h, hk, sq, sk, is_causal, enable_gqa
    (2, 4, 4, 113, 113, False, False),
    (2, 4, 4, 113, 113, True, False),
    (2, 4, 4, 50, 203, False, False),
    (2, 4, 4, 150, 100, True, False),  # top-left causal through a window
    (2, 4, 4, 210, 70, True, False),  # ... whose right bound reaches past seqlen_k
    (2, 8, 2, 77, 77, True, True),
]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", SDPA_CASES, ids=str)
def test_sdpa(attn_family, dtype, case):
    need_dtype(attn_family, dtype)
    b, h, hk, sq, sk, is_causal, enable_gqa = case
    d = 64
    query = randn(b, h, sq, d, dtype=dtype)
    key, value = randn(b, hk, sk, d, dtype=dtype), randn(b, hk, sk, d, dtype=dtype)
    out = call_forced(
        attn_family,
        lambda: samattn.scaled_dot_product_attention(
            query, key, value, is_causal=is_causal, enable_gqa=enable_gqa
        ),
        expected=forced_runs(attn_family),
    )
    assert out.shape == (b, h, sq, d) and out.transpose(1, 2).is_contiguous()
    # torch's causal mask is top-left aligned.
    mask = torch.ones(sq, sk, dtype=torch.bool, device=DEVICE).tril() if is_causal else None
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    ref, _ = attention(q, k, v, d**-0.5, 0.0, mask, torch.float64)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=is_causal, enable_gqa=enable_gqa
    )
    floor = 0.5 * UNIT_ROUNDOFF[dtype]
    assert_close_to_reference(
        out.transpose(1, 2), ref, expected.transpose(1, 2), floor, f"sdpa {case}"
    )


def test_sdpa_dropout_falls_back_to_torch(monkeypatch):
    # Masks run in samattn's kernels (test_gpu_attention_mask.py); SDPA leaves dropout to torch.
    from samattn import _warnings

    monkeypatch.setattr(_warnings, "_warned_messages", set())
    query, key, value = (randn(1, 2, 16, 64, dtype=torch.float16) for _ in range(3))
    torch.manual_seed(3)
    with pytest.warns(UserWarning, match="dropout_p"):
        out = samattn.scaled_dot_product_attention(query, key, value, dropout_p=0.25)
    torch.manual_seed(3)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, dropout_p=0.25)
    torch.testing.assert_close(out, expected)


# ------------------------------------------------ families and errors ----
def need_sm90() -> None:
    if "sm90" not in runnable_families():
        pytest.skip("sm90 is not built or cannot run on this GPU")


def ran_forced(family, fn):
    """fn() with `family` forced (None: automatic), and the family that ran it."""
    _lib.set_last_family(_lib.FAMILY_AUTO)
    with samattn.use_family(family):
        result = fn()
    return result, _lib.last_family()


# The prefill calls the sm90 forward is for (fixed lengths, 16-byte aligned contiguous
# tensors, head dims that fill its rows, more than decode-shaped): (b, sq, sk, h, hk, d).
SM90_PREFILLS = [
    (2, 256, 256, 4, 4, 64),
    (1, 333, 1000, 8, 2, 128),  # GQA, partial tiles
    (2, 1000, 333, 4, 1, 128),  # MQA, more queries than keys
    (1, 129, 257, 2, 2, 256),
    # Enough query tiles for a persistent grid (causal: over pairs of tiles of equal work).
    (8, 1000, 1000, 16, 16, 64),
    (4, 1500, 1000, 16, 4, 128),  # causal: the first 500 queries see no key
    (1, 300, 9000, 4, 2, 64),  # a long key loop: d = 64's row of 192 query rows
]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", SM90_PREFILLS, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sm90_runs_the_prefill_forward(no_family_env, dtype, shape, causal):
    """sm90 itself runs the calls it is for, forced and automatically (elsewhere a forced
    sm90 may hand a call to sm80, so this is where it must not), and runs them right."""
    need_sm90()
    b, sq, sk, h, hk, d = shape
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype)
    poison_allocator((b, sq, h, d), dtype)

    def forward():
        return samattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[:2]

    (out, lse), family = ran_forced("sm90", forward)
    assert family == "sm90", f"forced sm90 handed {shape} to {family}"
    mask = allowed_keys(sq, sk, causal, (-1, -1))
    what = f"sm90 {dtype} {shape} causal{causal}"
    check_attention(out, lse, q, k, v, scale=d**-0.5, softcap=0.0, mask=mask, what=what)
    (auto_out, _), family = ran_forced(None, forward)
    assert family == "sm90", f"automatic selection ran {shape} on {family}"
    assert torch.equal(auto_out, out)


def test_sm90_hands_what_it_declines_to_sm80():
    """A forced sm90 runs what its plan declines on sm80 (its registration's
    forced_fallback): here a head dim that is not a multiple of 8 and a decode-shaped call
    whose grid fills the GPU without splitting the keys (sm90 runs decode-shaped calls
    whose splits it combines in a cluster, test_gpu_kvcache.py). A view whose head stride
    TMA cannot describe (not a multiple of 16 bytes) runs right, on whichever family takes
    it (the Python layer may pass an aligned copy)."""
    need_sm90()
    q, k, v = make_qkv(2, 200, 200, 4, 4, 100, torch.float16)
    out, family = ran_forced("sm90", lambda: samattn.flash_attn_func(q, k, v))
    assert family == "sm80"
    assert torch.equal(out, ran_forced("sm80", lambda: samattn.flash_attn_func(q, k, v))[0])
    q, k, v = make_qkv(8, 1, 500, 64, 64, 128, torch.bfloat16)
    assert ran_forced("sm90", lambda: samattn.flash_attn_func(q, k, v))[1] == "sm80"
    padded = randn(2, 300, 4, 68, dtype=torch.float16)
    q = k = v = padded[..., :64]  # head stride 68 elements
    out, family = ran_forced("sm90", lambda: samattn.flash_attn_func(q, k, v, causal=True))
    assert family in ("sm90", "sm80")
    mask = allowed_keys(300, 300, True, (-1, -1))
    lse = samattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)[1]
    check_attention(out, lse, q, k, v, scale=64**-0.5, softcap=0.0, mask=mask, what="strided")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("feature", ["plain", "causal", "window", "GQA"])
def test_sm90_runs_varlen(no_family_env, dtype, d, feature):
    """Variable-length prefill on sm90 itself (its TMA tiles start at each sequence's
    first row and read into the next sequence; the mask and a row-by-row store keep
    that out): empty sequences, one row, partial tiles, more keys than queries and the
    reverse, sequences of zero keys, against the reference per sequence."""
    need_sm90()
    lens_q, lens_k = [0, 1, 17, 300, 1000, 5, 129], [5, 1, 17, 300, 999, 0, 700]
    h, hk = 4, 1 if feature == "GQA" else 4
    causal, window = feature == "causal", (24, 8) if feature == "window" else (-1, -1)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(int(cu_q[-1]), h, d, dtype=dtype)
    k, v = (randn(int(cu_k[-1]), hk, d, dtype=dtype) for _ in range(2))
    poison_allocator(q.shape, dtype)
    max_q, max_k = max(lens_q), max(lens_k)

    def forward():
        return samattn.flash_attn_varlen_func(
            q, k, v, cu_q.to(DEVICE), cu_k.to(DEVICE), max_q, max_k, causal=causal,
            window_size=window, return_attn_probs=True,
        )[:2]  # fmt: skip

    (out, lse), family = ran_forced(None, forward)
    assert family == "sm90", f"automatic selection ran varlen {feature} on {family}"
    for i, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        if sq == 0:
            continue
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        mask = allowed_keys(sq, sk, causal, window, norm_seqlen_k=max_k)
        what = f"sm90 varlen {feature} seq {i} ({sq}x{sk})"
        check_attention(
            out[rq][None], lse[:, rq][None], q[rq][None], k[rk][None], v[rk][None],
            scale=d**-0.5, softcap=0.0, mask=mask, what=what,
        )  # fmt: skip


# The backward calls the sm90 backward is for: (b, sq, sk, h, hk, d, window).
SM90_BACKWARDS = [
    (2, 256, 256, 4, 4, 64, (-1, -1)),
    (1, 333, 1000, 8, 2, 128, (-1, -1)),  # GQA, partial tiles
    (2, 1000, 333, 4, 1, 128, (-1, -1)),  # MQA, more queries than keys
    (2, 300, 300, 4, 4, 40, (-1, -1)),  # a head dim padded to 64 by TMA's zero fill
    (1, 777, 777, 4, 2, 64, (100, 20)),  # a sliding window
    (4, 1500, 1000, 8, 4, 128, (-1, -1)),  # causal: the first 500 queries see no key
    # d = 256: tiles of 64 keys whose two consumers split the work by role.
    (2, 333, 517, 4, 2, 256, (-1, -1)),
    (1, 700, 300, 4, 4, 200, (64, 0)),  # padded to 256 by TMA's zero fill, a window
]


def backward_op(dout, q, k, v, out, lse, causal, window, *, softcap=0.0, deterministic=False):
    """The backward op called on this thread, so that its family is seen (autograd would
    run it on its device thread)."""
    d = q.shape[-1]
    args = (dout, q, k, v, out, lse, None, None, q.shape[1], k.shape[1], d**-0.5, causal,
            window[0], window[1], softcap, deterministic)  # fmt: skip
    return torch.ops.samattn.flash_attn_backward(*args)[:3]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", SM90_BACKWARDS, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sm90_runs_the_backward(no_family_env, dtype, shape, causal):
    """sm90's backward itself runs the calls it is for, forced and automatically, from
    sm90's out and lse, and its gradients meet the accuracy rule."""
    need_sm90()
    b, sq, sk, h, hk, d, window = shape
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype)
    dout = randn(b, sq, h, d, dtype=dtype)
    out, lse = samattn.flash_attn_func(
        q, k, v, causal=causal, window_size=window, return_attn_probs=True
    )[:2]
    poison_allocator((b, sq, h, d), dtype)
    grads, family = ran_forced("sm90", lambda: backward_op(dout, q, k, v, out, lse, causal, window))
    assert family == "sm90", f"forced sm90 handed the backward of {shape} to {family}"
    mask = allowed_keys(sq, sk, causal, window)
    what = f"sm90 backward {dtype} {shape} causal{causal}"
    check_grads(grads, q, k, v, dout, scale=d**-0.5, softcap=0.0, mask=mask, what=what)
    # dQ's adds land in any order: automatic selection runs the same kernel, not the same
    # bits.
    auto, family = ran_forced(None, lambda: backward_op(dout, q, k, v, out, lse, causal, window))
    assert family == "sm90", f"automatic selection ran the backward of {shape} on {family}"
    check_grads(auto, q, k, v, dout, scale=d**-0.5, softcap=0.0, mask=mask, what=what + " auto")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("feature", ["plain", "causal", "window", "GQA", "d256"])
def test_sm90_runs_the_varlen_backward(no_family_env, dtype, feature):
    """The varlen backward on sm90 itself (its TMA tiles start at each sequence's first
    row and read into the next sequence, which LSE = +inf and the key mask leave out):
    empty sequences, one row, partial tiles, more keys than queries and the reverse, a
    sequence of zero keys, against the reference per sequence."""
    need_sm90()
    lens_q, lens_k = [0, 1, 17, 300, 1000, 5, 129], [5, 1, 17, 300, 999, 0, 700]
    d, h, hk = 256 if feature == "d256" else 128, 4, 1 if feature == "GQA" else 4
    causal = feature in ("causal", "d256")
    window = (24, 8) if feature == "window" else (-1, -1)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q, dout = (randn(int(cu_q[-1]), h, d, dtype=dtype) for _ in range(2))
    k, v = (randn(int(cu_k[-1]), hk, d, dtype=dtype) for _ in range(2))
    max_q, max_k = max(lens_q), max(lens_k)
    cu_qd, cu_kd = cu_q.to(DEVICE), cu_k.to(DEVICE)
    out, lse = samattn.flash_attn_varlen_func(
        q, k, v, cu_qd, cu_kd, max_q, max_k, causal=causal, window_size=window,
        return_attn_probs=True,
    )[:2]  # fmt: skip
    args = (dout, q, k, v, out, lse, cu_qd, cu_kd, max_q, max_k, d**-0.5, causal, *window,
            0.0, False)  # fmt: skip
    poison_allocator(q.shape, dtype)
    (dq, dk, dv, _), family = ran_forced(None, lambda: torch.ops.samattn.flash_attn_backward(*args))
    assert family == "sm90", f"automatic selection ran the varlen {feature} backward on {family}"
    for i, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        if sq == 0:
            assert not dk[rk].any() and not dv[rk].any(), f"seq {i}: keys no query sees"
            continue
        mask = allowed_keys(sq, sk, causal, window, norm_seqlen_k=max_k)
        check_grads(
            (dq[rq][None], dk[rk][None], dv[rk][None]), q[rq][None], k[rk][None], v[rk][None],
            dout[rq][None], scale=d**-0.5, softcap=0.0, mask=mask,
            what=f"sm90 varlen backward {feature} seq {i} ({sq}x{sk})",
        )  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sm90_backward_softcap_and_determinism(no_family_env, dtype, d, causal):
    """sm90's backward with softcap (the tanh's gradient recovered from P), and its
    deterministic mode (each query tile's key tiles add dQ in order): bit-identical twice,
    GQA and partial tiles."""
    need_sm90()
    b, sq, sk, h, hk = 2, 333, 517, 8, 2
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype, scale=3.0)
    dout = randn(b, sq, h, d, dtype=dtype)
    mask = allowed_keys(sq, sk, causal, (-1, -1))
    what = f"sm90 {dtype} d{d} causal{causal}"
    out, lse = samattn.flash_attn_func(
        q, k, v, causal=causal, softcap=20.0, return_attn_probs=True
    )[:2]
    grads, family = ran_forced(
        None, lambda: backward_op(dout, q, k, v, out, lse, causal, (-1, -1), softcap=20.0)
    )
    assert family == "sm90", f"{what}: softcap's backward ran on {family}"
    check_grads(grads, q, k, v, dout, scale=d**-0.5, softcap=20.0, mask=mask,
                what=f"{what} softcap")  # fmt: skip
    q, k = q / 3, k / 3
    out, lse = samattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[:2]

    def deterministic():
        return backward_op(dout, q, k, v, out, lse, causal, (-1, -1), deterministic=True)

    first, family = ran_forced(None, deterministic)
    assert family == "sm90", f"{what}: the deterministic backward ran on {family}"
    check_grads(first, q, k, v, dout, scale=d**-0.5, softcap=0.0, mask=mask,
                what=f"{what} deterministic")  # fmt: skip
    for _ in range(3):
        again, _ = ran_forced(None, deterministic)
        for name, a, b_ in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b_), f"{what}: {name} differs between deterministic runs"


@pytest.mark.parametrize("case", ["d192", "d96", "alibi softcap"], ids=str)
def test_sm90_hands_the_backwards_it_declines_to_sm80(no_family_env, case):
    """What the sm90 backward's plan declines runs on sm80, forced or not, and right."""
    need_sm90()
    d = {"d192": 192, "d96": 96}.get(case, 128)
    b, s, h = 2, 300, 4
    q, k, v = make_qkv(b, s, s, h, h, d, torch.bfloat16)
    dout = randn(b, s, h, d, dtype=torch.bfloat16)
    alibi = case == "alibi softcap"
    slopes = torch.rand(h, device=DEVICE, dtype=torch.float32) if alibi else None
    softcap = 30.0 if alibi else 0.0
    out, lse = samattn.flash_attn_func(
        q, k, v, causal=True, alibi_slopes=slopes, softcap=softcap, return_attn_probs=True
    )[:2]
    args = (dout, q, k, v, out, lse, None, None, s, s, d**-0.5, True, -1, -1, softcap, False,
            slopes)  # fmt: skip
    for forced in ("sm90", None):
        grads, family = ran_forced(forced, lambda: torch.ops.samattn.flash_attn_backward(*args)[:3])
        assert family == "sm80", f"{case}, forced {forced}: ran on {family}"
    if slopes is None:
        mask = allowed_keys(s, s, True, (-1, -1))
        check_grads(grads, q, k, v, dout, scale=d**-0.5, softcap=0.0, mask=mask,
                    what=f"sm80 backward ({case}) handed over by sm90")  # fmt: skip


def test_bf16_on_sm75_is_refused():
    if "sm75" not in runnable_families():
        pytest.skip("sm75 is not built or cannot run on this GPU")
    q, k, v = make_qkv(1, 16, 16, 2, 2, 64, torch.bfloat16)
    message = r"family sm75 has no bfloat16 attention.*needs compute capability 8.0 or newer"
    with pytest.raises(samattn.UnsupportedError, match=message), samattn.use_family("sm75"):
        samattn.flash_attn_func(q, k, v)
    assert_cuda_healthy()


def test_auto_selects_the_newest_family(no_family_env):
    if "sm80" not in runnable_families():
        pytest.skip("sm80 is not built or cannot run on this GPU")
    # A decode-shaped call (16 query rows per KV head) runs sm80's split-key kernel, also
    # on Hopper; a prefill runs sm90 where it can.
    q, k, v = make_qkv(1, 16, 16, 2, 2, 64, torch.float16)
    samattn.flash_attn_func(q, k, v)
    assert _lib.last_family() == "sm80"
    q, k, v = make_qkv(1, 256, 256, 2, 2, 64, torch.float16)
    samattn.flash_attn_func(q, k, v)
    assert _lib.last_family() == ("sm90" if "sm90" in runnable_families() else "sm80")


# --------------------------------------------- C ABI on guarded buffers ----


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [37, 40, 64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_c_abi_writes_every_output_and_nothing_else(attn_family, dtype, d, causal):
    need_dtype(attn_family, dtype)
    b, sq, sk, h, hk = 2, 130, 70, 4, 2
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype)
    # O with padded rows (seq stride h * (d + 8)), lse as (b, h, sq) with a padded head.
    o = Guarded((b, sq, h, d), (sq * h * (d + 8), h * (d + 8), d + 8, 1), dtype)
    lse = Guarded((b, h, sq), (h * (sq + 3), sq + 3, 1), torch.float32)
    args = _lib.AttentionArgs(
        dtype=_lib.F16 if dtype == torch.float16 else _lib.BF16,
        family=_lib.FAMILY_CODES[attn_family],
        device=torch.cuda.current_device(),
        causal=int(causal),
        batch=b, nheads=h, nheads_k=hk, seqlen_q=sq, seqlen_k=sk, headdim=d,
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.view.data_ptr(),
        lse=lse.view.data_ptr(), softmax_scale=d**-0.5, window_left=-1, window_right=-1,
        stream=torch.cuda.current_stream().cuda_stream,
    )  # fmt: skip
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o.view)):
        strides = t.stride()[:3]
        for field, value in zip(("batch", "seq", "head"), strides):
            setattr(args, f"{name}_{field}_stride", value)
    args.lse_batch_stride, args.lse_head_stride, args.lse_seq_stride = lse.view.stride()
    used = ctypes.c_int32(-1)
    status = _lib.lib().samattn_attention_forward(ctypes.byref(args), ctypes.byref(used))
    assert status == _lib.OK, _lib.last_error()
    assert _lib.FAMILY_NAMES[used.value] in forced_runs(attn_family)
    torch.cuda.synchronize()
    o.assert_no_stray_writes("o")
    lse.assert_no_stray_writes("lse")
    mask = allowed_keys(sq, sk, causal, (-1, -1))
    check_attention(o.view, lse.view, q, k, v, scale=d**-0.5, softcap=0.0, mask=mask, what="c abi")


# ========================================================== the backward ====


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [8, 32, 40, 64, 96, 128, 160, 192, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grad_head_dims(attn_family, dtype, d, causal):
    check_fixed_grads(attn_family, 2, 113, 203, 4, 2, d, dtype, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", ODD_HEAD_DIMS)
@pytest.mark.parametrize("heads", [(4, 2), (3, 3)], ids=["GQA", "MHA"])
def test_grad_odd_head_dims(attn_family, dtype, d, heads):
    # MHA writes dk, dv from the main kernel, GQA through the fp32 accumulators: both
    # with rows that are not 4-byte aligned at odd head dims.
    check_fixed_grads(attn_family, 2, 113, 203, *heads, d, dtype, causal=True)


@pytest.mark.parametrize("d", [36, 100])
def test_odd_head_dim_varlen_and_sdpa(attn_family, d):
    """Varlen (packed rows of an odd head dim) and SDPA's (batch, heads, seq, dim) views,
    forward and backward, against the fixed-length path of the same family."""
    dtype = last_dtype(attn_family)
    lens = [5, 0, 130, 1]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=DEVICE)
    total, h = sum(lens), 4
    q, k, v = (randn(total, h, d, dtype=dtype) for _ in range(3))
    dout = randn(total, h, d, dtype=dtype)

    def forward(q, k, v):
        return samattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)

    dq, dk, dv = run_grads(attn_family, forward, q, k, v, dout)
    for i, n in enumerate(lens):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        if n == 0:
            continue
        mask = allowed_keys(n, n, True, (-1, -1))
        check_grads(
            (dq[rows][None], dk[rows][None], dv[rows][None]), q[rows][None], k[rows][None],
            v[rows][None], dout[rows][None], scale=d**-0.5, softcap=0.0, mask=mask,
            what=f"varlen d{d} sequence {i}",
        )  # fmt: skip
    query, key, value = (randn(2, 4, 77, d, dtype=dtype) for _ in range(3))
    dout = randn(2, 4, 77, d, dtype=dtype)

    def sdpa(q, k, v):
        return samattn.scaled_dot_product_attention(q, k, v, is_causal=True)

    grads = run_grads(attn_family, sdpa, query, key, value, dout)
    mask = torch.ones(77, 77, dtype=torch.bool, device=DEVICE).tril()
    t = [x.transpose(1, 2) for x in (query, key, value, dout, *grads)]
    check_grads(t[4:], *t[:4], scale=d**-0.5, softcap=0.0, mask=mask, what=f"sdpa d{d}")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("sq, sk", LENGTHS, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grad_lengths(attn_family, dtype, sq, sk, causal):
    b, h = (1, 2) if max(sq, sk) > 2000 else (2, 4)
    check_fixed_grads(attn_family, b, sq, sk, h, h, 64, dtype, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq, sk", [(113, 203), (203, 113)], ids=str)
@pytest.mark.parametrize("feature", FEATURES)
def test_grad_features(attn_family, dtype, d, sq, sk, feature):
    options = dict(FEATURES[feature])
    hk = options.pop("hk", 8)
    check_fixed_grads(attn_family, 2, sq, sk, 8, hk, d, dtype, **options)


@pytest.mark.parametrize("feature", ["everything", "GQA", "window"])
def test_grad_features_long(attn_family, feature):
    options = dict(FEATURES[feature])
    hk = options.pop("hk", 4)
    check_fixed_grads(attn_family, 1, 1000, 1000, 4, hk, 128, last_dtype(attn_family), **options)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("batch", VARLEN_BATCHES)
@pytest.mark.parametrize("feature", ["plain", "causal", "window", "softcap", "GQA"])
def test_grad_varlen(attn_family, dtype, d, batch, feature):
    lens_q, lens_k = VARLEN_BATCHES[batch]
    h = 4
    hk = 2 if feature == "GQA" else h
    causal = feature == "causal"
    window = (24, 8) if feature == "window" else (-1, -1)
    softcap = 25.0 if feature == "softcap" else 0.0
    # One spare row after the sequences of each packed tensor: its gradient must be 0.
    total_q, total_k = sum(lens_q) + 1, sum(lens_k) + 1
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(total_q, h, d, dtype=dtype, scale=3.0 if softcap else 1.0)
    k = randn(total_k, hk, d, dtype=dtype, scale=3.0 if softcap else 1.0)
    v = randn(total_k, hk, d, dtype=dtype)
    dout = randn(total_q, h, d, dtype=dtype)
    max_q, max_k = max(lens_q), max(lens_k)

    def forward(q, k, v):
        return samattn.flash_attn_varlen_func(
            q, k, v, cu_q.to(DEVICE), cu_k.to(DEVICE), max_q, max_k, causal=causal,
            window_size=window, softcap=softcap,
        )  # fmt: skip

    dq, dk, dv = run_grads(attn_family, forward, q, k, v, dout, may_launch_nothing=max_q == 0)
    assert torch.all(dq[-1] == 0) and torch.all(dk[-1] == 0) and torch.all(dv[-1] == 0), batch
    for i, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rk = slice(int(cu_k[i]), int(cu_k[i + 1]))
        what = f"grad {batch} sequence {i} ({sq}x{sk}) {feature} {dtype} d{d}"
        if sq == 0 or sk == 0:  # nothing attends: zero gradients
            assert torch.all(dq[rq] == 0) and torch.all(dk[rk] == 0) and torch.all(dv[rk] == 0)
            continue
        mask = allowed_keys(sq, sk, causal, window, norm_seqlen_k=max_k)
        check_grads(
            (dq[rq][None], dk[rk][None], dv[rk][None]), q[rq][None], k[rk][None], v[rk][None],
            dout[rq][None], scale=d**-0.5, softcap=softcap, mask=mask, what=what,
        )  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", SDPA_CASES, ids=str)
def test_grad_sdpa(attn_family, dtype, case):
    # (batch, heads, seq, dim) tensors: the kernels read q, k, v, dout through strides.
    b, h, hk, sq, sk, is_causal, enable_gqa = case
    d = 64
    query = randn(b, h, sq, d, dtype=dtype)
    key, value = randn(b, hk, sk, d, dtype=dtype), randn(b, hk, sk, d, dtype=dtype)
    dout = randn(b, h, sq, d, dtype=dtype)

    def forward(q, k, v):
        return samattn.scaled_dot_product_attention(
            q, k, v, is_causal=is_causal, enable_gqa=enable_gqa
        )

    grads = run_grads(attn_family, forward, query, key, value, dout)
    mask = torch.ones(sq, sk, dtype=torch.bool, device=DEVICE).tril() if is_causal else None
    t = [x.transpose(1, 2) for x in (query, key, value, dout, *grads)]
    check_grads(t[4:], *t[:4], scale=d**-0.5, softcap=0.0, mask=mask, what=f"grad sdpa {case}")


def test_grad_strided_inputs_and_dout(attn_family):
    # q, k, v slices of one packed qkv (read in place) and dout with a padded head dim
    # (copied first); the gradient of qkv is assembled by autograd.
    b, s, h, d = 2, 77, 4, 64
    qkv = randn(b, s, 3, h, d, dtype=torch.float16).requires_grad_(True)
    wide = randn(b, s, h, d + 4, dtype=torch.float16)
    dout = wide[..., :d]
    with samattn.use_family(attn_family):
        out = samattn.flash_attn_qkvpacked_func(qkv, causal=True)
        (dqkv,) = torch.autograd.grad(out, qkv, dout)
    q, k, v = qkv.detach().unbind(2)
    mask = allowed_keys(s, s, True, (-1, -1))
    check_grads(dqkv.unbind(2), q, k, v, dout, scale=d**-0.5, softcap=0.0, mask=mask,
                what="qkvpacked")  # fmt: skip


def test_grad_lse_is_ignored(attn_family):
    # flash-attn's convention: softmax_lse is a constant for autograd.
    q, k, v = (t.requires_grad_(True) for t in make_qkv(1, 33, 40, 2, 2, 64, torch.float16))
    with samattn.use_family(attn_family):
        out, lse, _ = samattn.flash_attn_func(q, k, v, deterministic=True, return_attn_probs=True)
        with_lse = torch.autograd.grad(out.sum() + lse.sum(), (q, k, v), retain_graph=True)
        without = torch.autograd.grad(out.sum(), (q, k, v))
    for a, b in zip(with_lse, without):
        assert torch.equal(a, b)


def test_grad_long_sequence(attn_family):
    """128k tokens, causal. Exact sub-problems: dq of sampled query rows (each sees only
    its keys) and dk, dv of the last 128 keys (seen only by the last 128 queries)."""
    n, d, dtype = 131072, 64, last_dtype(attn_family)
    q, k, v = make_qkv(1, n, n, 1, 1, d, dtype)
    dout = randn(1, n, 1, d, dtype=dtype)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    with samattn.use_family(attn_family):
        out = samattn.flash_attn_func(*leaves, causal=True)
        dq, dk, dv = torch.autograd.grad(out, leaves, dout)
    q, k, v = (t.detach() for t in leaves)
    last = torch.arange(n - 128, n, device=DEVICE)
    rows = torch.cat([torch.arange(0, 64, device=DEVICE), torch.arange(n // 2, n // 2 + 64,
                      device=DEVICE), last])  # fmt: skip
    mask = allowed_keys(n, n, True, (-1, -1), rows=rows)
    ref = attention_grads(q[:, rows], k, v, dout[:, rows], d**-0.5, 0.0, mask, torch.float64)
    base = attention_grads(q[:, rows], k, v, dout[:, rows], d**-0.5, 0.0, mask, dtype)
    floor = UNIT_ROUNDOFF[dtype]
    assert_close_to_reference(dq[:, rows], ref[0], base[0], floor, "128k dq")
    for name, got, r, b in (("dk", dk, ref[1], base[1]), ("dv", dv, ref[2], base[2])):
        assert_close_to_reference(got[:, last], r[:, last], b[:, last], floor, f"128k {name}")
        assert torch.isfinite(got).all(), f"128k {name}: non-finite values"


DETERMINISTIC_CASES = {
    "GQA causal": dict(b=2, sq=1000, sk=1000, h=8, hk=2, d=128, causal=True),
    "MQA window": dict(b=1, sq=777, sk=1500, h=4, hk=1, d=64, window_size=(200, 50)),
    "d256 softcap": dict(b=1, sq=600, sk=600, h=4, hk=4, d=256, softcap=20.0),
}


@pytest.mark.parametrize("case", DETERMINISTIC_CASES)
def test_deterministic_backward_is_bit_identical(attn_family, case):
    c = dict(DETERMINISTIC_CASES[case])
    b, sq, sk, h, hk, d = (c.pop(name) for name in ("b", "sq", "sk", "h", "hk", "d"))
    if attn_family == "sm75" and d > 192:
        pytest.skip("the sm75 backward supports head dims up to 192")
    q, k, v = make_qkv(b, sq, sk, h, hk, d, last_dtype(attn_family))
    dout = randn(b, sq, h, d, dtype=last_dtype(attn_family))
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    runs = []
    with samattn.use_family(attn_family):
        for _ in range(3):
            out = samattn.flash_attn_func(*leaves, deterministic=True, **c)
            runs.append(torch.autograd.grad(out, leaves, dout))
        out = samattn.flash_attn_func(*leaves, deterministic=False, **c)
        atomic = torch.autograd.grad(out, leaves, dout)
    for run in runs[1:]:
        for name, first, again in zip(("dq", "dk", "dv"), runs[0], run):
            assert torch.equal(first, again), f"{case}: {name} differs between runs"
    # The atomic (default) order differs only by fp32 summation order.
    for first, other in zip(runs[0], atomic):
        torch.testing.assert_close(first.float(), other.float(), rtol=2e-2, atol=2e-2)


def test_deterministic_varlen(attn_family):
    lens = [300, 1, 0, 517]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32).to(DEVICE)
    total = sum(lens)
    q, k, v = (randn(total, hk, 64, dtype=torch.float16) for hk in (8, 2, 2))
    dout = randn(total, 8, 64, dtype=torch.float16)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    runs = []
    with samattn.use_family(attn_family):
        for _ in range(2):
            out = samattn.flash_attn_varlen_func(
                *leaves, cu, cu, max(lens), max(lens), causal=True, deterministic=True
            )
            runs.append(torch.autograd.grad(out, leaves, dout))
    for first, again in zip(*runs):
        assert torch.equal(first, again)


@pytest.mark.parametrize(
    "backend",
    [
        "aot_eager",
        pytest.param("inductor", marks=pytest.mark.skipif(not has_triton(), reason="no triton")),
    ],
)
def test_compiled_training_step(attn_family, backend):
    """torch.compile(fullgraph=True) of forward and backward runs the samattn kernels and
    matches eager (the loss around it may be fused differently by inductor)."""
    torch._dynamo.reset()
    q, k, v = make_qkv(2, 129, 129, 8, 2, 64, last_dtype(attn_family))

    def loss_fn(q, k, v):
        out = samattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
        return (out.float() ** 2).sum()

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        fn(*leaves).backward()
        return [t.grad for t in leaves]

    with samattn.use_family(attn_family):
        eager = grads(loss_fn)
        compiled = grads(torch.compile(loss_fn, fullgraph=True, backend=backend))
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)  # inductor may fuse differently


def test_backward_in_a_cuda_graph(attn_family):
    from gpu_checks import capture_graph

    q, k, v = make_qkv(2, 100, 120, 4, 2, 64, torch.float16)
    dout = randn(2, 100, 4, 64, dtype=torch.float16)
    out, lse, _ = samattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    args = (dout, q, k, v, out, lse, None, None, 0, 0, 0.125, True, -1, -1, 0.0, True)
    with samattn.use_family(attn_family):
        expected = torch.ops.samattn.flash_attn_backward(*args)
        graph, grads = capture_graph(lambda: torch.ops.samattn.flash_attn_backward(*args))
    for g in grads:
        g.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(grads, expected):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [37, 40, 64, 128])
@pytest.mark.parametrize("hk", [4, 2], ids=["MHA", "GQA"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_c_abi_backward_writes_every_gradient_and_nothing_else(attn_family, dtype, d, hk,
                                                              causal):  # fmt: skip
    need_dtype(attn_family, dtype)
    b, sq, sk, h = 2, 130, 70, 4
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype)
    dout = randn(b, sq, h, d, dtype=dtype)
    with samattn.use_family(attn_family):
        out, lse, _ = samattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    # Gradients with padded rows and heads inside NaN buffers.
    pad = d + 8
    dq = Guarded((b, sq, h, d), (sq * h * pad, h * pad, pad, 1), dtype)
    dk = Guarded((b, sk, hk, d), (sk * hk * pad + 8, hk * pad, pad, 1), dtype)
    dv = Guarded((b, sk, hk, d), (sk * (hk + 1) * d, (hk + 1) * d, d, 1), dtype)
    args = _lib.AttentionArgs(
        dtype=_lib.F16 if dtype == torch.float16 else _lib.BF16,
        family=_lib.FAMILY_CODES[attn_family],
        device=torch.cuda.current_device(),
        causal=int(causal),
        batch=b, nheads=h, nheads_k=hk, seqlen_q=sq, seqlen_k=sk, headdim=d,
        softmax_scale=d**-0.5, window_left=-1, window_right=-1,
        stream=torch.cuda.current_stream().cuda_stream,
    )  # fmt: skip
    tensors = dict(q=q, k=k, v=v, o=out, dout=dout, dq=dq.view, dk=dk.view, dv=dv.view)
    assert _lib.FAMILY_NAMES[run_c_backward(args, tensors, lse)] in forced_runs(attn_family)
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
        g.assert_no_stray_writes(name)
    mask = allowed_keys(sq, sk, causal, (-1, -1))
    check_grads((dq.view, dk.view, dv.view), q, k, v, dout, scale=d**-0.5, softcap=0.0,
                mask=mask, what="c abi backward")  # fmt: skip
