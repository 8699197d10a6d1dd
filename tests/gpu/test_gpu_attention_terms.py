"""ALiBi slopes and attention sinks on the GPU, forward and backward, against float64
references (the issue "Attention without holes").

The reference (`reference`) is test_gpu_attention's attention with the two terms written
out: ALiBi adds ``-slope * |i + seqlen_k - seqlen_q - j|`` to the scaled (and softcapped)
score of query i and key j, per batch entry and query head, bottom-right aligned with the
sequence's own lengths (flash-attn's documented bias, also in softmax_lse); a sink is one
more column of every score row, holding sinks[h], whose value is zero, dropped after the
softmax. So lse includes the sink, and a row that sees no key gets out = 0 and lse =
sinks[h] (+inf without sinks). Gradients (dq, dk, dv, dsinks) are torch autograd of the same
reference in float64; the slopes get no gradient.

Accuracy rule (gpu_checks.assert_close_to_reference): samattn's error against the float64
reference at most twice that of the same computation by torch in the input dtype (scores,
bias, sink column, softmax and P @ V rounded to fp16/bf16; the sinks' gradient by autograd
in that dtype), plus one output rounding. Rows that see no key are checked exactly.

Each test runs with the sm80 and sm75 families forced (sm75: fp16; its backward stops at
head dim 192), and the KV-cache tests with automatic selection too. The kernels run the
score terms on 16-byte vectors: head dims that are multiples of 8 (40 and 72 included);
other head dims are either refused with samattn.UnsupportedError or right
(test_odd_head_dim_is_refused_or_right).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from attention_checks import (
    FEATURES,
    Case,
    Guarded,
    alibi_slopes,
    check_caches,
    last_dtype,
    make_problem,
    make_qkv,
    make_sinks,
    need_backward,
    need_dtype,
    run_c_backward,
)
from gpu_checks import (
    DEVICE,
    UNIT_ROUNDOFF,
    assert_close_to_reference,
    assert_cuda_healthy,
    call_forced,
    capture_graph,
    forced_runs,
    has_triton,
    need_family,
    poison_allocator,
    randn,
)
from reference import (
    allowed_keys,
    attention_with_terms,
    attention_with_terms_grads,
    empty_rows,
    slopes_of,
)

import samattn
from samattn import _lib

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
DTYPES = {"f16": F16, "bf16": BF16}


@pytest.fixture(params=["sm80", "sm75"])
def attn_family(request) -> str:
    need_family(request.param)
    return request.param


# ------------------------------------------------------------ the terms ----


TERMS = {
    # name: (alibi kind, sinks)
    "alibi": ("head", False),
    "alibi per batch": ("batch", False),
    "sinks": ("none", True),
    "alibi and sinks": ("batch", True),
}
# The large matrices: per-head slopes alone, sinks alone, both (per-batch slopes).
MAIN_TERMS = ["alibi", "sinks", "alibi and sinks"]


# ------------------------------------------------------------ reference ----


def check_forward(out, lse, q, k, v, *, scale, softcap, mask, alibi, sinks, what):
    """The accuracy rule for out (b, sq, h, d) and lse (b, h, sq); rows that see no key
    exactly: out 0, lse the sink (or +inf)."""
    terms = dict(scale=scale, softcap=softcap, mask=mask, alibi=alibi, sinks=sinks)
    ref_out, ref_lse = attention_with_terms(q, k, v, dtype=torch.float64, **terms)
    base_out, base_lse = attention_with_terms(q, k, v, dtype=q.dtype, **terms)
    floor = 0.5 * UNIT_ROUNDOFF[q.dtype]
    assert_close_to_reference(out, ref_out, base_out, floor, f"{what}: out")
    assert_close_to_reference(lse, ref_lse, base_lse, 1e-6, f"{what}: lse")
    empty = empty_rows(mask, q.shape[1], k.shape[1])
    assert torch.all(out[:, empty] == 0), f"{what}: rows with nothing to attend are not 0"
    got = lse[:, :, empty]
    want = torch.full_like(got, math.inf) if sinks is None else sinks[None, :, None].expand_as(got)
    # The kernels carry the sink in base 2 (sink * log2 e): equal to fp32's rounding of that.
    torch.testing.assert_close(
        got, want, rtol=1e-6, atol=0, msg=f"{what}: lse of the rows with nothing to attend"
    )


def check_backward(grads, q, k, v, dout, *, what, sinks=None, **terms):
    """The accuracy rule for (dq, dk, dv, dsinks) against float64 autograd (of the backward
    from the output as stored, see reference_grads), torch's own
    autograd in the input dtype as the baseline; the floor one rounding of the gradient,
    relative to the largest gradient of q, k, v (dq is computed from terms that size).
    grads[3] None with sinks: dsinks is the caller's to check (a sum over sequences);
    returns the (reference, baseline) sinks' gradients, float64, or (None, None)."""
    ref = attention_with_terms_grads(q, k, v, dout, dtype=torch.float64, sinks=sinks,
                          stored_dtype=q.dtype, **terms)  # fmt: skip
    base = attention_with_terms_grads(q, k, v, dout, dtype=q.dtype, sinks=sinks, **terms)
    floor = UNIT_ROUNDOFF[q.dtype]
    magnitude = max(r.abs().max().item() if r.numel() else 0.0 for r in ref[:3])
    for name, got, r, b, like in zip(("dq", "dk", "dv"), grads, ref, base, (q, k, v)):
        assert got.shape == like.shape and got.dtype == like.dtype, f"{what}: {name} metadata"
        assert_close_to_reference(got, r, b, floor, f"{what}: {name}", magnitude=magnitude)
    if sinks is None:
        assert grads[3] is None, f"{what}: a sinks gradient without sinks"
        return None, None
    if grads[3] is not None:
        dsinks = grads[3]
        assert dsinks.shape == sinks.shape and dsinks.dtype == F32, f"{what}: dsinks metadata"
        assert_close_to_reference(dsinks, ref[3], base[3].double(), floor, f"{what}: dsinks")
    return ref[3], base[3].double()


