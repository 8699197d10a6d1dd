"""Attention masks (attn_mask) on the GPU, forward and backward, against float64 references
(the issue "Attention without holes").

The reference (`reference`) is attention with every term written out: the scaled score,
softcap, ALiBi's ``-slope * |i + seqlen_k - seqlen_q - j|``, then the mask: a bool mask
removes the pairs it holds False, an additive one is added (-inf removes); causal and the
window remove theirs; a sink is one more column of every row, dropped after the softmax.
A row left with no key gets out = 0 and lse = +inf (or its sink). The mask broadcasts to
(batch, heads, seqlen_q, seqlen_k) (query heads, also with GQA). Gradients (dq, dk, dv,
dsinks and the mask's, summed over its broadcast dims) are torch autograd of the same
reference in float64.

Accuracy rule (gpu_checks.assert_close_to_reference): samattn's error against the float64
reference at most twice that of the same computation by torch in the input dtype, plus one
rounding. Rows left with no key are checked exactly.

Each test runs with the sm80 and sm75 families forced (sm75: fp16; its backward stops at
head dim 192); the test_sm90_* tests force sm90, whose forward and backward read masks
(its backward hands an additive mask with softcap to sm80, also when forced), and the
tile-map tests (masks of whole tiles, which every family skips or runs unread) run all
three. Masks run
on 16-byte rows: head dims that are not multiples of 8 run padded with zeros by the
Python layer (test_odd_head_dims_run_padded).
"""

from __future__ import annotations

import copy
import functools
import math
import warnings

import pytest
import torch
from attention_checks import (
    SM75_BACKWARD_MAX_D,
    Guarded,
    alibi_slopes,
    last_dtype,
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
    call_forced,
    capture_graph,
    has_triton,
    need_family,
    poison_allocator,
    randn,
)
from reference import (
    allowed_keys,
    blocked_pairs,
    masked_attention,
    masked_attention_grads,
)

import samattn
from samattn import _lib

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
DTYPES = {"f16": F16, "bf16": BF16}


@pytest.fixture(params=["sm80", "sm75"])
def attn_family(request) -> str:
    need_family(request.param)
    return request.param


# ------------------------------------------------------------- inputs ----
def mask_shape(kind: str, b: int, h: int, sq: int, sk: int) -> tuple[int, ...]:
    """The shapes a mask comes in: every pair, per batch entry (broadcast over heads),
    shared by the batch, 2-D (torch's (L, S)), key padding (one row per batch entry),
    per query row (broadcast over the keys: samattn materializes the keys)."""
    return {
        "full": (b, h, sq, sk),
        "per batch": (b, 1, sq, sk),
        "shared": (1, 1, sq, sk),
        "2-D": (sq, sk),
        "key padding": (b, 1, 1, sk),
        "per row": (b, h, sq, 1),
    }[kind]


SHAPES = ["full", "per batch", "shared", "2-D", "key padding", "per row"]
KINDS = ["bool", "additive"]


def make_mask(kind: str, shape, dtype: torch.dtype = F32, empty_row: bool = True):
    """A random mask: "bool", True (the key takes part) with probability 0.7; "additive",
    normal values (scale 2) with -inf where masked. With empty_row, query row 1 (where the
    shape has query rows) masks every key."""
    keep = torch.rand(shape, device=DEVICE) > 0.3
    if empty_row and len(shape) >= 2 and shape[-2] > 1 and shape[-1] > 1:
        keep[..., 1, :] = False
    if kind == "bool":
        return keep
    bias = torch.randn(shape, device=DEVICE) * 2
    return bias.masked_fill(~keep, -math.inf).to(dtype)


# ------------------------------------------------------------ reference ----


def check_forward(out, lse, q, k, v, *, what, sinks=None, **terms):
    """The accuracy rule for out (b, sq, h, d) and lse (b, h, sq) (None: not checked); rows
    left with no key exactly: out 0, lse the sink (or +inf)."""
    ref_out, ref_lse = masked_attention(q, k, v, dtype=torch.float64, sinks=sinks, **terms)
    base_out, base_lse = masked_attention(q, k, v, dtype=q.dtype, sinks=sinks, **terms)
    floor = 0.5 * UNIT_ROUNDOFF[q.dtype]
    assert_close_to_reference(out, ref_out, base_out, floor, f"{what}: out")
    b, sq, h, _ = q.shape
    blocked = blocked_pairs(terms.get("attn_mask"), terms.get("window"), b, h, sq, k.shape[1])
    empty = blocked.all(dim=-1)  # (b, h, sq)
    assert torch.all(out.transpose(1, 2)[empty] == 0), f"{what}: empty rows are not 0"
    if lse is None:
        return
    assert_close_to_reference(lse, ref_lse, base_lse, 1e-6, f"{what}: lse")
    got = lse[empty]
    if sinks is None:
        want = torch.full_like(got, math.inf)
    else:
        want = sinks[None, :, None].expand(b, h, sq)[empty]
    # The kernels carry the sink in base 2 (sink * log2 e), so lse is the sink to fp32's
    # rounding of that round trip, not bit for bit.
    torch.testing.assert_close(
        got, want, rtol=1e-6, atol=0, msg=f"{what}: lse of the rows left with no key"
    )


