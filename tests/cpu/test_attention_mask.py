"""Attention masks (attn_mask) without a GPU: validation shared by eager and the fakes,
the masked ops (schemas, fakes, opcheck, torch.compile), the autograd wiring of the mask's
gradient, how a mask is packed into the C arguments, and the zero padding of head dims
that are not multiples of 8 when a score term or a mask is given.

Meta tensors reach the fake implementations; the CUDA implementations' host logic runs on
meta tensors against a stand-in library that records the arguments it is given. The
gradients' wiring is checked with gradcheck against float64 CPU references swapped in for
the CUDA implementations.
"""

from __future__ import annotations

import ctypes
import math

import pytest
import torch
from cpu_helpers import meta, qkv
from torch.utils._python_dispatch import TorchDispatchMode

import samattn
from samattn import _checks, _cuda, _eager, _lib
from samattn import attention as attention_module

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def sdpa_qkv(b=2, h=4, hk=2, sq=17, sk=33, d=64, dtype=F16, grad=False):
    return (
        meta(b, h, sq, d, dtype=dtype, grad=grad),
        meta(b, hk, sk, d, dtype=dtype, grad=grad),
        meta(b, hk, sk, d, dtype=dtype, grad=grad),
    )


# ------------------------------------------------------------- shapes ----
# Masks of a (batch 2, heads 4, seqlen_q 17, seqlen_k 33) call that broadcast.
GOOD_SHAPES = [(2, 4, 17, 33), (2, 1, 17, 33), (1, 1, 17, 33), (17, 33), (33,), (1, 33),
               (2, 4, 1, 33), (2, 1, 17, 1), (1,), ()]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bool, F32, F16, BF16])
@pytest.mark.parametrize("shape", GOOD_SHAPES, ids=str)
def test_masks_that_broadcast_are_accepted(dtype, shape):
    q, k, v = qkv()
    out, lse, _ = samattn.flash_attn_func(
        q, k, v, attn_mask=meta(*shape, dtype=dtype), return_attn_probs=True
    )
    assert out.shape == q.shape and out.device.type == "meta" and lse.shape == (2, 4, 17)
    query, key, value = sdpa_qkv()
    out = samattn.scaled_dot_product_attention(
        query, key, value, attn_mask=meta(*shape, dtype=dtype), enable_gqa=True
    )
    assert out.shape == query.shape


BAD_MASKS = {
    # name: (mask, error, fragment)
    "int": (meta(17, 33, dtype=torch.int32), TypeError, "must be torch.bool (True: the key"),
    "float64": (meta(17, 33, dtype=torch.float64), TypeError, "got torch.float64"),
    "keys": (meta(17, 32, dtype=torch.bool), ValueError, "of shape (17, 32) does not broadcast"),
    "queries": (meta(16, 33, dtype=torch.bool), ValueError, "= (2, 4, 17, 33)"),
    "kv heads, not query heads": (meta(2, 2, 17, 33), ValueError, "(2, 2, 17, 33) does not"),
    "batch": (meta(3, 1, 17, 33), ValueError, "does not broadcast"),
    "rank 5": (meta(1, 1, 1, 17, 33), ValueError, "(1, 1, 1, 17, 33) does not broadcast"),
    "cpu": (
        torch.ones(17, 33, dtype=torch.bool),
        ValueError,
        "need CUDA tensors, but attn_mask is on cpu",
    ),
    "not a tensor": ([[True] * 33] * 17, TypeError, "attn_mask must be a torch.Tensor"),
}


@pytest.mark.parametrize("case", BAD_MASKS)
def test_bad_masks_are_refused_with_the_function_name(case):
    mask, error, fragment = BAD_MASKS[case]
    with pytest.raises(error) as info:
        samattn.flash_attn_func(*qkv(), attn_mask=mask)
    assert fragment in str(info.value) and "samattn.flash_attn_func" in str(info.value)
    with pytest.raises(error) as info:
        samattn.scaled_dot_product_attention(*sdpa_qkv(), attn_mask=mask, enable_gqa=True)
    message = str(info.value)
    assert fragment in message and "samattn.scaled_dot_product_attention" in message