# ----------------------------------------------------------- fixed length ----
def check_fixed(family, b, sq, sk, h, hk, d, dtype, *, alibi_kind="none", with_sinks=False,
                causal=False, window=(-1, -1), softcap=0.0, grads=False,
                deterministic=False, softmax_scale=None):  # fmt: skip
    """flash_attn_func with the terms, forward (out, lse) and with `grads` the backward
    (dq, dk, dv, dsinks), against the reference."""
    need_dtype(family, dtype)
    what = (
        f"{family} {dtype} b{b} sq{sq} sk{sk} h{h}/{hk} d{d} alibi:{alibi_kind} "
        f"sinks:{with_sinks} causal{causal} w{window} cap{softcap} scale{softmax_scale}"
    )
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype, scale=3.0 if softcap else 1.0)
    alibi = alibi_slopes(alibi_kind, b, h)
    sinks = make_sinks(h) if with_sinks else None
    options = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=alibi,
                   softmax_scale=softmax_scale)  # fmt: skip
    mask = allowed_keys(sq, sk, causal, window)
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    terms = dict(scale=scale, softcap=softcap, mask=mask, alibi=alibi)

    poison_allocator((b, sq, h, d), dtype)
    poison_allocator((b, h, sq), F32)
    out, lse, _ = call_forced(
        family,
        lambda: samattn.flash_attn_func(q, k, v, sinks=sinks, return_attn_probs=True, **options),
        may_launch_nothing=q.numel() == 0,
    )
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (b, h, sq)
    check_forward(out, lse, q, k, v, sinks=sinks, what=what, **terms)
    if not grads:
        return
    need_backward(family, d)  # after the forward's check
    dout = randn(b, sq, h, d, dtype=dtype)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    sink_leaf = None if sinks is None else sinks.detach().clone().requires_grad_(True)
    for t in leaves:
        poison_allocator(t.shape, t.dtype)
    with samattn.use_family(family):
        out = samattn.flash_attn_func(
            *leaves, sinks=sink_leaf, deterministic=deterministic, **options
        )
        inputs = leaves + ([sink_leaf] if sink_leaf is not None else [])
        got = torch.autograd.grad(out, inputs, dout)
    assert _lib.last_family() == family, f"{what}: the backward ran {_lib.last_family()}"
    got = (*got[:3], got[3] if sink_leaf is not None else None)
    check_backward(got, q, k, v, dout, sinks=sinks, what=f"grad {what}", **terms)


# test_gpu_attention's features, and none.
TERM_FEATURES = {"plain": {}, **FEATURES}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq, sk", [(113, 203), (203, 113), (1, 300)], ids=str)
@pytest.mark.parametrize("terms", MAIN_TERMS)
@pytest.mark.parametrize("feature", TERM_FEATURES)
def test_features(attn_family, dtype, d, sq, sk, terms, feature):
    options = dict(TERM_FEATURES[feature])
    hk = options.pop("hk", 8)
    alibi_kind, with_sinks = TERMS[terms]
    check_fixed(attn_family, 2, sq, sk, 8, hk, d, dtype, alibi_kind=alibi_kind,
                with_sinks=with_sinks, **options)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq, sk", [(113, 203), (203, 113)], ids=str)
@pytest.mark.parametrize("terms", MAIN_TERMS)
@pytest.mark.parametrize("feature", ["plain", "causal", "window", "softcap", "GQA", "everything"])
def test_grad_features(attn_family, dtype, d, sq, sk, terms, feature):
    options = dict(TERM_FEATURES[feature])
    hk = options.pop("hk", 8)
    alibi_kind, with_sinks = TERMS[terms]
    check_fixed(attn_family, 2, sq, sk, 8, hk, d, dtype, alibi_kind=alibi_kind,
                with_sinks=with_sinks, grads=True, **options)  # fmt: skip


# Multiples of 8 (16-byte rows), the padded ones (40, 72 run in the 64 and 96 kernels).
HEAD_DIMS = [8, 32, 40, 64, 72, 96, 128, 160, 192, 256]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_head_dims(attn_family, dtype, d, causal):
    check_fixed(attn_family, 2, 113, 203, 4, 2, d, dtype, alibi_kind="batch", with_sinks=True,
                causal=causal, grads=True)  # fmt: skip


@pytest.mark.parametrize(
    "alibi_kind", ["head", "batch", "batch view", "broadcast", "negative"]
)  # fmt: skip
def test_slope_layouts(attn_family, alibi_kind):
    """Per-head and per-batch slopes, a strided (batch, nheads) view read in place, slopes
    broadcast over the batch (stride 0), slopes of both signs: forward and backward."""
    check_fixed(attn_family, 3, 77, 130, 4, 2, 64, last_dtype(attn_family),
                alibi_kind=alibi_kind, causal=True, grads=True)  # fmt: skip


@pytest.mark.parametrize("forced", ["sm90", "sm80", "sm75"])
@pytest.mark.parametrize("softcap", [0.0, 5.0], ids=["nocap", "cap"])
@pytest.mark.parametrize("scale", [0.0, 2.0**-20, -0.3, 2.5], ids=["zero", "tiny", "neg", "big"])
def test_alibi_whatever_the_scale(forced, softcap, scale):
    """The kernels add ALiBi to the unscaled scores (the slope divided by the scale) where
    the scale can be inverted, else to scores they scaled first: both ways, forward and
    backward, with and without softcap (sm90's backward declines ALiBi with softcap)."""
    need_family(forced)
    check_fixed(forced, 2, 77, 130, 4, 2, 64, last_dtype(forced), alibi_kind="negative",
                softcap=softcap, grads=forced != "sm90" or softcap == 0.0,
                softmax_scale=scale)  # fmt: skip


LENGTHS = [(1, 1), (17, 17), (1000, 1000), (4099, 4099), (1, 4099), (4099, 17), (17, 1000)]