def check_backward(grads, q, k, v, dout, *, what, **terms):
    """The accuracy rule for (dq, dk, dv, dsinks, dmask) against float64 autograd, torch's
    own autograd in the input dtype the baseline (dsinks or dmask None: not asked for); the
    floor one rounding of the gradient, relative to the largest gradient of q, k, v (dq and
    the mask's gradient are computed from terms that size). A mask that is one value per
    row (its last dim 1) has the row sums of dS as its gradient, whose terms cancel (the
    exact sum is the rounding of the stored output): its error counts against the terms'
    size only (max-abs), not against its own ~0 norm."""
    ref = masked_attention_grads(q, k, v, dout, dtype=torch.float64, stored_dtype=q.dtype, **terms)
    base = masked_attention_grads(q, k, v, dout, dtype=q.dtype, **terms)
    floor = UNIT_ROUNDOFF[q.dtype]
    magnitude = max(r.abs().max().item() if r.numel() else 0.0 for r in ref[:3])
    names = ("dq", "dk", "dv", "dsinks", "dmask")
    for name, got, r, b in zip(names, grads, ref, base):
        if got is None:  # not asked for (the sinks or the mask did not require grad)
            continue
        assert r is not None, f"{what}: {name} without its input"
        assert got.shape == r.shape, f"{what}: {name} shape {tuple(got.shape)}"
        row_sums = name == "dmask" and got.shape[-1] == 1
        assert_close_to_reference(
            got, r, b.double(), floor, f"{what}: {name}", magnitude=magnitude,
            frobenius=not row_sums,
        )  # fmt: skip