@pytest.mark.parametrize("case", ["int", "keys", "kv heads, not query heads", "cpu"])
def test_the_fake_refuses_what_eager_refuses(case):
    # torch.compile traces the op's fake implementation: the same checks.
    mask, error, fragment = BAD_MASKS[case]
    q, k, v = qkv()
    with pytest.raises(error, match=None) as info:
        torch.ops.samattn.flash_attn_masked_forward(q, k, v, mask, 0.125, False, -1, -1, 0.0, False)
    assert fragment in str(info.value)


def test_the_mask_check_is_fixed_length_only():
    sizes = _checks.AttentionShape(2, 4, 2, 40, 50, 64, varlen=True)
    with pytest.raises(ValueError, match="fixed-length calls only"):
        _checks.attention_mask("op", meta(40, 50, dtype=torch.bool), sizes, meta(40, 4, 64))


def test_sdpa_is_causal_with_a_mask_is_an_error():
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal"):
        samattn.scaled_dot_product_attention(
            *sdpa_qkv(sq=17, sk=17), attn_mask=meta(17, 17, dtype=torch.bool), is_causal=True,
            enable_gqa=True,
        )  # fmt: skip


def test_a_mask_combines_with_the_other_options():
    q, k, v = qkv(d=128)
    out = samattn.flash_attn_func(
        q, k, v, causal=True, window_size=(8, 0), softcap=30.0,
        alibi_slopes=meta(2, 4, dtype=F32), sinks=meta(4, dtype=F32),
        attn_mask=meta(2, 1, 17, 33, dtype=BF16), deterministic=True,
    )  # fmt: skip
    assert out.shape == q.shape


# ------------------------------------------------------------ the ops ----
def masked_op_args(mask_dtype=F32, mask_shape=(2, 1, 17, 33), grad=False, sinks=False):
    q, k, v = qkv(grad=grad)
    mask = meta(*mask_shape, dtype=mask_dtype, grad=grad and mask_dtype != torch.bool)
    terms = (meta(2, 4, dtype=F32), meta(4, dtype=F32, grad=grad)) if sinks else ()
    return (q, k, v, mask, 0.125, True, -1, 0, 0.0, False, *terms)


@pytest.mark.parametrize("mask_dtype", [torch.bool, F32, BF16])
@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "alibi+sinks"])
def test_opcheck(mask_dtype, sinks):
    args = masked_op_args(mask_dtype, sinks=sinks)
    torch.library.opcheck(torch.ops.samattn.flash_attn_masked_forward.default, args)
    out, lse = torch.ops.samattn.flash_attn_masked_forward(*args)
    q, k, v, mask = args[:4]
    rest = args[4:]
    terms = rest[6:] if sinks else (None, None)
    mask_grad = mask_dtype != torch.bool
    backward = (torch.empty_like(out), q, k, v, out, lse, mask, *rest[:6], *terms, mask_grad)
    torch.library.opcheck(torch.ops.samattn.flash_attn_masked_backward.default, backward)


def test_backward_fake_outputs():
    args = masked_op_args(BF16, mask_shape=(17, 33), sinks=True)
    out, lse = torch.ops.samattn.flash_attn_masked_forward(*args)
    q, k, v, mask = args[:4]
    common = (torch.empty_like(out), q, k, v, out, lse, mask, *args[4:10])
    dq, dk, dv, dsinks, dmask = torch.ops.samattn.flash_attn_masked_backward(
        *common, *args[10:], True
    )
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert dsinks.shape == (4,) and dsinks.dtype == F32
    # The mask's gradient in its own shape and dtype.
    assert dmask.shape == (17, 33) and dmask.dtype == BF16
    *_, dsinks, dmask = torch.ops.samattn.flash_attn_masked_backward(*common, None, None, False)
    assert dsinks.shape == (0,) and dmask.shape == (0,) and dmask.dtype == F32