@pytest.mark.parametrize("sq, sk", LENGTHS, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_lengths(attn_family, sq, sk, causal):
    """Long distances (large biases) and decode shapes (split keys in the library)."""
    b, h = (1, 2) if max(sq, sk) > 2000 else (2, 4)
    check_fixed(attn_family, b, sq, sk, h, h, 128, last_dtype(attn_family),
                alibi_kind="head", with_sinks=True, causal=causal,
                grads=max(sq, sk) <= 1000)  # fmt: skip


def test_odd_head_dim_is_refused_or_right(attn_family):
    """Head dims that are not multiples of 8 have no 16-byte rows, which the kernels with
    score terms need: either a clear refusal, or right."""
    dtype = last_dtype(attn_family)
    q, k, v = make_qkv(2, 33, 50, 4, 2, 37, dtype)
    sinks = make_sinks(4)
    try:
        with samattn.use_family(attn_family):
            out, lse, _ = samattn.flash_attn_func(
                q, k, v, causal=True, sinks=sinks, return_attn_probs=True
            )
    except samattn.UnsupportedError as error:
        assert "16-byte vectors" in str(error) and attn_family in str(error), str(error)
        assert_cuda_healthy()
        return
    mask = allowed_keys(33, 50, True, (-1, -1))
    check_forward(out, lse, q, k, v, scale=37**-0.5, softcap=0.0, mask=mask, alibi=None,
                  sinks=sinks, what="d37")  # fmt: skip


# ------------------------------------------------ rows that see no key ----
@pytest.mark.parametrize("terms", TERMS)
def test_rows_with_nothing_to_attend(attn_family, terms):
    """Causal with more queries than keys (the first sq - sk rows see nothing), a window
    that leaves rows empty, and no keys at all: out 0 and lse the sink (+inf without),
    forward and backward (such rows add nothing to the gradients, dsinks included)."""
    alibi_kind, with_sinks = TERMS[terms]
    dtype = last_dtype(attn_family)
    check_fixed(attn_family, 2, 50, 20, 4, 4, 64, dtype, alibi_kind=alibi_kind,
                with_sinks=with_sinks, causal=True, grads=True)  # fmt: skip
    check_fixed(attn_family, 2, 64, 16, 4, 2, 64, dtype, alibi_kind=alibi_kind,
                with_sinks=with_sinks, window=(20, 40), grads=True)  # fmt: skip
    check_fixed(attn_family, 2, 7, 0, 4, 4, 64, dtype, alibi_kind=alibi_kind,
                with_sinks=with_sinks)  # fmt: skip


def test_sinks_only_row_values(attn_family):
    """The exact values of an empty row: out == 0 and lse == sinks[h], bit for bit."""
    q, k, v = make_qkv(2, 40, 10, 4, 4, 64, last_dtype(attn_family))
    sinks = torch.tensor([-3.0, 0.0, 1.5, 40.0], device=DEVICE)
    with samattn.use_family(attn_family):
        out, lse, _ = samattn.flash_attn_func(
            q, k, v, causal=True, sinks=sinks, return_attn_probs=True
        )
    assert torch.all(out[:, :30] == 0)
    assert torch.equal(lse[:, :, :30], sinks[None, :, None].expand(2, 4, 30))
    # The other rows: the sink (a large one dominates) in their denominator.
    assert torch.all(lse[:, 3, 30:] >= 40.0) and torch.isfinite(out).all()


# ---------------------------------------------------------------- varlen ----
VARLEN_BATCHES = {
    "mixed": ([0, 1, 17, 300, 1000, 5], [5, 1, 17, 300, 999, 0]),
    "more queries": ([113, 1, 64], [17, 1, 3]),
    "more keys": ([17, 1, 3], [203, 1, 64]),
    "all empty": ([0, 0], [0, 7]),
    "no keys": ([3, 5], [0, 0]),
}


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("batch", VARLEN_BATCHES)
@pytest.mark.parametrize("terms", MAIN_TERMS)
@pytest.mark.parametrize("feature", ["plain", "causal", "window", "softcap", "GQA"])
def test_varlen(attn_family, dtype, d, batch, terms, feature):
    """Each sequence's own lengths in the bias and the masks, its own slopes (batch =
    sequences); lengths 0 and 1; forward and backward, the sinks' gradient summed over
    every sequence; a spare row after the packed rows gets gradient 0."""
    need_dtype(attn_family, dtype)
    lens_q, lens_k = VARLEN_BATCHES[batch]
    alibi_kind, with_sinks = TERMS[terms]
    b, h = len(lens_q), 4
    hk = 2 if feature == "GQA" else h
    causal = feature == "causal"
    window = (24, 8) if feature == "window" else (-1, -1)
    softcap = 25.0 if feature == "softcap" else 0.0
    big = 3.0 if softcap else 1.0
    total_q, total_k = sum(lens_q) + 1, sum(lens_k) + 1
    q = randn(total_q, h, d, dtype=dtype, scale=big)
    k = randn(total_k, hk, d, dtype=dtype, scale=big)
    v = randn(total_k, hk, d, dtype=dtype)
    dout = randn(total_q, h, d, dtype=dtype)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    alibi = alibi_slopes(alibi_kind, b, h)
    sinks = make_sinks(h) if with_sinks else None
    max_q, max_k = max(lens_q), max(lens_k)

    def forward(q, k, v, sinks, **extra):
        return samattn.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, window_size=window,
            softcap=softcap, alibi_slopes=alibi, sinks=sinks, **extra,
        )  # fmt: skip

    poison_allocator(q.shape, dtype)
    out, lse, _ = call_forced(
        attn_family,
        lambda: forward(q, k, v, sinks, return_attn_probs=True),
        may_launch_nothing=max_q == 0,
    )
    assert out.shape == q.shape and lse.shape == (h, total_q)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    sink_leaf = None if sinks is None else sinks.detach().clone().requires_grad_(True)
    inputs = leaves + ([sink_leaf] if sink_leaf is not None else [])
    with samattn.use_family(attn_family):
        grads = torch.autograd.grad(forward(*leaves, sink_leaf), inputs, dout)
    dq, dk, dv = grads[:3]
    assert torch.all(dq[-1] == 0) and torch.all(dk[-1] == 0) and torch.all(dv[-1] == 0)
    ref_dsinks = base_dsinks = 0.0
    for i, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        rk = slice(int(cu_k[i]), int(cu_k[i + 1]))
        if sq == 0:
            assert torch.all(dk[rk] == 0) and torch.all(dv[rk] == 0), f"sequence {i}"
            continue
        what = f"{attn_family} {batch} sequence {i} ({sq}x{sk}) {terms} {feature} {dtype} d{d}"
        seq = dict(
            scale=d**-0.5, softcap=softcap, mask=allowed_keys(sq, sk, causal, window),
            alibi=slopes_of(alibi, i),
        )  # fmt: skip
        args = (q[rq][None], k[rk][None], v[rk][None])
        check_forward(out[rq][None], lse[:, rq][None], *args, sinks=sinks, what=what, **seq)
        if sk == 0:  # nothing to attend: zero gradients, nothing into the sinks
            assert torch.all(dq[rq] == 0), f"{what}: dq"
            continue
        # dsinks sums every sequence's rows: checked below, as the sum.
        mine = (dq[rq][None], dk[rk][None], dv[rk][None], None)
        ref, base = check_backward(mine, *args, dout[rq][None], sinks=sinks, what=f"grad {what}",
                                   **seq)  # fmt: skip
        if sinks is not None:
            ref_dsinks, base_dsinks = ref_dsinks + ref, base_dsinks + base
    if sinks is not None:
        dsinks = grads[3]
        assert dsinks.shape == (h,) and dsinks.dtype == F32
        if not isinstance(ref_dsinks, torch.Tensor):  # no row attends a key
            assert torch.all(dsinks == 0), f"{batch}: dsinks"
        else:
            assert_close_to_reference(dsinks, ref_dsinks, base_dsinks, UNIT_ROUNDOFF[dtype],
                                      f"{batch} {terms} {feature}: dsinks")  # fmt: skip