# ----------------------------------------------------------- the runner ----
def run(family, b, sq, sk, h, hk, d, dtype, *, mask_kind="bool", shape="per batch",
        mask_dtype=F32, causal=False, window=(-1, -1), softcap=0.0, alibi_kind="none",
        with_sinks=False, grads=True, deterministic=False, empty_row=True,
        attn_mask=None, softmax_scale=None):  # fmt: skip
    """flash_attn_func with an attn_mask (and the other options), forward (out, lse) and
    with `grads` the backward (dq, dk, dv, and the sinks' and a float mask's gradients),
    against the reference. attn_mask: the mask to use (default: make_mask's, of
    mask_kind, shape and mask_dtype); softmax_scale: None, d ** -0.5."""
    need_dtype(family, dtype)
    what = (
        f"{family} {dtype} b{b} sq{sq} sk{sk} h{h}/{hk} d{d} mask:{mask_kind} {shape} "
        f"{mask_dtype} causal{causal} w{window} cap{softcap} alibi:{alibi_kind} "
        f"sinks:{with_sinks}"
    )
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype, scale=3.0 if softcap else 1.0)
    if attn_mask is None:
        attn_mask = make_mask(mask_kind, mask_shape(shape, b, h, sq, sk), mask_dtype, empty_row)
    alibi = alibi_slopes(alibi_kind, b, h)
    sinks = make_sinks(h) if with_sinks else None
    options = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=alibi,
                   softmax_scale=softmax_scale)  # fmt: skip
    terms = dict(
        scale=d**-0.5 if softmax_scale is None else softmax_scale, softcap=softcap,
        attn_mask=attn_mask, alibi=alibi,
        window=allowed_keys(sq, sk, causal, window),
    )  # fmt: skip

    poison_allocator((b, sq, h, d), dtype)
    poison_allocator((b, h, sq), F32)
    out, lse, _ = call_forced(
        family,
        lambda: samattn.flash_attn_func(
            q, k, v, attn_mask=attn_mask, sinks=sinks, return_attn_probs=True, **options
        ),
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
    mask_grad = attn_mask.is_floating_point()
    mask_leaf = attn_mask.detach().clone().requires_grad_(mask_grad)
    for t in leaves:
        poison_allocator(t.shape, t.dtype)
    with samattn.use_family(family):
        out = samattn.flash_attn_func(
            *leaves, attn_mask=mask_leaf, sinks=sink_leaf, deterministic=deterministic,
            **options,
        )  # fmt: skip
        inputs = leaves + [t for t in (sink_leaf, mask_leaf) if t is not None and t.requires_grad]
        got = list(torch.autograd.grad(out, inputs, dout))
    # last_family() is this thread's; the backward ran on autograd's, so this is the
    # forward's family (the backward's: test_sm90_runs_masked_calls).
    assert _lib.last_family() == family, f"{what}: the forward ran {_lib.last_family()}"
    dsinks = got.pop(3) if sink_leaf is not None else None
    dmask = got.pop(3) if mask_grad else None
    if dmask is not None:
        assert dmask.dtype == attn_mask.dtype and dmask.shape == attn_mask.shape, what
    check_backward((*got, dsinks, dmask), q, k, v, dout, sinks=sinks, mask_grad=mask_grad,
                   what=f"grad {what}", **terms)  # fmt: skip


# ---------------------------------------------------------------- shapes ----
LENGTHS = [(113, 203), (203, 113), (1, 300)]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("sq, sk", LENGTHS, ids=str)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_mask_shapes(attn_family, dtype, sq, sk, shape, kind):
    """Every broadcast shape, bool and additive, seqlen_q != seqlen_k, a decode row; the
    additive mask's gradient summed to its shape."""
    run(attn_family, 2, sq, sk, 4, 2, 64, dtype, mask_kind=kind, shape=shape)


FEATURES = {
    "plain": {},
    "causal": dict(causal=True),
    "window": dict(window=(32, 8)),
    "causal window": dict(causal=True, window=(48, -1)),
    "softcap": dict(softcap=30.0),
    "MHA": dict(hk=4),
    "MQA": dict(hk=1),
    "alibi": dict(alibi_kind="head"),
    "alibi per batch": dict(alibi_kind="batch"),
    "sinks": dict(with_sinks=True),
    "alibi and sinks": dict(alibi_kind="batch", with_sinks=True),
    "everything": dict(
        causal=True, window=(40, -1), softcap=20.0, hk=1, alibi_kind="batch", with_sinks=True
    ),
}


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq, sk", [(113, 203), (203, 113)], ids=str)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("feature", FEATURES)
def test_mask_with_features(attn_family, d, sq, sk, kind, feature):
    """The mask with causal, the window, softcap, GQA / MQA, ALiBi and sinks (a key takes
    part only if every one allows it; the additive mask after softcap and ALiBi)."""
    options = dict(FEATURES[feature])
    hk = options.pop("hk", 2)
    run(attn_family, 2, sq, sk, 4, hk, d, last_dtype(attn_family), mask_kind=kind, **options)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sq, hk", [(1, 1), (4, 2), (16, 4)], ids=str)
def test_decode_shapes(attn_family, kind, sq, hk):
    """Calls the library would split over the keys without a mask (the query heads of a
    KV head fit one tile): with a mask they run the prefill kernels."""
    run(attn_family, 2, sq, 3000, 8, hk, 128, last_dtype(attn_family), mask_kind=kind,
        shape="key padding", causal=True)  # fmt: skip


@pytest.mark.parametrize("mask_dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_float_mask_dtypes(attn_family, mask_dtype):
    """float16 and bfloat16 masks are read as float32 (converted before broadcasting);
    their gradient comes back in their dtype."""
    run(attn_family, 2, 77, 130, 4, 2, 64, last_dtype(attn_family), mask_kind="additive",
        mask_dtype=mask_dtype, alibi_kind="head", causal=True)  # fmt: skip


# ---------------------------------------------------------- head dims ----
# Multiples of 8 run as they are; the others padded with zeros to the next one.
HEAD_DIMS = [8, 32, 40, 72, 96, 160, 192, 256]
ODD_HEAD_DIMS = [1, 3, 17, 37, 100, 129, 255]


@pytest.mark.parametrize("d", HEAD_DIMS + ODD_HEAD_DIMS)
@pytest.mark.parametrize("kind", KINDS)
def test_head_dims(attn_family, d, kind):
    run(attn_family, 2, 77, 130, 4, 2, d, last_dtype(attn_family), mask_kind=kind,
        alibi_kind="batch", with_sinks=True, causal=True)  # fmt: skip


@pytest.mark.parametrize("d", ODD_HEAD_DIMS)
@pytest.mark.parametrize("terms", ["alibi", "sinks"])
def test_odd_head_dims_run_padded(attn_family, d, terms):
    """ALiBi or sinks without a mask at a head dim that is not a multiple of 8: run on
    zero-padded copies (no refusal), forward and backward, fixed length and varlen."""
    dtype = last_dtype(attn_family)
    alibi = alibi_slopes("batch", 2, 4) if terms == "alibi" else None
    sinks = make_sinks(4) if terms == "sinks" else None
    q, k, v = make_qkv(2, 50, 70, 4, 2, d, dtype)
    dout = randn(2, 50, 4, d, dtype=dtype)
    window = allowed_keys(50, 70, True, (-1, -1))
    what = f"{attn_family} d{d} {terms}"
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    out, lse, _ = call_forced(
        attn_family,
        lambda: samattn.flash_attn_func(
            *leaves, causal=True, alibi_slopes=alibi, sinks=sinks, return_attn_probs=True
        ),
    )
    assert out.is_contiguous() and out.shape == q.shape
    check_forward(out.detach(), lse, q, k, v, scale=d**-0.5, alibi=alibi, window=window,
                  sinks=sinks, what=what)  # fmt: skip
    if not (attn_family == "sm75" and d > SM75_BACKWARD_MAX_D):
        with samattn.use_family(attn_family):
            grads = torch.autograd.grad(out, leaves, dout)
        check_backward((*grads, None, None), q, k, v, dout, scale=d**-0.5, alibi=alibi,
                       window=window, sinks=sinks, what=f"grad {what}")  # fmt: skip
    # Varlen: the same two sequences, packed (each its own slopes).
    cu_q = torch.tensor([0, 50, 100], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 70, 140], dtype=torch.int32, device=DEVICE)
    packed, packed_lse, _ = call_forced(
        attn_family,
        lambda: samattn.flash_attn_varlen_func(
            q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, 50, 70, causal=True,
            alibi_slopes=alibi, sinks=sinks, return_attn_probs=True,
        ),
    )  # fmt: skip
    for i in range(2):
        rows = slice(50 * i, 50 * (i + 1))
        check_forward(
            packed[rows][None], packed_lse[:, rows][None], q[i : i + 1], k[i : i + 1],
            v[i : i + 1], scale=d**-0.5, alibi=None if alibi is None else alibi[i : i + 1],
            window=window, sinks=sinks, what=f"varlen {what} sequence {i}",
        )  # fmt: skip


# ------------------------------------------------------------- lengths ----
MASK_LENGTHS = [(1, 1), (17, 17), (1000, 1000), (4099, 4099), (1, 4099), (4099, 17),
                (17, 1000), (1000, 1), (127, 129)]  # fmt: skip


@pytest.mark.parametrize("sq, sk", MASK_LENGTHS, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_lengths(attn_family, sq, sk, causal):
    """Odd and long lengths (tiles cut by the sequence's end), decode rows, one key."""
    b, h = (1, 2) if max(sq, sk) > 2000 else (2, 4)
    run(attn_family, b, sq, sk, h, h, 128, last_dtype(attn_family), mask_kind="additive",
        shape="per batch", causal=causal, grads=max(sq, sk) <= 1000)  # fmt: skip


# ------------------------------------------------------- empty rows ----
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_sinks", [False, True], ids=["", "sinks"])
def test_rows_the_mask_empties(attn_family, kind, with_sinks):
    """Rows whose every key is masked, and a whole batch entry masked: out 0 and lse +inf
    (or the sink), exactly; no gradient flows through them (dq 0 there, the mask's
    gradient 0 there). torch's math backend gives 0 for such rows in torch >= 2.5 and NaN
    before; samattn gives 0."""
    dtype = last_dtype(attn_family)
    b, sq, sk, h = 3, 40, 56, 4
    q, k, v = make_qkv(b, sq, sk, h, 2, 64, dtype)
    keep = torch.rand(b, h, sq, sk, device=DEVICE) > 0.5
    keep[:, :, 0:3] = False  # the first rows of every head
    keep[1] = False  # all of batch entry 1
    keep[2, 1, 7] = False  # one row of one head
    attn_mask = keep if kind == "bool" else torch.zeros(keep.shape, device=DEVICE).masked_fill(
        ~keep, -math.inf
    )  # fmt: skip
    sinks = make_sinks(h) if with_sinks else None
    mask_leaf = attn_mask.clone().requires_grad_(kind == "additive")
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    dout = randn(b, sq, h, 64, dtype=dtype)
    with samattn.use_family(attn_family):
        out, lse, _ = samattn.flash_attn_func(
            *leaves, attn_mask=mask_leaf, sinks=sinks, return_attn_probs=True
        )
        inputs = leaves + ([mask_leaf] if mask_leaf.requires_grad else [])
        grads = torch.autograd.grad(out, inputs, dout)
    assert torch.all(out[1] == 0) and torch.all(out[:, 0:3] == 0) and torch.all(out[2, 7, 1] == 0)
    if sinks is None:
        assert torch.all(lse[1] == math.inf) and torch.all(lse[:, :, 0:3] == math.inf)
    else:
        assert torch.equal(lse[1], sinks[:, None].expand(h, sq))
    assert torch.all(grads[0][1] == 0) and torch.all(grads[0][:, 0:3] == 0)
    assert torch.all(grads[1][1] == 0) and torch.all(grads[2][1] == 0)
    if kind == "additive":
        dmask = grads[3]
        assert torch.all(dmask[1] == 0) and torch.all(dmask[:, :, 0:3] == 0)
        assert torch.all(dmask[~keep] == 0)  # masked pairs get no gradient
    terms = dict(scale=64**-0.5, attn_mask=attn_mask)
    check_forward(out.detach(), lse, q, k, v, sinks=sinks, what=f"empty rows {kind}", **terms)
    check_backward(
        (*grads[:3], None, grads[3] if kind == "additive" else None), q, k, v, dout,
        sinks=sinks, mask_grad=kind == "additive", what=f"grad empty rows {kind}", **terms,
    )  # fmt: skip


# ------------------------------------------------------------- layouts ----
def test_mask_layouts_give_the_same_bits(attn_family):
    """Masks the kernels cannot read as they are (strided keys, broadcast keys) are copied
    with contiguous keys; views they can (a slice of a wider mask, an expanded one) are read
    in place: every layout gives the bits of the contiguous mask, forward and backward
    (deterministic), the mask's gradient included."""
    dtype = last_dtype(attn_family)
    b, sq, sk, h = 2, 65, 90, 4
    q, k, v = make_qkv(b, sq, sk, h, 2, 64, dtype)
    dout = randn(b, sq, h, 64, dtype=dtype)
    base = make_mask("additive", (b, 1, sq, sk))
    wide = torch.full((b, 1, sq, sk + 13), math.nan, device=DEVICE)
    wide[..., 3 : 3 + sk] = base
    transposed = base.transpose(-1, -2).contiguous().transpose(-1, -2)  # key stride sq
    layouts = {
        "contiguous": base,
        "slice of a wider mask": wide[..., 3 : 3 + sk],
        "strided keys": transposed,
        "expanded heads": base.expand(b, h, sq, sk),
    }

    def grads(mask):
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        leaf = mask.detach().requires_grad_(True)  # a view keeps its strides
        with samattn.use_family(attn_family):
            out = samattn.flash_attn_func(*leaves, attn_mask=leaf, deterministic=True)
            return (out, *torch.autograd.grad(out, [*leaves, leaf], dout))

    expected = grads(base.clone())
    for name, mask in layouts.items():
        got = grads(mask)
        for what, a, e in zip(("out", "dq", "dk", "dv"), got, expected):
            assert torch.equal(a, e), f"{name}: {what} differs from the contiguous mask's"
        dmask = got[4].sum(1, keepdim=True) if name == "expanded heads" else got[4]
        torch.testing.assert_close(dmask, expected[4], rtol=1e-6, atol=1e-6, msg=name)
    # Keys broadcast: (b, 1, sq, 1) materialized along the keys.
    rows = make_mask("additive", (b, 1, sq, 1), empty_row=False)
    with samattn.use_family(attn_family):
        out = samattn.flash_attn_func(q, k, v, attn_mask=rows)
        full = samattn.flash_attn_func(q, k, v, attn_mask=rows.expand(b, 1, sq, sk).contiguous())
    assert torch.equal(out, full)


# ----------------------------------------------------------------- SDPA ----
SDPA_CASES = {
    # name: (b, h, hk, sq, sk, mask shape kind, mask kind, enable_gqa)
    "2-D bool": (2, 4, 4, 113, 113, "2-D", "bool", False),
    "per batch additive": (2, 4, 4, 50, 203, "per batch", "additive", False),
    "full bool, GQA": (2, 8, 2, 77, 77, "full", "bool", True),
    "key padding additive, GQA": (2, 8, 2, 150, 100, "key padding", "additive", True),
}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", SDPA_CASES)
def test_sdpa(attn_family, dtype, case):
    """samattn.scaled_dot_product_attention with attn_mask: torch's semantics (bool True
    takes part, float added), no fallback warning, the reference's values, the gradients
    (the float mask's included)."""
    need_dtype(attn_family, dtype)
    b, h, hk, sq, sk, shape, kind, gqa = SDPA_CASES[case]
    d = 64
    query = randn(b, h, sq, d, dtype=dtype)
    key, value = randn(b, hk, sk, d, dtype=dtype), randn(b, hk, sk, d, dtype=dtype)
    attn_mask = make_mask(kind, mask_shape(shape, b, h, sq, sk), empty_row=False)
    dout = randn(b, h, sq, d, dtype=dtype)
    leaves = [t.detach().requires_grad_(True) for t in (query, key, value)]
    mask_leaf = attn_mask.clone().requires_grad_(kind == "additive")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to torch
        out = call_forced(
            attn_family,
            lambda: samattn.scaled_dot_product_attention(
                *leaves, attn_mask=mask_leaf, enable_gqa=gqa
            ),
        )
    assert out.shape == (b, h, sq, d) and out.transpose(1, 2).is_contiguous()
    with samattn.use_family(attn_family):
        inputs = leaves + ([mask_leaf] if mask_leaf.requires_grad else [])
        grads = torch.autograd.grad(out, inputs, dout)
    q, k, v, do = (t.transpose(1, 2) for t in (query, key, value, dout))
    terms = dict(scale=d**-0.5, attn_mask=attn_mask)
    check_forward(out.detach().transpose(1, 2), None, q, k, v, what=f"sdpa {case}", **terms)
    # torch's own, for the record of what samattn stands in for (mask semantics); in fp32,
    # where torch takes an fp32 additive mask (with fp16 inputs its SDPA returned NaN).
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), attn_mask=attn_mask, enable_gqa=gqa
    ).to(dtype)
    torch.testing.assert_close(out.detach(), expected, rtol=2e-2, atol=2e-2)
    dq, dk, dv = (g.transpose(1, 2) for g in grads[:3])
    check_backward((dq, dk, dv, None, grads[3] if kind == "additive" else None), q, k, v, do,
                   mask_grad=kind == "additive", what=f"grad sdpa {case}", **terms)  # fmt: skip
    with pytest.raises(RuntimeError, match="should not be set when is_causal=True"):
        samattn.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                             is_causal=True, enable_gqa=gqa)  # fmt: skip