def test_a_bool_mask_has_no_gradient_to_ask_for():
    args = masked_op_args(torch.bool)
    out, lse = torch.ops.samattn.flash_attn_masked_forward(*args)
    q, k, v, mask = args[:4]
    with pytest.raises(ValueError, match="only a float \\(additive\\) mask has"):
        torch.ops.samattn.flash_attn_masked_backward(
            torch.empty_like(out), q, k, v, out, lse, mask, *args[4:10], None, None, True
        )


class MaskedBackwardCalls(TorchDispatchMode):
    """Records (attn_mask, sinks, mask_grad) of each masked backward op call, then runs its
    fake. A dispatch mode, not a patched `torch.ops` attribute: torch looks the op up there
    by name on the way to its fake."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.samattn.flash_attn_masked_backward.default:
            # Trailing arguments equal to their defaults do not reach a dispatch mode.
            schema = func._schema.arguments
            bound = {a.name: a.default_value for a in schema if a.has_default_value()}
            bound.update(zip((a.name for a in schema), args), **(kwargs or {}))
            self.calls.append((bound["attn_mask"], bound["sinks"], bound["mask_grad"]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mask_dtype", [F32, BF16, F16])
@pytest.mark.parametrize("shape", [(2, 1, 17, 33), (17, 33), (2, 4, 1, 33)], ids=str)
def test_a_float_mask_that_requires_grad_gets_its_gradient(mask_dtype, shape):
    q, k, v = qkv(grad=True)
    mask = meta(*shape, dtype=mask_dtype, grad=True)
    sinks = meta(4, dtype=F32, grad=True)
    with MaskedBackwardCalls() as spy:
        samattn.flash_attn_func(q, k, v, attn_mask=mask, sinks=sinks).sum().backward()
    assert mask.grad.shape == shape and mask.grad.dtype == mask_dtype
    assert q.grad.shape == q.shape and sinks.grad.shape == (4,)
    ((passed_mask, passed_sinks, mask_grad),) = spy.calls
    assert passed_mask is mask and passed_sinks is sinks and mask_grad is True


def test_masks_without_grad_get_none():
    q, k, v = qkv(grad=True)
    with MaskedBackwardCalls() as spy:
        for mask in (meta(17, 33, dtype=torch.bool), meta(17, 33, dtype=F32)):
            out = samattn.flash_attn_func(q, k, v, attn_mask=mask, sinks=meta(4, dtype=F32))
            out.sum().backward()
            assert mask.grad is None
    # Sinks without grad are not passed (dq, dk, dv do not need them); no mask gradient.
    assert [(c[1], c[2]) for c in spy.calls] == [(None, False), (None, False)]


def test_only_the_mask_requires_grad():
    q, k, v = qkv()
    mask = meta(2, 1, 17, 33, dtype=F32, grad=True)
    with MaskedBackwardCalls() as spy:
        out = samattn.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask, enable_gqa=True
        )
        out.sum().backward()
    assert mask.grad.shape == mask.shape and spy.calls[0][2] is True


def train_with_mask(q, k, v, mask, sinks):
    out = samattn.flash_attn_func(q, k, v, attn_mask=mask, sinks=sinks, softcap=20.0)
    return out.float().square().sum()


def train_sdpa_with_mask(query, key, value, mask):
    out = samattn.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
    return out.float().sum()


@pytest.mark.parametrize("which", ["flash_attn_func", "sdpa"])
def test_compiled_training_graph_with_a_mask(which):
    torch._dynamo.reset()
    mask = meta(2, 1, 17, 33, dtype=BF16, grad=True)
    if which == "sdpa":
        leaves = sdpa_qkv(grad=True)
        fn, extra = train_sdpa_with_mask, (mask,)
    else:
        leaves = qkv(grad=True)
        fn, extra = train_with_mask, (mask, meta(4, dtype=F32, grad=True))
    loss = torch.compile(fn, fullgraph=True, backend="aot_eager")(*leaves, *extra)
    loss.backward()
    assert mask.grad is not None and mask.grad.shape == mask.shape and mask.grad.dtype == BF16
    for t in leaves:
        assert t.grad is not None and t.grad.shape == t.shape
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*leaves, *extra)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


# ---------------------------------------------- the gradient, by gradcheck ----
def reference_probs(q, k, v, scale, attn_mask, sinks):
    """(probs, lse, v repeated per query head) in float64 on the CPU: q (b, sq, h, d), k,
    v (b, sk, hk, d), a bool or additive mask broadcastable to (b, h, sq, sk), sinks (h,)
    or None (in lse, not in probs)."""
    group = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2)
    kt, vt = (t.transpose(1, 2).repeat_interleave(group, 1) for t in (k, v))
    scores = qt @ kt.transpose(-1, -2) * scale
    if attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, -math.inf)
    else:
        scores = scores + attn_mask.to(scores.dtype)
    columns = scores
    if sinks is not None:
        sink = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        columns = torch.cat([scores, sink], dim=-1)
    lse = torch.logsumexp(columns, dim=-1)
    return torch.exp(scores - lse[..., None]), lse, kt, vt


def reference_attention(q, k, v, scale, attn_mask, sinks):
    """(out (b, sq, h, d), lse (b, h, sq)) of reference_probs."""
    probs, lse, _, vt = reference_probs(q, k, v, scale, attn_mask, sinks)
    return (probs @ vt).transpose(1, 2).contiguous(), lse


class References:
    """float64 stand-ins for the CUDA implementations of the masked ops (the backward by
    the attention gradient's formulas: the op's implementation runs below autograd)."""

    def __init__(self) -> None:
        self.mask_grads: list[bool] = []

    def forward(self, q, k, v, params, cu_q=None, cu_k=None, max_q=0, max_k=0, op=None,
                block_table=None, attn_mask=None, want_lse=True):  # fmt: skip
        assert attn_mask is not None and cu_q is None and block_table is None
        assert params[1:5] == (False, -1, -1, 0.0)  # not causal, no window, no softcap
        assert params.dropout_p == 0.0 and params.dropout_seed is None
        return reference_attention(q, k, v, params.softmax_scale, attn_mask, params.sinks)

    def backward(self, dout, q, k, v, out, lse, attn_mask, params, mask_grad=False, op=None):
        assert params.dropout_p == 0.0 and params.dropout_seed is None
        self.mask_grads.append(mask_grad)
        scale, sinks = params.softmax_scale, params.sinks
        hk, group = k.shape[2], q.shape[2] // k.shape[2]
        probs, lse, kt, vt = reference_probs(q, k, v, scale, attn_mask, sinks)
        do, o = dout.transpose(1, 2), out.transpose(1, 2)  # (b, h, sq, d)
        rows = (do * o).sum(-1, keepdim=True)  # D
        ds = probs * (do @ vt.transpose(-1, -2) - rows)  # d loss / d score, per pair

        def per_kv_head(t):  # (b, h, sk, d) -> (b, sk, hk, d), summed over each group
            return t.unflatten(1, (hk, group)).sum(2).transpose(1, 2)

        dq = (ds @ kt * scale).transpose(1, 2)
        dk = per_kv_head(ds.transpose(-1, -2) @ q.transpose(1, 2) * scale)
        dv = per_kv_head(probs.transpose(-1, -2) @ do)
        dsinks = None
        if sinks is not None:
            weights = torch.exp(sinks.reshape(1, -1, 1) - lse)
            dsinks = -(weights * rows[..., 0]).sum((0, 2))
        dmask = _cuda._mask_gradient(ds, attn_mask) if mask_grad else None
        return dq, dk, dv, dsinks, dmask


@pytest.fixture
def references(monkeypatch) -> References:
    refs = References()
    monkeypatch.setattr(_cuda, "flash_attn_forward", refs.forward)
    monkeypatch.setattr(_cuda, "flash_attn_masked_backward", refs.backward)
    return refs


def double(*shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64).requires_grad_(grad)


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (2, 1, 5, 7), (5, 7), (7,), (2, 3, 1, 7)], ids=str)
@pytest.mark.parametrize("with_sinks", [False, True], ids=["", "sinks"])
def test_gradients_through_the_op(references, shape, with_sinks):
    q, k, v = double(2, 5, 3, 4), double(2, 7, 1, 4), double(2, 7, 1, 4)
    mask = double(*shape)
    sinks = double(3) if with_sinks else None

    def attention(q, k, v, mask, sinks):
        return torch.ops.samattn.flash_attn_masked_forward(
            q, k, v, mask, 0.5, False, -1, -1, 0.0, False, None, sinks
        )[0]

    assert torch.autograd.gradcheck(attention, (q, k, v, mask, sinks))
    assert references.mask_grads and all(references.mask_grads)


def test_gradients_through_the_eager_autograd_route(references, monkeypatch):
    """The AUTOGRAD route (_MaskedAttnFunction, taken by CUDA tensors that require grad),
    here on CPU tensors: the public function, its Function and the backward op."""
    monkeypatch.setattr(_eager, "route", lambda *tensors: _eager.AUTOGRAD)
    q, k, v = double(2, 5, 4, 8), double(2, 7, 2, 8), double(2, 7, 2, 8)
    mask = double(2, 1, 5, 7)
    sinks = double(4)

    def attention(q, k, v, mask, sinks):
        return samattn.flash_attn_func(q, k, v, attn_mask=mask, sinks=sinks, softmax_scale=0.3)

    assert torch.autograd.gradcheck(attention, (q, k, v, mask, sinks))
    # A bool mask: gradients for q, k, v and none for the mask.
    keep = torch.rand(5, 7) > 0.3
    keep[:, 0] = True
    assert torch.autograd.gradcheck(
        lambda q, k, v: samattn.flash_attn_func(q, k, v, attn_mask=keep), (q, k, v)
    )
    assert references.mask_grads[-1] is False


def test_the_direct_route_calls_the_cuda_implementation(references, monkeypatch):
    monkeypatch.setattr(_eager, "route", lambda *tensors: _eager.DIRECT)
    q, k, v = (double(1, n, 2, 8, grad=False) for n in (3, 4, 4))
    keep = torch.tensor([[True, False, True, True]] * 3)
    out, lse, _ = samattn.flash_attn_func(q, k, v, attn_mask=keep, return_attn_probs=True)
    expected, expected_lse = reference_attention(q, k, v, 8**-0.5, keep, None)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(lse, expected_lse)


def test_mask_gradient_sums_the_broadcast_dims():
    dmask = torch.arange(2 * 3 * 4 * 5, dtype=F32).reshape(2, 3, 4, 5)
    for shape in [(2, 3, 4, 5), (2, 1, 4, 5), (4, 5), (5,), (1, 3, 1, 5), ()]:
        mask = torch.zeros(shape, dtype=BF16)
        grad = _cuda._mask_gradient(dmask, mask)
        expected = dmask.sum_to_size((1,) * (4 - len(shape)) + shape).reshape(shape)
        assert grad.shape == shape and grad.dtype == BF16
        torch.testing.assert_close(grad, expected.to(BF16))


# ------------------------------------------------- the C arguments ----
SIZES = _checks.AttentionShape(2, 4, 2, 6, 10, 64, False)


def test_mask_fields_of_a_full_mask():
    mask = torch.zeros(2, 4, 6, 10, dtype=torch.bool)
    fields, keep = _cuda._mask_fields(mask, SIZES)
    assert keep is mask  # read in place
    assert fields == (mask.data_ptr(), _lib.BOOL, 0, 240, 60, 10, 1, 0)


def test_mask_fields_broadcast_with_stride_zero():
    mask = torch.zeros(6, 10)  # float32: additive
    fields, keep = _cuda._mask_fields(mask, SIZES, dmask=torch.zeros(2, 4, 6, 10))
    assert keep.data_ptr() == mask.data_ptr()
    assert fields[:7] == (mask.data_ptr(), _lib.F32, 0, 0, 0, 10, 1) and fields[7] != 0
    padding = torch.zeros(2, 1, 1, 10, dtype=torch.bool)  # key padding: (batch, 1, 1, keys)
    assert _cuda._mask_fields(padding, SIZES)[0][3:7] == (10, 0, 0, 1)


def test_mask_fields_convert_a_half_mask_unexpanded():
    mask = torch.randn(2, 1, 6, 10).to(BF16)
    fields, keep = _cuda._mask_fields(mask, SIZES)
    assert keep.dtype == F32 and keep.shape == (2, 1, 6, 10)  # not broadcast to 4 heads
    assert torch.equal(keep, mask.float()) and fields[1] == _lib.F32
    assert fields[3:7] == (60, 0, 10, 1)


def test_mask_fields_make_the_keys_contiguous():
    transposed = torch.zeros(10, 6, dtype=torch.bool).t()  # (6, 10), key stride 6
    fields, keep = _cuda._mask_fields(transposed, SIZES)
    assert keep.is_contiguous() and torch.equal(keep[0, 0], transposed)
    assert fields[3:7] == (0, 0, 10, 1)
    # Keys broadcast: materialized along the keys only.
    rows = torch.ones(2, 1, 6, 1, dtype=torch.bool)
    fields, keep = _cuda._mask_fields(rows, SIZES)
    assert keep.shape == (2, 1, 6, 10) and fields[3:7] == (60, 0, 10, 1)
    # One key: any key stride will do, nothing copied.
    one_key = torch.ones(2, 1, 6, 3, dtype=torch.bool)[..., 1:2]
    fields, keep = _cuda._mask_fields(one_key, SIZES._replace(seqlen_k=1))
    assert keep.data_ptr() == one_key.data_ptr()


def test_attention_args_carry_the_mask(monkeypatch):
    monkeypatch.setattr(_cuda, "_stream", lambda t: 0)
    q = torch.zeros(2, 6, 4, 64, dtype=BF16)
    k = v = torch.zeros(2, 10, 2, 64, dtype=BF16)
    out, lse = torch.empty_like(q), torch.empty(SIZES.lse_shape)
    mask = (0x5000, _lib.F32, 0, 60, 0, 10, 1, 0x6000)
    params = _checks.AttentionParams(1.0, False, -1, -1, 0.0)
    args, _ = _cuda._attention_args(
        None, SIZES, q, k, v, out, lse, None, None, 0, 0, params, mask=mask
    )
    fields = ("attn_mask", "mask_dtype", "mask_reserved", "mask_batch_stride",
              "mask_head_stride", "mask_q_stride", "mask_k_stride", "dmask")  # fmt: skip
    assert tuple(getattr(args, name) for name in fields) == mask
    assert args.alibi_slopes is None and args.sinks is None


# ------------------------------------------------ odd head dims, padded ----
class StandInLibrary:
    """Answers the attention entry points like the library would (no workspace), recording
    each call's head dim, score terms and mask."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def _record(self, kind: str, args_ref) -> int:
        args = args_ref._obj
        self.calls.append(
            dict(
                kind=kind,
                headdim=args.headdim,
                sinks=bool(args.sinks),
                mask=bool(args.attn_mask) or args.mask_dtype != 0,
                dmask=bool(args.dmask),
            )
        )
        return _lib.OK

    def samattn_attention_forward(self, args_ref, family_ref):
        return self._record("forward", args_ref)

    def samattn_attention_backward(self, args_ref, family_ref):
        return self._record("backward", args_ref)

    def samattn_attention_forward_workspace_size(self, args_ref, needed_ref):
        needed_ref._obj.value = 0
        return _lib.OK

    samattn_attention_backward_workspace_size = samattn_attention_forward_workspace_size