def test_packed_variants_take_the_terms(attn_family):
    """qkvpacked, kvpacked and their varlen forms: the terms reach the kernels as with
    flash_attn_func (the same bits)."""
    b, s, h, d = 2, 65, 4, 64
    qkv = randn(b, s, 3, h, d, dtype=last_dtype(attn_family))
    q, k, v = qkv.unbind(2)
    terms = dict(alibi_slopes=alibi_slopes("batch", b, h), sinks=make_sinks(h), causal=True)
    with samattn.use_family(attn_family):
        expected = samattn.flash_attn_func(q, k, v, **terms)
        assert torch.equal(samattn.flash_attn_qkvpacked_func(qkv, **terms), expected)
        kv = torch.stack([k, v], dim=2)
        assert torch.equal(samattn.flash_attn_kvpacked_func(q, kv, **terms), expected)
        cu = torch.tensor([0, s, 2 * s], dtype=torch.int32, device=DEVICE)
        out = samattn.flash_attn_varlen_qkvpacked_func(qkv.flatten(0, 1), cu, s, **terms)
        assert torch.equal(out, expected.flatten(0, 1))
        out = samattn.flash_attn_varlen_kvpacked_func(
            q.flatten(0, 1), kv.flatten(0, 1), cu, cu, s, s, **terms
        )
        assert torch.equal(out, expected.flatten(0, 1))


# -------------------------------------------------------- determinism ----
DETERMINISTIC_CASES = {
    "GQA causal alibi sinks": dict(
        b=2, sq=1000, sk=1000, h=8, hk=2, d=128, causal=True, alibi="batch"
    ),
    "MQA window sinks": dict(
        b=1, sq=777, sk=1500, h=4, hk=1, d=64, window_size=(200, 50), alibi="none"
    ),
    "softcap alibi sinks": dict(b=1, sq=600, sk=600, h=4, hk=4, d=128, softcap=20.0, alibi="head"),
}


@pytest.mark.parametrize("case", DETERMINISTIC_CASES)
def test_deterministic_backward_is_bit_identical(attn_family, case):
    """deterministic=True: dq, dk, dv and dsinks bit-identical run to run. dsinks is
    summed in a fixed order in either mode (samattn.h), so bit-identical without it too."""
    check_deterministic(attn_family, case)


@pytest.mark.parametrize("case", DETERMINISTIC_CASES)
def test_sm90_deterministic_backward_is_bit_identical(case):
    """The same on sm90 forced (ALiBi and sinks run its own backward; softcap with ALiBi
    is handed to sm80's)."""
    need_family("sm90")
    check_deterministic("sm90", case)


def check_deterministic(attn_family: str, case: str) -> None:
    c = dict(DETERMINISTIC_CASES[case])
    b, sq, sk, h, hk, d = (c.pop(name) for name in ("b", "sq", "sk", "h", "hk", "d"))
    alibi = alibi_slopes(c.pop("alibi"), b, h)
    dtype = last_dtype(attn_family)
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype)
    dout = randn(b, sq, h, d, dtype=dtype)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    sinks = make_sinks(h).requires_grad_(True)

    def grads(deterministic: bool):
        out = samattn.flash_attn_func(
            *leaves, alibi_slopes=alibi, sinks=sinks, deterministic=deterministic, **c
        )
        return torch.autograd.grad(out, [*leaves, sinks], dout)

    with samattn.use_family(attn_family):
        runs = [grads(True) for _ in range(3)]
        atomic = [grads(False) for _ in range(2)]
    for run in runs[1:]:
        for name, first, again in zip(("dq", "dk", "dv", "dsinks"), runs[0], run):
            assert torch.equal(first, again), f"{case}: {name} differs between runs"
    assert torch.equal(atomic[0][3], atomic[1][3]), f"{case}: dsinks differs between runs"
    for first, other in zip(runs[0], atomic[0]):
        torch.testing.assert_close(first.float(), other.float(), rtol=2e-2, atol=2e-2)