# ------------------------------------------------------- determinism ----
def test_deterministic_backward_is_bit_identical(attn_family):
    """deterministic=True: dq, dk, dv, dsinks and the mask's gradient bit-identical run to
    run (GQA, causal, ALiBi, sinks, a mask broadcast over heads)."""
    dtype = last_dtype(attn_family)
    b, sq, sk, h, hk = 2, 700, 900, 8, 2
    q, k, v = make_qkv(b, sq, sk, h, hk, 128, dtype)
    dout = randn(b, sq, h, 128, dtype=dtype)
    mask = make_mask("additive", (b, 1, sq, sk)).requires_grad_(True)
    sinks = make_sinks(h).requires_grad_(True)
    alibi = alibi_slopes("batch", b, h)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]

    def grads():
        out = samattn.flash_attn_func(
            *leaves, causal=True, alibi_slopes=alibi, sinks=sinks, attn_mask=mask,
            deterministic=True,
        )  # fmt: skip
        return torch.autograd.grad(out, [*leaves, sinks, mask], dout)

    with samattn.use_family(attn_family):
        runs = [grads() for _ in range(3)]
    for run_ in runs[1:]:
        for name, first, again in zip(("dq", "dk", "dv", "dsinks", "dmask"), runs[0], run_):
            assert torch.equal(first, again), f"{name} differs between runs"