@pytest.fixture
def library(monkeypatch) -> StandInLibrary:
    stand_in = StandInLibrary()
    monkeypatch.setattr(_lib, "lib", lambda: stand_in)
    monkeypatch.setattr(_cuda, "_stream", lambda t: 0)
    monkeypatch.setattr(_checks, "_value_checks", False)  # meta offsets have no values
    return stand_in


def test_odd_head_dims_with_terms_run_padded(library):
    q, k, v = qkv(d=37)
    sinks, mask = meta(4, dtype=F32), meta(17, 33, dtype=torch.bool)
    params = _checks.AttentionParams(37**-0.5, True, -1, 0, 0.0)
    for terms in (dict(sinks=sinks), dict(alibi_slopes=sinks), {}):
        out, lse = _cuda.flash_attn_forward(
            q, k, v, params._replace(**terms), attn_mask=None if terms else mask
        )
        assert library.calls[-1]["headdim"] == 40
        assert out.shape == q.shape and out.is_contiguous() and lse.shape == (2, 4, 17)
    # Without a term the kernels take the head dim as it is (element by element).
    _cuda.flash_attn_forward(q, k, v, _checks.AttentionParams(0.1, False, -1, -1, 0.0))
    assert library.calls[-1]["headdim"] == 37
    # A multiple of 8: no padding.
    q, k, v = qkv(d=40)
    _cuda.flash_attn_forward(q, k, v, _checks.AttentionParams(0.1, False, -1, -1, 0.0, sinks=sinks))
    assert library.calls[-1]["headdim"] == 40