def test_deterministic_varlen(attn_family):
    lens = [300, 1, 0, 517]
    cu = _cu(lens)
    total = sum(lens)
    q, k, v = (randn(total, hk, 64, dtype=F16) for hk in (8, 2, 2))
    dout = randn(total, 8, 64, dtype=F16)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    sinks = make_sinks(8).requires_grad_(True)
    alibi = alibi_slopes("batch", len(lens), 8)
    runs = []
    with samattn.use_family(attn_family):
        for _ in range(2):
            out = samattn.flash_attn_varlen_func(
                *leaves, cu, cu, max(lens), max(lens), causal=True, deterministic=True,
                alibi_slopes=alibi, sinks=sinks,
            )  # fmt: skip
            runs.append(torch.autograd.grad(out, [*leaves, sinks], dout))
    for first, again in zip(*runs):
        assert torch.equal(first, again)


# ------------------------------------------------------ gradient wiring ----
def test_sinks_gradient_only_when_asked(attn_family):
    """sinks without requires_grad: the backward computes no dsinks and dq, dk, dv are the
    same bits as with it (they do not depend on the sinks); sinks alone requiring grad:
    only dsinks."""
    dtype = last_dtype(attn_family)
    q, k, v = make_qkv(2, 90, 130, 4, 2, 64, dtype)
    dout = randn(2, 90, 4, 64, dtype=dtype)
    sinks = make_sinks(4)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    sink_leaf = sinks.clone().requires_grad_(True)
    with samattn.use_family(attn_family):
        out = samattn.flash_attn_func(*leaves, causal=True, sinks=sinks, deterministic=True)
        without = torch.autograd.grad(out, leaves, dout)
        out = samattn.flash_attn_func(*leaves, causal=True, sinks=sink_leaf, deterministic=True)
        with_sinks = torch.autograd.grad(out, [*leaves, sink_leaf], dout)
        out = samattn.flash_attn_func(q, k, v, causal=True, sinks=sink_leaf)
        (alone,) = torch.autograd.grad(out, [sink_leaf], dout)
    for a, b in zip(without, with_sinks[:3]):
        assert torch.equal(a, b)
    torch.testing.assert_close(alone, with_sinks[3], rtol=1e-6, atol=1e-6)


def assert_dsinks_formula(dsinks, dout, out, lse, sinks, what):
    """dsinks[h] = -sum over every batch entry and query row of exp(sinks[h] - lse) *
    rowsum(dout * out), from the forward's (rounded) out and lse, as the library computes
    it: within fp32 summation error of the terms' magnitudes."""
    products = (dout.double() * out.double()).transpose(1, 2)  # (b, h, sq, d)
    weights = torch.exp(sinks.double()[None, :, None] - lse.double())
    error = (dsinks.double() + (weights * products.sum(-1)).sum((0, 2))).abs()
    # fp32 sums of d products per row, then of the rows: relative to the magnitudes summed.
    bound = 1e-4 * (weights * products.abs().sum(-1)).sum((0, 2)) + 1e-6
    assert torch.all(error <= bound), f"{what}: dsinks {dsinks.tolist()}, error {error.tolist()}"


def test_backward_op_returns_dsinks(attn_family):
    """torch.ops.samattn.flash_attn_backward: dsinks (nheads,) with sinks, empty without;
    dsinks = -sum over rows of exp(sink - lse) * rowsum(dout * out)."""
    dtype = last_dtype(attn_family)
    q, k, v = make_qkv(2, 100, 120, 4, 2, 64, dtype)
    dout = randn(2, 100, 4, 64, dtype=dtype)
    sinks, alibi = make_sinks(4), alibi_slopes("batch", 2, 4)
    with samattn.use_family(attn_family):
        out, lse, _ = samattn.flash_attn_func(
            q, k, v, causal=True, alibi_slopes=alibi, sinks=sinks, return_attn_probs=True
        )
        args = (dout, q, k, v, out, lse, None, None, 0, 0, 0.125, True, -1, -1, 0.0, True)
        *_, dsinks = torch.ops.samattn.flash_attn_backward(*args, alibi, sinks)
        *_, no_sinks = torch.ops.samattn.flash_attn_backward(*args, alibi, None)
    assert no_sinks.shape == (0,) and dsinks.shape == (4,) and dsinks.dtype == F32
    assert_dsinks_formula(dsinks, dout, out, lse, sinks, "backward op")


# ------------------------------------------------------- KV cache, decode ----
KV_CASES = {
    # name: (layout, append, num_splits, seqlen_q, causal)
    "contiguous append, no split": ("contiguous", True, 1, 1, True),
    "contiguous, split 3": ("contiguous", False, 3, 1, False),
    "contiguous append, split 8, 4 queries": ("contiguous", True, 8, 4, True),
    "leftpad, chosen splits": ("leftpad", True, 0, 2, True),
    "batch_idx, split 5": ("batch_idx", True, 5, 1, True),
    "paged16, no split": ("paged16", True, 1, 1, True),
    "paged64, split 4, 7 queries": ("paged64", True, 4, 7, True),
    "paged256, chosen splits": ("paged256", False, 0, 1, False),
}


@pytest.fixture(params=["sm90", "sm80", "sm75", "auto"])
def kv_family(request) -> str:
    if request.param != "auto":
        need_family(request.param)
    return request.param