# --------------------------------------------------- graphs and compile ----
def test_forward_and_backward_in_cuda_graphs(family):
    """The masked forward and backward ops (the mask's gradient included) captured and
    replayed into NaN-filled outputs: the eager results, on every family this GPU runs
    (conftest's `family`). The mask is block_mask's documents, whose tiles sm90 skips,
    reads whole or reads element by element (its tile map is made in the captured
    workspace)."""
    dtype = last_dtype(family)
    b, sq, sk, h = 2, 300, 700, 4
    q, k, v = make_qkv(b, sq, sk, h, 2, 64, dtype)
    dout = randn(b, sq, h, 64, dtype=dtype)
    mask, sinks = block_mask("documents", "additive", b, h, sq, sk), make_sinks(h)
    scalars = (0.125, True, -1, -1, 0.0, True)

    def forward():
        return torch.ops.samattn.flash_attn_masked_forward(q, k, v, mask, *scalars, None, sinks)

    with samattn.use_family(family):
        out, lse = forward()
        args = (dout, q, k, v, out, lse, mask, *scalars, None, sinks, True)
        expected = torch.ops.samattn.flash_attn_masked_backward(*args)
        forward_graph, forward_outputs = capture_graph(forward)
        backward_graph, grads = capture_graph(
            lambda: torch.ops.samattn.flash_attn_masked_backward(*args)
        )
    for t in (*forward_outputs, *grads):
        t.fill_(math.nan)
    forward_graph.replay()
    backward_graph.replay()
    torch.cuda.synchronize()
    for a, e in zip(forward_outputs, (out, lse)):
        assert torch.equal(a, e)
    for name, a, e in zip(("dq", "dk", "dv", "dsinks", "dmask"), grads, expected):
        assert torch.equal(a, e), name
    assert expected[4].shape == mask.shape