def test_odd_head_dim_backward_runs_padded(library):
    q, k, v = qkv(d=20)
    out, lse = torch.empty_like(q), meta(2, 4, 17, dtype=F32)
    sinks, mask = meta(4, dtype=F32), meta(2, 1, 17, 33, dtype=F32)
    dq, dk, dv, dsinks, dmask = _cuda.flash_attn_masked_backward(
        torch.empty_like(q), q, k, v, out, lse, mask,
        _checks.AttentionParams(0.2, False, -1, -1, 0.0, True, None, sinks), True,
    )  # fmt: skip
    call = library.calls[-1]
    assert call == dict(kind="backward", headdim=24, sinks=False, mask=True, dmask=False)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert dq.is_contiguous() and dk.is_contiguous() and dv.is_contiguous()
    assert dsinks.shape == (4,) and dmask.shape == mask.shape
    dq, *_ = _cuda.flash_attn_backward(
        torch.empty_like(q),
        q,
        k,
        v,
        out,
        lse,
        _checks.AttentionParams(0.2, False, -1, -1, 0.0, sinks=sinks),
    )
    assert library.calls[-1]["headdim"] == 24 and dq.shape == q.shape


def test_odd_head_dim_varlen_with_terms_runs_padded(library):
    q, k, v = meta(40, 4, 12), meta(50, 2, 12), meta(50, 2, 12)
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    out, lse = _cuda.flash_attn_forward(
        q,
        k,
        v,
        _checks.AttentionParams(0.3, True, -1, 0, 0.0, alibi_slopes=meta(4, dtype=F32)),
        cu,
        cu,
        30,
        30,
    )
    assert library.calls[-1]["headdim"] == 16 and out.shape == q.shape
    assert lse.shape == (4, 40)