@pytest.mark.parametrize("case", KV_CASES)
@pytest.mark.parametrize("terms", TERMS)
def test_kvcache(kv_family, case, terms):
    """flash_attn_with_kvcache with the terms: each sequence's keys are its cache rows in
    use plus the new ones (from cache_leftpad), the bias bottom-right aligned to that
    count; split-KV (num_splits 1, several, chosen) combines the sinks once."""
    layout, append, splits, sq, causal = KV_CASES[case]
    alibi_kind, with_sinks = TERMS[terms]
    dtype = BF16 if kv_family != "sm75" else F16
    mask_kind = "causal" if causal else "none"
    kv_case = Case(dtype, 3, sq, 8, 2, 128, layout, append, "none", mask_kind, 0.0, splits)
    p = make_problem(kv_case, dtype, seed=len(case) * 7 + len(terms), capacity=700)
    alibi = alibi_slopes(alibi_kind, 3, 8)
    sinks = make_sinks(8) if with_sinks else None
    k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()
    poison_allocator(p.q.shape, dtype)

    def call():
        return samattn.flash_attn_with_kvcache(
            p.q, k_cache, v_cache, alibi_slopes=alibi, sinks=sinks, return_softmax_lse=True,
            **p.kwargs(),
        )  # fmt: skip

    if kv_family == "auto":
        out, lse = call()
    else:  # sm90 runs the cases whose keys split 2 to 16 ways, sm80 the others
        out, lse = call_forced(kv_family, call, expected=forced_runs(kv_family))
    what = f"{kv_family} {case} {terms}"
    check_caches(p, k_cache, v_cache, what)
    new = sq if append else 0
    for b in range(3):
        end = p.lengths[b] + new
        first = 0 if p.leftpad is None else p.leftpad[b]
        seq, row = p.rows(b, end)
        keys, values = k_cache[seq, row][first:], v_cache[seq, row][first:]
        check_forward(
            out[b : b + 1], lse[b : b + 1], p.q[b : b + 1], keys[None], values[None],
            scale=128**-0.5, softcap=0.0, mask=allowed_keys(sq, keys.shape[0], causal, (-1, -1)),
            alibi=slopes_of(alibi, b), sinks=sinks, what=f"{what} sequence {b}",
        )  # fmt: skip


def test_num_splits_agree_with_terms(kv_family):
    """One long-cache decode problem, every forced split count, with ALiBi and sinks: all
    within the rule, and within rounding of each other (the sink joins the combined
    denominator once, whatever the split)."""
    dtype = BF16 if kv_family != "sm75" else F16
    alibi, sinks = alibi_slopes("batch", 2, 8), make_sinks(8)
    outs = []
    for splits in (1, 2, 3, 7, 16):
        case = Case(dtype, 2, 1, 8, 2, 128, "contiguous", False, "none", "none", 0.0, splits)
        p = make_problem(case, dtype, seed=77, capacity=6000)
        with samattn.use_family(None if kv_family == "auto" else kv_family):
            out, lse = samattn.flash_attn_with_kvcache(
                p.q, p.k_cache, p.v_cache, alibi_slopes=alibi, sinks=sinks,
                return_softmax_lse=True, **p.kwargs(),
            )  # fmt: skip
        for b in range(2):
            keys, values = p.k_cache[b, : p.lengths[b]], p.v_cache[b, : p.lengths[b]]
            check_forward(
                out[b : b + 1], lse[b : b + 1], p.q[b : b + 1], keys[None], values[None],
                scale=128**-0.5, softcap=0.0, mask=None, alibi=alibi[b], sinks=sinks,
                what=f"splits {splits} sequence {b}",
            )  # fmt: skip
        outs.append(out.float())
    for other in outs[1:]:
        torch.testing.assert_close(other, outs[0], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("splits", [2, 5, 8, 13])
def test_sm90_cluster_combine_with_terms(splits):
    """The sm90 kvcache kernel with ALiBi and sinks, its splits combined in a cluster: the
    sink joins the combined denominator once; an empty sequence gets out 0 and LSE the
    sink."""
    need_family("sm90")
    alibi, sinks = alibi_slopes("batch", 3, 8), make_sinks(8)
    case = Case(BF16, 3, 2, 8, 2, 128, "contiguous", False, "none", "causal", 0.0, splits)
    p = make_problem(case, BF16, seed=splits, capacity=2000)
    p.lengths = [0, 5, 2000]

    def call():
        return samattn.flash_attn_with_kvcache(
            p.q, p.k_cache, p.v_cache, alibi_slopes=alibi, sinks=sinks,
            return_softmax_lse=True, **p.kwargs(),
        )  # fmt: skip

    out, lse = call_forced("sm90", call, expected="sm90")
    for b in range(3):
        keys, values = p.k_cache[b, : p.lengths[b]], p.v_cache[b, : p.lengths[b]]
        check_forward(
            out[b : b + 1], lse[b : b + 1], p.q[b : b + 1], keys[None], values[None],
            scale=128**-0.5, softcap=0.0, mask=allowed_keys(2, keys.shape[0], True, (-1, -1)),
            alibi=slopes_of(alibi, b), sinks=sinks, what=f"sm90 splits {splits} sequence {b}",
        )  # fmt: skip


@pytest.mark.parametrize("terms", TERMS)
def test_paged_prefill(attn_family, terms):
    """flash_attn_varlen_func with a block_table: each sequence's keys in its pages, its
    own lengths in the bias."""
    alibi_kind, with_sinks = TERMS[terms]
    dtype = last_dtype(attn_family)
    lens_q, lens_k, page, h, hk, d = [5, 1, 64, 0], [5, 40, 300, 7], 16, 4, 2, 128
    b = len(lens_q)
    width = max(-(-n // page) for n in lens_k) + 1
    num_blocks = b * width + 2
    table = torch.randperm(num_blocks, device=DEVICE)[: b * width].view(b, width).int()
    k_cache = randn(num_blocks, page, hk, d, dtype=dtype)
    v_cache = randn(num_blocks, page, hk, d, dtype=dtype)
    q = randn(sum(lens_q), h, d, dtype=dtype)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    alibi = alibi_slopes(alibi_kind, b, h)
    sinks = make_sinks(h) if with_sinks else None
    out, lse, _ = call_forced(
        attn_family,
        lambda: samattn.flash_attn_varlen_func(
            q, k_cache, v_cache, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
            alibi_slopes=alibi, sinks=sinks, return_attn_probs=True, block_table=table,
        ),
    )  # fmt: skip
    for i, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        if sq == 0:
            continue
        j = torch.arange(sk, device=DEVICE)
        pages, rows = table[i].long()[j // page], j % page
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        check_forward(
            out[rq][None], lse[:, rq][None], q[rq][None], k_cache[pages, rows][None],
            v_cache[pages, rows][None], scale=d**-0.5, softcap=0.0,
            mask=allowed_keys(sq, sk, True, (-1, -1)), alibi=slopes_of(alibi, i), sinks=sinks,
            what=f"paged {terms} sequence {i}",
        )  # fmt: skip


# --------------------------------------------------- graphs and compile ----
def test_forward_and_backward_in_cuda_graphs(attn_family):
    """Forward with ALiBi and sinks, and the backward op with dsinks, captured and replayed
    (NaN-filled outputs first): the eager results."""
    dtype = last_dtype(attn_family)
    q, k, v = make_qkv(2, 100, 120, 4, 2, 64, dtype)
    dout = randn(2, 100, 4, 64, dtype=dtype)
    alibi, sinks = alibi_slopes("batch", 2, 4), make_sinks(4)

    def forward():
        return samattn.flash_attn_func(
            q, k, v, causal=True, alibi_slopes=alibi, sinks=sinks, return_attn_probs=True
        )[:2]

    with samattn.use_family(attn_family):
        out, lse = forward()
        args = (dout, q, k, v, out, lse, None, None, 0, 0, 0.125, True, -1, -1, 0.0, True)
        expected = torch.ops.samattn.flash_attn_backward(*args, alibi, sinks)
        forward_graph, forward_outputs = capture_graph(forward)
        backward_graph, grads = capture_graph(
            lambda: torch.ops.samattn.flash_attn_backward(*args, alibi, sinks)
        )
    for t in (*forward_outputs, *grads):
        t.fill_(math.nan)
    forward_graph.replay()
    backward_graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(forward_outputs, (out, lse)):
        assert torch.equal(a, b)
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), grads, expected):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    "backend",
    [
        "aot_eager",
        pytest.param("inductor", marks=pytest.mark.skipif(not has_triton(), reason="no triton")),
    ],
)
def test_compiled_training_step(attn_family, backend):
    """torch.compile(fullgraph=True) of a loss through flash_attn_func with ALiBi and
    learnable sinks: the gradients of q, k, v and the sinks match eager."""
    torch._dynamo.reset()
    dtype = last_dtype(attn_family)
    q, k, v = make_qkv(2, 129, 129, 8, 2, 64, dtype)
    alibi, sinks = alibi_slopes("head", 2, 8), make_sinks(8)

    def loss_fn(q, k, v, sinks):
        out = samattn.flash_attn_func(
            q, k, v, causal=True, alibi_slopes=alibi, sinks=sinks, deterministic=True
        )
        return (out.float() ** 2).sum()

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, sinks)]
        fn(*leaves).backward()
        return [t.grad for t in leaves]

    with samattn.use_family(attn_family):
        eager = grads(loss_fn)
        compiled = grads(torch.compile(loss_fn, fullgraph=True, backend=backend))
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)
    torch._dynamo.reset()


