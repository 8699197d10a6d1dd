"""The eager route (samattn/_eager.py) and the argument packing of samattn/_cuda.py.

Which route a call takes is decided from the tensors and torch's global state; the
direct routes pack the C argument structs in one struct.pack_into call, whose layout
must agree field by field with the ctypes structs (test_loader.py checks those against
the C header).
"""

from __future__ import annotations

import ctypes

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from samattn import _checks, _cuda, _eager, _lib, _prepared

STRUCTS = [_lib.GemmArgs, _lib.SoftmaxArgs, _lib.AttentionArgs]


@pytest.mark.parametrize("struct", STRUCTS, ids=lambda s: s.__name__)
def test_packer_writes_every_field_where_ctypes_reads_it(struct):
    values = []
    for number, (_, ctype) in enumerate(struct._fields_, start=1):
        values.append(float(number) if ctype is ctypes.c_float else number * 1001)
    args = struct()
    _lib.packer(struct).pack_into(args, 0, *values)
    assert [getattr(args, name) for name, _ in struct._fields_] == values


def _plain(*shape: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.randn(shape).to(dtype)


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_route_dispatches_what_the_direct_path_cannot_read():
    cpu, meta = _plain(4, 4), torch.empty(4, 4, device="meta")
    assert _eager.route(cpu) == _eager.DISPATCH  # validated publicly, refused by the op
    assert _eager.route(meta) == _eager.DISPATCH  # fake implementations
    assert _eager.route("not a tensor") == _eager.DISPATCH
    assert _eager.route(None, meta) == _eager.DISPATCH
    with _Passthrough():
        assert _eager.route(cpu) == _eager.DISPATCH


def test_attention_args_fields(monkeypatch):
    monkeypatch.setattr(_cuda, "_stream", lambda t: 0x5000)
    q = _plain(2, 37, 8, 64)
    k = _plain(2, 50, 4, 64)
    v = _plain(2, 50, 4, 64)
    sizes = _checks.AttentionShape(2, 8, 4, 37, 50, 64, False)
    out = torch.empty(sizes.out_shape, dtype=q.dtype)
    lse = torch.empty(sizes.lse_shape)
    dout, dq, dk, dv = (torch.empty_like(t) for t in (out, q, k, v))
    args, keep = _cuda._attention_args(
        None, sizes, q, k, v, out, lse, None, None, 0, 0,
        _checks.AttentionParams(0.25, True, 9, 0, 3.5, True), (dout, dq, dk, dv),
    )  # fmt: skip
    expected = dict(
        struct_size=ctypes.sizeof(_lib.AttentionArgs), dtype=_lib.BF16,
        family=_lib.FAMILY_AUTO, device=-1, causal=1, batch=2, nheads=8, nheads_k=4,
        seqlen_q=37, seqlen_k=50, headdim=64, cu_seqlens_q=None, cu_seqlens_k=None,
        q=q.data_ptr(), q_batch_stride=37 * 512, q_seq_stride=512, q_head_stride=64,
        k=k.data_ptr(), k_batch_stride=50 * 256, k_seq_stride=256, k_head_stride=64,
        o=out.data_ptr(), o_seq_stride=512, lse=lse.data_ptr(),
        lse_batch_stride=8 * 37, lse_head_stride=37, lse_seq_stride=1,
        softmax_scale=0.25, softcap=3.5, window_left=9, window_right=0,
        dout=dout.data_ptr(), dq=dq.data_ptr(), dk=dk.data_ptr(), dk_head_stride=64,
        dv=dv.data_ptr(), dv_seq_stride=256, deterministic=1, stream=0x5000,
        workspace=None, workspace_bytes=0,
        # No KV cache: every inference field off.
        seqused_k=None, block_table=None, page_size=0, kv_cache_batch=0, k_new=None,
        seqlen_new=0, rotary_cos=None, rotary_dim=0, num_splits=0,
        # No score terms, no mask.
        alibi_slopes=None, alibi_batch_stride=0, sinks=None, dsinks=None, attn_mask=None,
        mask_dtype=0, mask_k_stride=0, dmask=None,
        # No dropout, no fp8 cache: scales 1.0 (the header's value for 16-bit caches).
        dropout_p=0.0, dropout_seed=None, kv_fp8=0, kv_fp8_reserved=0, k_scale_ptr=None,
        v_scale_ptr=None, kv_scale_head_stride=0, k_scale_value=1.0, v_scale_value=1.0,
    )  # fmt: skip
    assert {name: getattr(args, name) for name in expected} == expected
    assert keep[0] is q  # read in place


def _f32(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_score_terms_fields():
    per_head, sinks, dsinks = _f32(1, 2, 3, 4), _f32(0, 0, 0, 0), _f32(9, 9, 9, 9)
    fields, keep = _cuda._score_terms(per_head, sinks, dsinks)
    assert fields == (per_head.data_ptr(), 0, sinks.data_ptr(), dsinks.data_ptr())
    assert keep[0] is per_head and keep[1] is sinks  # read in place
    # (batch, nheads): the row stride, in elements; a padded row is read in place.
    padded = torch.zeros(3, 6)[:, :4]
    fields, keep = _cuda._score_terms(padded, None)
    assert fields == (padded.data_ptr(), 6, 0, 0) and keep == (padded,)
    # Broadcast over the batch (stride 0), or one batch entry: per-head slopes.
    broadcast = per_head.expand(3, 4)
    assert _cuda._score_terms(broadcast, None)[0] == (per_head.data_ptr(), 0, 0, 0)
    assert _cuda._score_terms(per_head[None], None)[0][1] == 0
    # A strided head dim is copied to a contiguous one (the library reads unit strides).
    strided = torch.arange(16, dtype=torch.float32).reshape(2, 8)[:, ::2]
    fields, keep = _cuda._score_terms(strided, strided[0])
    copied, sinks_copy = keep
    assert copied.is_contiguous() and torch.equal(copied, strided) and fields[1] == 4
    assert sinks_copy.is_contiguous() and torch.equal(sinks_copy, strided[0])
    assert fields == (copied.data_ptr(), 4, sinks_copy.data_ptr(), 0)
    # One head: its stride is never stepped over.
    one = torch.zeros(2, 3)[:, :1]
    assert _cuda._score_terms(one, None)[1][0] is one


def test_attention_args_carry_the_score_terms(monkeypatch):
    monkeypatch.setattr(_cuda, "_stream", lambda t: 0)
    q = _plain(2, 5, 4, 64)
    sizes = _checks.AttentionShape(2, 4, 4, 5, 5, 64, False)
    out, lse = torch.empty_like(q), torch.empty(sizes.lse_shape)
    terms = (0x1000, 4, 0x2000, 0x3000)
    params = _checks.AttentionParams(1.0, False, -1, -1, 0.0)
    args, _ = _cuda._attention_args(
        None, sizes, q, q, q, out, lse, None, None, 0, 0, params, terms=terms
    )
    assert (args.alibi_slopes, args.alibi_batch_stride, args.sinks, args.dsinks) == terms
    assert args.attn_mask is None and args.num_splits == 0


def test_size_one_modes_get_stride_zero(monkeypatch):
    monkeypatch.setattr(_cuda, "_stream", lambda t: 0)
    q = _plain(1, 1, 8, 64)  # batch and seq of size 1: never stepped over
    sizes = _checks.AttentionShape(1, 8, 8, 1, 1, 64, False)
    out, lse = torch.empty_like(q), torch.empty(sizes.lse_shape)
    params = _checks.AttentionParams(1.0, False, -1, -1, 0.0)
    args, _ = _cuda._attention_args(None, sizes, q, q, q, out, lse, None, None, 0, 0, params)
    assert (args.q_batch_stride, args.q_seq_stride, args.q_head_stride) == (0, 0, 64)
    assert args.dout is None and args.dq_seq_stride == 0


def test_gemm_args_fields():
    a, b = _plain(16, 8, dtype=torch.float16), _plain(12, 8, dtype=torch.float16).mT
    sizes = _checks.GemmShape((16, 12), 1, 16, 12, 8)
    args, _ = _cuda._gemm_args(a, b, None, 2.0, 0.0, sizes, 0x7000)
    expected = dict(
        struct_size=ctypes.sizeof(_lib.GemmArgs), dtype=_lib.F16, allow_tf32=0, batch=1,
        m=16, n=12, k=8, a=a.data_ptr(), a_row_stride=8, a_col_stride=1, b=b.data_ptr(),
        b_row_stride=1, b_col_stride=8, c=None, d=0x7000, d_batch_stride=192,
        d_row_stride=12, d_col_stride=1, alpha=2.0, beta=0.0, workspace=None, bias=None,
        activation=0, output_fp32=0,
    )  # fmt: skip
    assert {name: getattr(args, name) for name in expected} == expected


def test_gemm_epilogue_args_fields():
    a, b = _plain(16, 8, dtype=torch.bfloat16), _plain(8, 12, dtype=torch.bfloat16)
    bias = _plain(12, dtype=torch.bfloat16)
    for name, code in (("relu", 1), ("gelu", 2), ("gelu_tanh", 3), ("silu", 4)):
        meta = [t.to("meta") for t in (a, b, bias)]
        sizes = _checks.gemm(meta[0], meta[1], None, 1.0, 0.0, meta[2], name, torch.float32)
        assert (sizes.activation, sizes.out_dtype) == (code, torch.float32)
        args, kept = _cuda._gemm_args(a, b, None, 1.0, 0.0, sizes, 0x7000, bias)
        assert (args.bias, args.activation, args.output_fp32) == (bias.data_ptr(), code, 1)
        assert kept[2] is bias
    sizes = _checks.gemm(a.to("meta"), b.to("meta"), None, 1.0, 0.0, None, None, torch.bfloat16)
    assert sizes.out_dtype is None and sizes.activation == 0


def test_window_bounds_take_int_likes():
    import numpy as np

    expected = (3, 0)
    for window in ((3, 0), [3, 0], np.array([3, 0]), (np.int64(3), np.int32(0))):
        assert _checks.window_bounds("op", window) == expected
    assert _checks.window_bounds("op", (torch.tensor(3), torch.tensor(0))) == expected
    assert _checks.window_bounds("op", torch.tensor([3, 0])) == expected
    # Negative: unbounded (-1); beyond int32: capped, which reaches every key anyway.
    assert _checks.window_bounds("op", (-7, 2**40)) == (-1, 2**31 - 1)
    for bad in ((3.0, 0), (3,), None, (True, 0), "ab"):
        with pytest.raises(ValueError, match="window_size must be a pair of ints"):
            _checks.window_bounds("op", bad)


def test_prepared_gemm_with_an_epilogue(monkeypatch):
    """A fused gemm's signature (bias layout, activation, output dtype) is cached like a
    plain one; a repeated call writes its own pointers, the bias's included, and skips the
    checks; a strided bias (copied for the kernel) is never cached. CPU tensors stand in
    for CUDA ones (the device check and the launch are replaced)."""
    launched = []

    def launch(function, size_function, args, like, expected=False, known_bytes=0):
        launched.append(_lib.GemmArgs.from_buffer_copy(args))
        return 0

    def launch_with_pointers(address, a, b, d, bias, stream, workspace, nbytes, family):
        # What samattn_gemm_with_pointers does: the entry's struct with these pointers.
        args = _lib.GemmArgs.from_buffer_copy(_lib.GemmArgs.from_address(address))
        args.a, args.b, args.d, args.bias, args.stream = a, b, d, bias, stream
        args.workspace, args.workspace_bytes = workspace, nbytes
        launched.append(args)
        return _lib.OK

    checked = []
    check = _checks.gemm
    monkeypatch.setattr(_cuda, "_stream", lambda t: 0)
    monkeypatch.setattr(_prepared, "run_with_workspace", launch)
    monkeypatch.setattr(_cuda._GEMM, "with_pointers", launch_with_pointers)
    monkeypatch.setattr(_checks, "_check_devices", lambda op, tensors: None)
    monkeypatch.setattr(_checks, "gemm", lambda *args: checked.append(1) or check(*args))
    _cuda._GEMM.clear()
    bf16 = torch.bfloat16

    def call(bias, activation="gelu"):
        a, w = _plain(16, 8, dtype=bf16), _plain(12, 8, dtype=bf16)
        out = _cuda.gemm(a, w.mT, None, 1.0, 0.0, bias, activation, torch.float32)
        assert out.dtype == torch.float32 and out.shape == (16, 12)
        args = launched[-1]
        assert (args.a, args.b, args.d) == (a.data_ptr(), w.data_ptr(), out.data_ptr())
        assert (args.activation, args.output_fp32) == (_lib.ACTIVATION_CODES[activation], 1)
        return args

    assert call(bias := _plain(12, dtype=bf16)).bias == bias.data_ptr()
    assert len(_cuda._GEMM.entries) == 1 and len(checked) == 1
    assert call(bias := _plain(12, dtype=bf16)).bias == bias.data_ptr()
    assert len(checked) == 1  # the prepared call
    strided = _plain(24, dtype=bf16)[::2]
    assert call(strided).bias != strided.data_ptr()  # a contiguous copy
    assert call(_plain(12, dtype=bf16), "silu").activation == 4
    assert len(_cuda._GEMM.entries) == 2  # the strided bias left none
    _cuda._GEMM.clear()