@pytest.mark.parametrize(
    "backend",
    [
        "aot_eager",
        pytest.param("inductor", marks=pytest.mark.skipif(not has_triton(), reason="no triton")),
    ],
)
def test_compiled_training_step(attn_family, backend):
    """torch.compile(fullgraph=True) of a loss through flash_attn_func with a learnable
    additive mask and through SDPA with a bool mask: the gradients match eager."""
    torch._dynamo.reset()
    dtype = last_dtype(attn_family)
    b, s, h = 2, 129, 8
    q, k, v = make_qkv(b, s, s, h, 2, 64, dtype)
    bias = (torch.randn(1, h, s, s, device=DEVICE) * 0.5).to(dtype)
    keep = make_mask("bool", (s, s), empty_row=False)

    def loss_fn(q, k, v, bias):
        out = samattn.flash_attn_func(q, k, v, attn_mask=bias, causal=True, deterministic=True)
        sdpa = samattn.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=keep,
            enable_gqa=True,
        )  # fmt: skip
        return (out.float() ** 2).sum() + sdpa.float().sum()

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, bias)]
        fn(*leaves).backward()
        return [t.grad for t in leaves]

    with samattn.use_family(attn_family):
        eager = grads(loss_fn)
        compiled = grads(torch.compile(loss_fn, fullgraph=True, backend=backend))
    assert eager[3].dtype == dtype and eager[3].shape == bias.shape
    for a, e in zip(compiled, eager):
        torch.testing.assert_close(a, e, rtol=1e-2, atol=1e-2)
    torch._dynamo.reset()


# ------------------------------------------------- C ABI on guarded buffers ----
def test_c_abi_dmask_writes_nothing_outside(attn_family):
    """The backward through the C ABI into a dmask inside a NaN-filled buffer (the dmask
    itself zeroed, as the ABI asks): nothing written around it, every pair's gradient the
    reference's (the mask is (b, 1, sq, sk): dmask (b, h, sq, sk) before the sum)."""
    dtype = last_dtype(attn_family)
    b, sq, sk, h, hk, d = 2, 130, 70, 4, 2, 64
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype)
    dout = randn(b, sq, h, d, dtype=dtype)
    mask = make_mask("additive", (b, 1, sq, sk))
    with samattn.use_family(attn_family):
        out, lse, _ = samattn.flash_attn_func(q, k, v, causal=True, attn_mask=mask,
                                              return_attn_probs=True)  # fmt: skip
    dmask = Guarded((b, h, sq, sk), (h * sq * sk, sq * sk, sk, 1), F32)
    dmask.view.zero_()
    grads = [torch.empty_like(t) for t in (q, k, v)]
    args = _lib.AttentionArgs(
        dtype=_lib.F16 if dtype == F16 else _lib.BF16,
        family=_lib.FAMILY_CODES[attn_family],
        device=torch.cuda.current_device(),
        causal=1,
        batch=b, nheads=h, nheads_k=hk, seqlen_q=sq, seqlen_k=sk, headdim=d,
        softmax_scale=d**-0.5, window_left=-1, window_right=-1, deterministic=1,
        stream=torch.cuda.current_stream().cuda_stream,
        attn_mask=mask.data_ptr(), mask_dtype=_lib.F32, mask_batch_stride=sq * sk,
        mask_head_stride=0, mask_q_stride=sk, mask_k_stride=1, dmask=dmask.view.data_ptr(),
    )  # fmt: skip
    dq, dk, dv = grads
    run_c_backward(args, dict(q=q, k=k, v=v, o=out, dout=dout, dq=dq, dk=dk, dv=dv), lse)
    dmask.assert_no_stray_writes("dmask")
    assert torch.isfinite(dmask.view).all(), "dmask holds non-finite values"
    # Per pair, before any sum: the reference's gradient of a (b, h, sq, sk) mask.
    full = mask.expand(b, h, sq, sk).contiguous()
    terms = dict(scale=d**-0.5, attn_mask=full, window=allowed_keys(sq, sk, True, (-1, -1)))
    check_backward((*grads, None, dmask.view), q, k, v, dout, mask_grad=True, what="c abi",
                   **terms)  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_sm90_runs_masked_calls(kind):
    """Automatic selection on Hopper runs a masked forward and backward on sm90, as a forced
    sm90 does; an additive mask with softcap goes to sm80's backward (its registration's
    forced_fallback), also with sm90 forced."""
    need_family("sm90")
    q, k, v = make_qkv(1, 256, 256, 2, 2, 64, F16)
    mask = make_mask(kind, (1, 1, 256, 256), empty_row=False)
    call = functools.partial(samattn.flash_attn_func, q, k, v, attn_mask=mask)
    call_forced("sm90", call)
    samattn._lib.set_last_family(samattn._lib.FAMILY_AUTO)
    out, lse, _ = call(return_attn_probs=True)
    assert _lib.last_family() == "sm90"
    dout = torch.randn_like(out)
    backward = torch.ops.samattn.flash_attn_masked_backward
    for softcap in (0.0, 5.0):
        args = (dout, q, k, v, out, lse, mask, 64**-0.5, False, -1, -1, softcap, False)
        samattn._lib.set_last_family(samattn._lib.FAMILY_AUTO)
        backward(*args)
        declined = softcap > 0 and kind == "additive"
        assert _lib.last_family() == ("sm80" if declined else "sm90"), (kind, softcap)
        call_forced(
            "sm90", functools.partial(backward, *args), expected="sm80" if declined else "sm90"
        )


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("sq, sk", [*LENGTHS, (300, 1000)], ids=str)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_sm90_mask_shapes(dtype, sq, sk, shape, kind):
    """test_mask_shapes with sm90 forced, forward and backward."""
    need_family("sm90")
    run("sm90", 2, sq, sk, 4, 2, 64, dtype, mask_kind=kind, shape=shape)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq, sk", [(113, 203), (203, 113), (300, 1000)], ids=str)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("feature", FEATURES)