def test_compiled_decode_step_with_terms(kv_family):
    torch._dynamo.reset()
    case = Case(F16, 3, 1, 8, 2, 64, "paged64", True, "none", "causal", 0.0, 0)
    p = make_problem(case, F16, seed=9)
    kwargs = {**p.kwargs(), "alibi_slopes": alibi_slopes("batch", 3, 8), "sinks": make_sinks(8)}

    def step(q, k_cache, v_cache):
        return samattn.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs) * 1.0

    with samattn.use_family(None if kv_family == "auto" else kv_family):
        eager_k, eager_v = p.k_cache.clone(), p.v_cache.clone()
        eager = step(p.q, eager_k, eager_v)
        compiled_k, compiled_v = p.k_cache.clone(), p.v_cache.clone()
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(
            p.q, compiled_k, compiled_v
        )
    assert torch.equal(compiled_k, eager_k) and torch.equal(compiled_v, eager_v)
    torch.testing.assert_close(compiled, eager)
    torch._dynamo.reset()


# ------------------------------------------------- C ABI on guarded buffers ----
@pytest.mark.parametrize("deterministic", [0, 1])
def test_c_abi_writes_every_dsink_and_nothing_else(attn_family, deterministic):
    """The backward through the C ABI into a dsinks inside a NaN-filled buffer (no zeroing
    by the caller): every head written, nothing around it; the values the formula's."""
    dtype = last_dtype(attn_family)
    b, sq, sk, h, hk, d = 2, 130, 70, 4, 2, 64
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype)
    dout = randn(b, sq, h, d, dtype=dtype)
    sinks, alibi = make_sinks(h), alibi_slopes("batch", b, h)
    with samattn.use_family(attn_family):
        out, lse, _ = samattn.flash_attn_func(
            q, k, v, causal=True, alibi_slopes=alibi, sinks=sinks, return_attn_probs=True
        )
    dsinks = Guarded((h,), (1,), F32)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    args = _lib.AttentionArgs(
        dtype=_lib.F16 if dtype == F16 else _lib.BF16,
        family=_lib.FAMILY_CODES[attn_family],
        device=torch.cuda.current_device(),
        causal=1,
        batch=b, nheads=h, nheads_k=hk, seqlen_q=sq, seqlen_k=sk, headdim=d,
        softmax_scale=d**-0.5, window_left=-1, window_right=-1, deterministic=deterministic,
        stream=torch.cuda.current_stream().cuda_stream,
        alibi_slopes=alibi.data_ptr(), alibi_batch_stride=alibi.stride(0),
        sinks=sinks.data_ptr(), dsinks=dsinks.view.data_ptr(),
    )  # fmt: skip
    dq, dk, dv = grads
    run_c_backward(args, dict(q=q, k=k, v=v, o=out, dout=dout, dq=dq, dk=dk, dv=dv), lse)
    dsinks.assert_no_stray_writes("dsinks")
    assert torch.isfinite(dsinks.view).all(), "dsinks not written"
    assert_dsinks_formula(dsinks.view, dout, out, lse, sinks, "c abi")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq, sk", [(113, 203), (203, 113), (300, 1000)], ids=str)