@pytest.mark.filterwarnings("ignore:samattn.flash_attn_with_kvcache. head dim 36")
def test_kv_caches_of_other_head_dims_run_padded_with_terms():
    # The caches are padded copies (the appended rows copied back), the output cut back.
    q, cache = meta(2, 1, 4, 36), meta(2, 64, 2, 36)
    out = samattn.flash_attn_with_kvcache(q, cache, cache, sinks=meta(4, dtype=F32))
    assert out.shape == q.shape and out.is_contiguous()


# ------------------------------------------------------------ the route ----
def test_the_eager_route_sees_the_mask():
    q, k, v = qkv()
    assert _eager.route(q, k, v, None) == _eager.DISPATCH  # meta tensors: the fakes
    # A mask that is not a tensor is refused by the public function, not the route.
    with pytest.raises(TypeError, match=r"attn_mask must be a torch\.Tensor"):
        attention_module._masked_attention(
            "op", q, k, v, "mask", None, False, (-1, -1), 0.0, None, False, False, None
        )


def test_struct_has_room_for_the_mask():
    names = [name for name, _ in _lib.AttentionArgs._fields_]
    first = names.index("attn_mask")
    assert names[first : first + 11] == [
        "attn_mask", "mask_dtype", "mask_reserved", "mask_batch_stride", "mask_head_stride",
        "mask_q_stride", "mask_k_stride", "dmask", "dropout_p", "dropout_reserved",
        "dropout_seed",
    ]  # fmt: skip
    assert ctypes.sizeof(_lib.AttentionArgs) >= _lib.ATTENTION_PACKER.size