def test_sm90_mask_with_features(d, sq, sk, kind, feature):
    """test_mask_with_features with sm90 forced; 1000 keys take several key tiles, and
    300 query rows several query tiles per key tile in the backward."""
    need_family("sm90")
    options = dict(FEATURES[feature])
    hk = options.pop("hk", 2)
    run("sm90", 2, sq, sk, 4, hk, d, BF16, mask_kind=kind, **options)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sm90_mask_long_keys(kind, causal):
    """4099 keys at d = 64, the long key loops that masked calls run on the 128-row tile."""
    need_family("sm90")
    run("sm90", 1, 4099, 4099, 2, 2, 64, BF16, mask_kind=kind, causal=causal, grads=False)


def block_mask(pattern: str, kind: str, b: int, h: int, sq: int, sk: int) -> torch.Tensor:
    """Masks made of blocks, as real ones are: whole tiles masked, whole tiles kept and
    tiles cut across, which the sm90 kernels skip, run without reading the mask, or read
    (mask_tiles.h). "key padding": batch entry i keeps its first (sk, sk / 2 + 5, 0)[i]
    keys (the last keeps none); "causal": bottom-right aligned; "documents": four
    documents along the queries and the keys, each attending its own; "per head": key
    padding of a different length per head, head 1 of batch entry 0 keeping nothing.
    Additive: 0 where kept, -inf where masked; "documents" adds a normal bias inside
    the first document (a tile with values, read though nothing is masked)."""
    keys = torch.arange(sk, device=DEVICE)
    queries = torch.arange(sq, device=DEVICE)
    if pattern == "key padding":
        lengths = torch.tensor([sk, sk // 2 + 5, 0][:b], device=DEVICE)
        keep = (keys[None, :] < lengths[:, None])[:, None, None, :].expand(b, 1, sq, sk)
    elif pattern == "causal":
        keep = (keys[None, :] <= queries[:, None] + sk - sq)[None, None]
    elif pattern == "documents":
        doc_q, doc_k = queries * 4 // sq, keys * 4 // sk
        keep = (doc_q[:, None] == doc_k[None, :])[None, None]
    elif pattern == "per head":
        lengths = (torch.arange(b * h, device=DEVICE).reshape(b, h) * 97 + 61) % (sk + 1)
        lengths[0, 1] = 0
        keep = (keys < lengths[..., None])[:, :, None, :].expand(b, h, sq, sk)
    else:
        raise ValueError(pattern)
    keep = keep.contiguous()
    if kind == "bool":
        return keep
    bias = torch.zeros(keep.shape, device=DEVICE)
    if pattern == "documents":
        first = (queries * 4 // sq == 0)[:, None] & (keys * 4 // sk == 0)[None, :]
        bias = torch.where(first, torch.randn(keep.shape, device=DEVICE), bias)
    return bias.masked_fill(~keep, -math.inf)


MASK_PATTERNS = ["key padding", "causal", "documents", "per head"]


@pytest.fixture(params=["sm90", "sm80", "sm75"])
def map_family(request) -> str:
    """Every family reads a mask through its tile map (mask_tiles.h), with its own tiles."""
    need_family(request.param)
    return request.param


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("pattern", MASK_PATTERNS)
@pytest.mark.parametrize("kind", KINDS)
def test_skips_and_reads_mask_tiles(map_family, d, pattern, kind):
    """Each family forced on masks of whole tiles (block_mask): tiles left out, tiles kept
    whole and tiles cut, several of each per query tile and per key tile (300 x 1000),
    GQA; forward, backward, the mask's gradient."""
    b, sq, sk, h, hk = 3, 300, 1000, 4, 2
    mask = block_mask(pattern, kind, b, h, sq, sk)
    dtype = F16 if map_family == "sm75" else BF16
    run(map_family, b, sq, sk, h, hk, d, dtype, attn_mask=mask)


@pytest.mark.parametrize("scale", [0.37, 2.0**-9], ids=["0.37", "2^-9"])
@pytest.mark.parametrize("pattern", ["key padding", "documents"])
def test_sm90_additive_mask_tiles_with_scales(scale, pattern):
    """An additive mask is added to scaled scores; on the tiles it keeps whole (zeros) the
    sm90 kernels take a positive scale in the softmax's exponent instead of scaling each
    score, and scale the scores on the tiles they read: both against the reference with
    other scales than the default, forward, backward and the mask's gradient."""
    need_family("sm90")
    b, sq, sk, h, d = 3, 300, 1000, 4, 64
    mask = block_mask(pattern, "additive", b, h, sq, sk)
    run("sm90", b, sq, sk, h, 2, d, BF16, attn_mask=mask, softmax_scale=scale)


@pytest.mark.parametrize("pattern", ["key padding", "documents"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mask_tiles_deterministic(map_family, pattern, causal):
    """The deterministic backward, whose key tiles add each query tile's dQ in turn,
    where the mask leaves some (query tile, key tile) pairs out: against the reference,
    and bit-identical run to run."""
    b, sq, sk, h, d = 3, 300, 1000, 4, 128
    dtype = F16 if map_family == "sm75" else BF16
    mask = block_mask(pattern, "additive", b, h, sq, sk)
    run(map_family, b, sq, sk, h, 2, d, dtype, attn_mask=mask, causal=causal, deterministic=True)
    q, k, v = make_qkv(b, sq, sk, h, 2, d, dtype)
    dout = randn(b, sq, h, d, dtype=dtype)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    mask.requires_grad_(True)

    def grads():
        with samattn.use_family(map_family):
            out = samattn.flash_attn_func(
                *leaves, causal=causal, attn_mask=mask, deterministic=True
            )
            return torch.autograd.grad(out, [*leaves, mask], dout)

    first = grads()
    for _ in range(2):
        for name, a, again in zip(("dq", "dk", "dv", "dmask"), first, grads()):
            assert torch.equal(a, again), f"{name} differs between runs"


# ------------------------------------------------------------ transformers ----
def test_transformers_custom_4d_mask_and_t5_bias():
    """Through transformers with the real kernels: a tiny Llama under a custom 4-D mask
    against sdpa, and a tiny T5 (a learned relative position bias, read as an additive
    mask) against eager, forward and a training step, in float32 weights on bf16-free
    paths (the attention in bf16 both ways)."""
    transformers = pytest.importorskip("transformers")
    from samattn.integrations import transformers as integration

    integration.register()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, intermediate_size=256, max_position_embeddings=256,
    )  # fmt: skip
    # One config each: _from_config sets the implementation on the config it is given.
    ours = transformers.LlamaForCausalLM._from_config(
        copy.deepcopy(config), attn_implementation="samattn"
    )
    theirs = transformers.LlamaForCausalLM._from_config(
        copy.deepcopy(config), attn_implementation="sdpa"
    )
    theirs.load_state_dict(ours.state_dict())
    ours, theirs = (m.to(device=DEVICE, dtype=BF16).eval() for m in (ours, theirs))
    ids = torch.randint(0, 256, (2, 48), device=DEVICE)
    mask_4d = torch.rand(2, 1, 48, 48, device=DEVICE) < 0.5
    mask_4d |= torch.eye(48, dtype=torch.bool, device=DEVICE)
    with torch.no_grad(), integration.count_calls() as counts:
        got = ours(ids, attention_mask=mask_4d).logits.float()
        expected = theirs(ids, attention_mask=mask_4d).logits.float()
    assert counts == {"prefill:mask": 2}
    torch.testing.assert_close(got, expected, rtol=5e-2, atol=5e-2)

    t5 = dict(vocab_size=64, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
              dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model_class = transformers.T5ForConditionalGeneration
    ours = model_class._from_config(transformers.T5Config(**t5), attn_implementation="samattn")
    theirs = model_class._from_config(transformers.T5Config(**t5), attn_implementation="eager")
    theirs.load_state_dict(ours.state_dict())
    ours, theirs = (m.to(device=DEVICE, dtype=BF16) for m in (ours, theirs))
    ids = torch.randint(1, 64, (2, 40), device=DEVICE)
    attention_mask = torch.ones(2, 40, dtype=torch.long, device=DEVICE)
    attention_mask[1, 30:] = 0
    targets = torch.randint(1, 64, (2, 12), device=DEVICE)
    losses = {}
    for name, model in (("ours", ours), ("theirs", theirs)):
        model.train()
        losses[name] = model(input_ids=ids, attention_mask=attention_mask, labels=targets).loss
        losses[name].backward()
    torch.testing.assert_close(losses["ours"].float(), losses["theirs"].float(), rtol=2e-2,
                               atol=2e-2)  # fmt: skip
    bias = ours.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
    bias_eager = theirs.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
    assert bias.grad is not None and torch.isfinite(bias.grad).all()
    cosine = torch.nn.functional.cosine_similarity(
        bias.grad.float().flatten(), bias_eager.grad.float().flatten(), dim=0
    )
    assert cosine > 0.99, f"the relative bias's gradient differs from eager's: cosine {cosine}"