@pytest.mark.parametrize("terms", MAIN_TERMS)
@pytest.mark.parametrize("feature", TERM_FEATURES)
def test_sm90_runs_the_terms(dtype, d, sq, sk, terms, feature):
    """The sm90 forward's kernel with ALiBi and sinks, forced (check_fixed asserts that sm90
    ran it), with every feature, against the reference; prefill shapes only (decode-shaped
    calls go to sm80's split-key kernel)."""
    need_family("sm90")
    options = dict(TERM_FEATURES[feature])
    hk = options.pop("hk", 8)
    alibi_kind, with_sinks = TERMS[terms]
    check_fixed("sm90", 2, sq, sk, 8, hk, d, dtype, alibi_kind=alibi_kind,
                with_sinks=with_sinks, **options)  # fmt: skip


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sm90_alibi_long_keys(d, causal):
    """ALiBi over 4099 keys on sm90: most key tiles lie on one side of every row's diagonal
    (the bias as a per-row offset of the softmax), at d = 64 on the 128-row tile (the
    192-row one runs no ALiBi), with sinks."""
    need_family("sm90")
    check_fixed("sm90", 1, 4099, 4099, 2, 2, d, BF16, alibi_kind="head", with_sinks=True,
                causal=causal)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("terms", MAIN_TERMS)
@pytest.mark.parametrize("feature", ["plain", "causal", "window"])
def test_sm90_varlen_terms(dtype, terms, feature):
    """sm90 varlen with ALiBi (each sequence's own slopes and lengths) and sinks, forward,
    against the reference per sequence; lengths 0, 1 and sequences with no keys."""
    need_family("sm90")
    lens_q, lens_k = [0, 1, 17, 300, 1000, 5, 129], [5, 1, 17, 300, 999, 0, 700]
    alibi_kind, with_sinks = TERMS[terms]
    b, h, d = len(lens_q), 4, 128
    causal, window = feature == "causal", (24, 8) if feature == "window" else (-1, -1)
    q = randn(sum(lens_q), h, d, dtype=dtype)
    k, v = (randn(sum(lens_k), h, d, dtype=dtype) for _ in range(2))
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    alibi = alibi_slopes(alibi_kind, b, h)
    sinks = make_sinks(h) if with_sinks else None
    poison_allocator(q.shape, dtype)
    out, lse, _ = call_forced(
        "sm90",
        lambda: samattn.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, window_size=window,
            alibi_slopes=alibi, sinks=sinks, return_attn_probs=True,
        ),
    )  # fmt: skip
    for i, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        if sq == 0:
            continue
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        mask = allowed_keys(sq, sk, causal, window, norm_seqlen_k=max(lens_k))
        seq = dict(scale=d**-0.5, softcap=0.0, mask=mask, alibi=slopes_of(alibi, i))
        what = f"sm90 varlen {terms} {feature} seq {i}"
        args = (q[rq][None], k[rk][None], v[rk][None])
        check_forward(out[rq][None], lse[:, rq][None], *args, sinks=sinks, what=what, **seq)


@pytest.mark.parametrize("alibi_kind", ["head", "batch", "batch view", "broadcast", "negative"])
def test_sm90_slope_layouts(alibi_kind):
    """Per-head and per-batch slopes, strided, broadcast and negative, on sm90 with sinks."""
    need_family("sm90")
    check_fixed("sm90", 3, 277, 130, 4, 2, 128, BF16, alibi_kind=alibi_kind, with_sinks=True,
                causal=True)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("sq, sk", [(203, 113), (300, 1000)], ids=str)
@pytest.mark.parametrize("feature", TERM_FEATURES)
def test_sm90_backward_with_sinks(dtype, d, sq, sk, feature):
    """The sm90 backward with sinks, forced (check_fixed asserts that sm90 ran it): its main
    kernel is the plain one (the LSE holds the sinks) and step 1b gives their gradient."""
    need_family("sm90")
    options = dict(TERM_FEATURES[feature])
    hk = options.pop("hk", 8)
    check_fixed("sm90", 2, sq, sk, 8, hk, d, dtype, with_sinks=True, grads=True, **options)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq, sk", [(203, 113), (300, 1000)], ids=str)
@pytest.mark.parametrize("terms", ["alibi", "alibi per batch", "alibi and sinks"])
@pytest.mark.parametrize("feature", ["plain", "causal", "window", "GQA", "MQA"])
def test_sm90_backward_with_alibi(dtype, d, sq, sk, terms, feature):
    """The sm90 backward with ALiBi (per head and per batch slopes, with sinks too), forced
    (check_fixed asserts that sm90 ran it), against the reference's gradients."""
    need_family("sm90")
    options = dict(TERM_FEATURES[feature])
    hk = options.pop("hk", 8)
    alibi_kind, with_sinks = TERMS[terms]
    check_fixed("sm90", 2, sq, sk, 8, hk, d, dtype, alibi_kind=alibi_kind,
                with_sinks=with_sinks, grads=True, **options)  # fmt: skip


@pytest.mark.parametrize("alibi_kind", ["head", "batch view", "broadcast", "negative"])
def test_sm90_backward_slope_layouts(alibi_kind):
    """The sm90 backward reads strided, broadcast and negative slopes."""
    need_family("sm90")
    check_fixed("sm90", 3, 277, 130, 4, 2, 128, BF16, alibi_kind=alibi_kind, causal=True,
                grads=True)  # fmt: skip
