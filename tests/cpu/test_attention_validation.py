"""FlashAttention without a GPU: argument validation (Python and C ABI, forward and
backward; ALiBi slopes and attention sinks included), the backward's workspace size, fake
implementations under torch.compile (training graphs included, the sinks' gradient too),
and the SDPA wrapper's fallback decision.

Python checks look at shapes and dtypes before devices, so "meta" tensors reach the fake
implementation (valid calls return meta outputs) and every message can be tested here.
C ABI cases use fake addresses: each fails validation before anything touches them.
"""

from __future__ import annotations

import ctypes
import math
import warnings

import pytest
import torch
from cpu_helpers import (
    FAKE,
    FAKE2,
    FAKE3,
    FAKE5,
    VARLEN,
    attention_args,
    backward_args,
    call_backward,
    call_forward,
    has_gpu,
    meta,
    qkv,
)
from torch._subclasses.fake_tensor import FakeTensorMode

import samattn
from samattn import _checks, _lib, _warnings
from samattn import attention as attention_module

F16, BF16 = torch.float16, torch.bfloat16


def packed(total_q=40, total_k=50, h=4, hk=2, d=64, dtype=F16, grad=False):
    return (
        meta(total_q, h, d, dtype=dtype, grad=grad),
        meta(total_k, hk, d, dtype=dtype, grad=grad),
        meta(total_k, hk, d, dtype=dtype, grad=grad),
    )


def f32(*shape: int, grad: bool = False) -> torch.Tensor:
    """A float32 meta tensor: ALiBi slopes or sinks."""
    return meta(*shape, dtype=torch.float32, grad=grad)


def offsets(*values: int, device: str = "meta", dtype=torch.int32) -> torch.Tensor:
    if device == "meta":
        return torch.empty(len(values), dtype=dtype, device="meta")
    return torch.tensor(values, dtype=dtype, device=device)


# --------------------------------------------------------- valid shapes ----
@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 33), (113, 17), (0, 5), (5, 0)])
def test_fixed_length_shapes(dtype, sq, sk):
    q, k, v = qkv(sq=sq, sk=sk, dtype=dtype)
    out = samattn.flash_attn_func(q, k, v, causal=True)
    assert out.shape == q.shape and out.dtype == dtype and out.device.type == "meta"
    out, lse, probs = samattn.flash_attn_func(q, k, v, return_attn_probs=True)
    assert lse.shape == (2, 4, sq) and lse.dtype == torch.float32 and probs is None


SCORE_TERMS = {
    "alibi per head": dict(alibi_slopes=f32(4)),
    "alibi per batch entry": dict(alibi_slopes=f32(2, 4)),
    "alibi broadcast over the batch": dict(alibi_slopes=f32(1, 4).expand(2, 4)),
    "sinks": dict(sinks=f32(4)),
    "both, causal": dict(alibi_slopes=f32(2, 4), sinks=f32(4), causal=True),
    "both, window, softcap": dict(
        alibi_slopes=f32(4), sinks=f32(4), window_size=(8, 0), softcap=30.0
    ),
}


@pytest.mark.parametrize("case", SCORE_TERMS)
def test_score_terms_shapes(case):
    q, k, v = qkv()
    out, lse, _ = samattn.flash_attn_func(q, k, v, return_attn_probs=True, **SCORE_TERMS[case])
    assert out.shape == q.shape and lse.shape == (2, 4, 17) and lse.dtype == torch.float32


def test_varlen_score_terms_shapes():
    # Varlen: batch is the number of sequences, len(cu_seqlens_q) - 1.
    q, k, v = packed()
    cu_q, cu_k = offsets(0, 10, 25, 40), offsets(0, 0, 30, 50)
    out = samattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 15, 30, alibi_slopes=f32(3, 4), sinks=f32(4)
    )
    assert out.shape == q.shape
    qkv_packed = meta(9, 3, 4, 32)
    out = samattn.flash_attn_varlen_qkvpacked_func(
        qkv_packed, offsets(0, 4, 9), 5, alibi_slopes=f32(2, 4), sinks=f32(4)
    )
    assert out.shape == (9, 4, 32)
    out = samattn.flash_attn_qkvpacked_func(meta(2, 9, 3, 4, 32), sinks=f32(4))
    assert out.shape == (2, 9, 4, 32)
    out = samattn.flash_attn_kvpacked_func(
        meta(2, 9, 4, 32), meta(2, 5, 2, 1, 32), alibi_slopes=f32(4), sinks=f32(4)
    )
    assert out.shape == (2, 9, 4, 32)


def test_varlen_shapes():
    q, k, v = packed()
    cu_q, cu_k = offsets(0, 10, 40), offsets(0, 0, 50)
    out, lse, probs = samattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 30, 50, window_size=(8, 0), return_attn_probs=True
    )
    assert out.shape == q.shape and lse.shape == (4, 40) and probs is None


def test_packed_variants_shapes():
    qkv_fixed = meta(2, 9, 3, 4, 32)
    assert samattn.flash_attn_qkvpacked_func(qkv_fixed).shape == (2, 9, 4, 32)
    q, kv = meta(2, 9, 4, 32), meta(2, 5, 2, 1, 32)
    assert samattn.flash_attn_kvpacked_func(q, kv).shape == (2, 9, 4, 32)
    cu = offsets(0, 4, 9)
    assert samattn.flash_attn_varlen_qkvpacked_func(meta(9, 3, 4, 32), cu, 5).shape == (9, 4, 32)
    out = samattn.flash_attn_varlen_kvpacked_func(
        meta(9, 4, 32), meta(7, 2, 2, 32), cu, offsets(0, 3, 7), 5, 4
    )
    assert out.shape == (9, 4, 32)


# --------------------------------------------------- bad Python inputs ----
def _fixed(**changes):
    """flash_attn_func on valid meta inputs, with `changes` to tensors or keywords."""
    q, k, v = qkv()
    tensors = {"q": q, "k": k, "v": v}
    for name in ("q", "k", "v"):
        if name in changes:
            tensors[name] = changes.pop(name)
    return samattn.flash_attn_func(tensors["q"], tensors["k"], tensors["v"], **changes)


BAD_FIXED = {
    "q not a tensor": (dict(q=[1.0]), TypeError, "q must be a torch.Tensor"),
    "q 3-D": (dict(q=meta(17, 4, 64)), ValueError, "q must be 4-D (batch, seqlen, nheads"),
    "k 5-D": (dict(k=meta(2, 33, 2, 64, 1)), ValueError, "k must be 4-D"),
    "batch differs": (dict(k=meta(3, 33, 2, 64), v=meta(3, 33, 2, 64)), ValueError, "q has batch"),
    "v seqlen differs": (dict(v=meta(2, 32, 2, 64)), ValueError, "k and v must agree"),
    "v heads differ": (dict(v=meta(2, 33, 4, 64)), ValueError, "k and v must agree"),
    "k head dim differs": (
        dict(k=meta(2, 33, 2, 32), v=meta(2, 33, 2, 32)),
        ValueError,
        "k has head dim 32 but q has 64",
    ),
    "v head dim differs": (dict(v=meta(2, 33, 2, 32)), ValueError, "v has head dim 32"),
    "head dim > 256": (
        dict(q=meta(2, 17, 4, 264), k=meta(2, 33, 2, 264), v=meta(2, 33, 2, 264)),
        ValueError,
        "head dim must be in 1..256, got 264",
    ),
    "head dim 0": (
        dict(q=meta(2, 17, 4, 0), k=meta(2, 33, 2, 0), v=meta(2, 33, 2, 0)),
        ValueError,
        "head dim must be in 1..256, got 0",
    ),
    "GQA not divisible": (
        dict(k=meta(2, 33, 3, 64), v=meta(2, 33, 3, 64)),
        ValueError,
        "q has 4 heads and k, v have 3",
    ),
    "more kv heads than q heads": (
        dict(k=meta(2, 33, 8, 64), v=meta(2, 33, 8, 64)),
        ValueError,
        "q has 4 heads and k, v have 8",
    ),
    "float32": (
        dict(q=meta(2, 17, 4, 64, dtype=torch.float32)),
        TypeError,
        "q has dtype torch.float32; samattn attention supports",
    ),
    "k dtype differs": (
        dict(k=meta(2, 33, 2, 64, dtype=BF16)),
        TypeError,
        "k has dtype torch.bfloat16 but q has torch.float16",
    ),
    "cpu tensors": (
        dict(
            q=torch.empty(2, 17, 4, 64, dtype=F16),
            k=torch.empty(2, 33, 2, 64, dtype=F16),
            v=torch.empty(2, 33, 2, 64, dtype=F16),
        ),
        ValueError,
        "need CUDA tensors, but q is on cpu",
    ),
    "mixed devices": (dict(v=torch.empty(2, 33, 2, 64, dtype=F16)), ValueError, "v is on cpu"),
    "softmax_scale nan": (dict(softmax_scale=math.nan), ValueError, "softmax_scale must be finite"),
    "softmax_scale str": (dict(softmax_scale="0.1"), TypeError, "softmax_scale must be a float"),
    "window_size one int": (dict(window_size=4), ValueError, "window_size must be a pair"),
    "window_size triple": (dict(window_size=(1, 2, 3)), ValueError, "window_size must be a pair"),
    "window_size floats": (dict(window_size=(1.5, 2)), ValueError, "window_size must be a pair"),
    "softcap negative": (dict(softcap=-1.0), ValueError, "softcap must be finite and >= 0"),
    "softcap inf": (dict(softcap=math.inf), ValueError, "softcap must be finite"),
    "dropout of 1": (dict(dropout_p=1.0), ValueError, "dropout_p must be < 1"),
    "dropout out of range": (dict(dropout_p=1.5), ValueError, "dropout_p must be in [0, 1]"),
    "alibi float16": (
        dict(alibi_slopes=meta(4)),
        TypeError,
        "alibi_slopes must have dtype torch.float32 (flash-attn's rule), got torch.float16",
    ),
    "alibi per kv head": (
        dict(alibi_slopes=f32(2)),
        ValueError,
        "alibi_slopes must have shape (nheads,) = (4,) or (batch, nheads) = (2, 4), got (2,)",
    ),
    "alibi (nheads, batch)": (dict(alibi_slopes=f32(4, 2)), ValueError, "got (4, 2)"),
    "alibi 3-D": (dict(alibi_slopes=f32(2, 4, 1)), ValueError, "alibi_slopes must have shape"),
    "alibi not a tensor": (
        dict(alibi_slopes=[0.5] * 4),
        TypeError,
        "alibi_slopes must be a torch.Tensor, got list",
    ),
    "alibi on cpu": (
        dict(alibi_slopes=torch.ones(4)),
        ValueError,
        "need CUDA tensors, but alibi_slopes is on cpu",
    ),
    "sinks bfloat16": (
        dict(sinks=meta(4, dtype=BF16)),
        TypeError,
        "sinks must have dtype torch.float32 (one logit per query head), got torch.bfloat16",
    ),
    "sinks per kv head": (
        dict(sinks=f32(2)),
        ValueError,
        "sinks must have shape (nheads,) = (4,), one logit per query head, got (2,)",
    ),
    "sinks (batch, nheads)": (dict(sinks=f32(2, 4)), ValueError, "got (2, 4)"),
    "sinks a float": (dict(sinks=0.5), TypeError, "sinks must be a torch.Tensor, got float"),
    "sinks on cpu": (dict(sinks=torch.zeros(4)), ValueError, "but sinks is on cpu"),
}


@pytest.mark.parametrize("case", BAD_FIXED)
def test_flash_attn_func_rejects(case):
    changes, error, fragment = BAD_FIXED[case]
    with pytest.raises(error) as info:
        _fixed(**changes)
    assert fragment in str(info.value) and "samattn.flash_attn_func" in str(info.value)
    if error is ValueError:  # also a RuntimeError, which flash-attn's checks raise
        assert isinstance(info.value, samattn.ArgumentError), type(info.value)


def _varlen(total_q=40, total_k=50, **changes):
    q, k, v = packed(total_q, total_k)
    args = dict(
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=offsets(0, 10, total_q),
        cu_seqlens_k=offsets(0, 20, total_k),
        max_seqlen_q=30,
        max_seqlen_k=30,
    )
    args.update(changes)
    return samattn.flash_attn_varlen_func(**args)


def _cpu_varlen(cu_q, cu_k, max_q=30, max_k=30):
    """A varlen call whose offsets are readable CPU tensors (the tensors are CPU too)."""
    q = torch.empty(40, 4, 64, dtype=F16)
    k = v = torch.empty(50, 2, 64, dtype=F16)
    return samattn.flash_attn_varlen_func(
        q, k, v, offsets(*cu_q, device="cpu"), offsets(*cu_k, device="cpu"), max_q, max_k
    )


BAD_VARLEN = {
    "q 4-D": (dict(q=meta(1, 40, 4, 64)), ValueError, "q must be 3-D (total_tokens, nheads"),
    "cu_seqlens int64": (
        dict(cu_seqlens_q=offsets(0, 10, 40, dtype=torch.int64)),
        TypeError,
        "cu_seqlens_q must have dtype torch.int32, got torch.int64",
    ),
    "cu_seqlens float": (
        dict(cu_seqlens_k=offsets(0, 20, 50, dtype=torch.float32)),
        TypeError,
        "cu_seqlens_k must have dtype torch.int32",
    ),
    "cu_seqlens 2-D": (
        dict(cu_seqlens_q=torch.empty(3, 1, dtype=torch.int32, device="meta")),
        ValueError,
        "cu_seqlens_q must be 1-D with batch + 1 offsets",
    ),
    "cu_seqlens empty": (
        dict(cu_seqlens_k=torch.empty(0, dtype=torch.int32, device="meta")),
        ValueError,
        "cu_seqlens_k must be 1-D with batch + 1 offsets",
    ),
    "cu_seqlens lengths differ": (
        dict(cu_seqlens_k=offsets(0, 20, 30, 50)),
        ValueError,
        "cu_seqlens_q has 3 offsets but cu_seqlens_k has 4",
    ),
    "cu_seqlens not a tensor": (
        dict(cu_seqlens_q=[0, 10, 40]),
        TypeError,
        "cu_seqlens_q must be a torch.Tensor",
    ),
    "max_seqlen negative": (dict(max_seqlen_q=-1), ValueError, "max_seqlen_q must be >= 0"),
    "max_seqlen too large": (
        dict(max_seqlen_k=51),
        ValueError,
        "max_seqlen_k = 51 exceeds the 50 tokens",
    ),
    "max_seqlen float": (dict(max_seqlen_q=3.0), TypeError, "max_seqlen_q must be an int"),
    "cu_seqlens on cpu, tensors on meta": (
        dict(cu_seqlens_q=offsets(0, 10, 40, device="cpu")),
        ValueError,
        "cu_seqlens_q is on cpu",
    ),
    "k heads not dividing": (
        dict(k=meta(50, 3, 64), v=meta(50, 3, 64)),
        ValueError,
        "q has 4 heads and k, v have 3",
    ),
    "block_table with packed k": (
        dict(block_table=meta(2, 4, dtype=torch.int32)),
        ValueError,
        "with block_table, k must be a 4-D paged cache",
    ),
    # Two sequences: (batch, nheads) is (2, 4), whatever the packed rows.
    "alibi of the packed rows": (
        dict(alibi_slopes=f32(40, 4)),
        ValueError,
        "alibi_slopes must have shape (nheads,) = (4,) or (batch, nheads) = (2, 4), got (40, 4)",
    ),
    "sinks of every row": (dict(sinks=f32(40, 4)), ValueError, "sinks must have shape"),
}


@pytest.mark.parametrize("case", BAD_VARLEN)
def test_flash_attn_varlen_func_rejects(case):
    changes, error, fragment = BAD_VARLEN[case]
    with pytest.raises(error) as info:
        _varlen(**changes)
    assert fragment in str(info.value)
    if error is ValueError:
        assert isinstance(info.value, samattn.ArgumentError), type(info.value)


BAD_OFFSETS = {
    "non-monotonic": (((0, 30, 20, 40), (0, 10, 20, 50)), "cu_seqlens_q must be non-decreasing"),
    "exceeding the tensor": (((0, 10, 41), (0, 20, 50)), "cu_seqlens_q[-1] = 41 exceeds the 40"),
    "exceeding k": (((0, 10, 40), (0, 20, 51)), "cu_seqlens_k[-1] = 51 exceeds the 50"),
    "negative start": (((-1, 10, 40), (0, 20, 50)), "cu_seqlens_q[0] must be >= 0"),
    "longer than max_seqlen": (
        ((0, 5, 40), (0, 20, 50)),
        "sequence 1 has 35 tokens (cu_seqlens_q[2] - cu_seqlens_q[1]) but max_seqlen_q is 30",
    ),
}


@pytest.mark.parametrize("case", BAD_OFFSETS)
def test_bad_offset_values(case):
    (cu_q, cu_k), fragment = BAD_OFFSETS[case]
    with pytest.raises(RuntimeError) as info:  # samattn.ArgumentError: a ValueError too
        _cpu_varlen(cu_q, cu_k)
    assert fragment in str(info.value) and isinstance(info.value, ValueError)


def test_good_offset_values_reach_the_device_check():
    # Offsets with empty and one-token sequences are fine; then the CPU tensors are refused.
    with pytest.raises(ValueError, match="need CUDA tensors"):
        _cpu_varlen((0, 0, 1, 30, 40), (0, 20, 20, 21, 50))


def test_cu_seqlens_values_is_pure():
    check = _checks.cu_seqlens_values
    check("op", "cu", [0], 0, 0, "max")  # empty batch
    check("op", "cu", [0, 0, 1, 1], 1, 1, "max")
    check("op", "cu", [2, 5], 10, 3, "max")  # offsets need not start at 0
    with pytest.raises(ValueError, match="non-decreasing"):
        check("op", "cu", [0, 2, 1], 5, 5, "max")


@pytest.mark.parametrize(
    "fn, packed_arg, fragment",
    [
        (samattn.flash_attn_qkvpacked_func, (meta(2, 9, 4, 32),), "qkv must be 5-D"),
        (samattn.flash_attn_qkvpacked_func, (meta(2, 9, 2, 4, 32),), "qkv must be 5-D"),
        (samattn.flash_attn_kvpacked_func, (meta(2, 9, 4, 32), meta(2, 5, 3, 2, 32)), "kv must"),
        (samattn.flash_attn_varlen_qkvpacked_func, (meta(9, 4, 32), offsets(0, 9), 9), "qkv"),
        (
            samattn.flash_attn_varlen_kvpacked_func,
            (meta(9, 4, 32), meta(9, 2, 32), offsets(0, 9), offsets(0, 9), 9, 9),
            "kv must be 4-D (total_k, 2, nheads_k, headdim)",
        ),
    ],
)
def test_packed_layouts_rejected(fn, packed_arg, fragment):
    with pytest.raises(ValueError, match=None) as info:
        fn(*packed_arg)
    assert fragment in str(info.value)


# ----------------------------------------------------------- the C ABI ----


BAD_C = {
    "float32": (dict(dtype=_lib.F32), "dtype must be SAMATTN_F16 or SAMATTN_BF16, got float32"),
    "unknown dtype": (dict(dtype=9), "unknown dtype code 9"),
    "unknown family": (dict(family=42), "unknown family code 42"),
    "negative device": (dict(device=-1), "device must be"),
    "negative batch": (dict(batch=-1), "sizes must be >= 0, got batch=-1"),
    "negative seqlen_k": (dict(seqlen_k=-3), "seqlen_k=-3"),
    "head dim 0": (dict(headdim=0), "headdim must be in 1..256, got 0"),
    "head dim 264": (dict(headdim=264), "headdim must be in 1..256, got 264"),
    "GQA not divisible": (dict(nheads_k=3), "nheads (4) must be a multiple of nheads_k (3"),
    "no kv heads": (dict(nheads_k=0), "nheads_k (0 >= 1)"),
    "batch too large": (dict(batch=70000), "must be <= 65535"),
    "heads too large": (dict(nheads=70000, nheads_k=1), "must be <= 65535"),
    "seqlen too large": (dict(seqlen_q=2**31), "must be < 2^31"),
    "causal 2": (dict(causal=2), "causal must be 0 or 1, got 2"),
    "scale nan": (dict(softmax_scale=math.nan), "softmax_scale must be finite, got nan"),
    "softcap negative": (dict(softcap=-1.0), "softcap must be finite and >= 0"),
    "softcap inf": (dict(softcap=math.inf), "softcap must be finite"),
    "negative workspace": (dict(workspace_bytes=-1), "workspace_bytes must be >= 0"),
    "only cu_seqlens_q": (dict(cu_seqlens_q=FAKE), "got cu_seqlens_k NULL"),
    "only cu_seqlens_k": (dict(cu_seqlens_k=FAKE), "got cu_seqlens_q NULL"),
    "cu_seqlens misaligned": ({**VARLEN, "cu_seqlens_k": FAKE + 2}, "4-byte aligned"),
    "max_seqlen_q > rows": ({**VARLEN, "max_seqlen_q": 17}, "max_seqlen_q=17 seqlen_q=16"),
    "max_seqlen_k negative": ({**VARLEN, "max_seqlen_k": -1}, "max_seqlen_k=-1"),
    "null q": (dict(q=None), "q is NULL"),
    "null k": (dict(k=None), "k is NULL"),
    "null v": (dict(v=None), "v is NULL"),
    "null o": (dict(o=None), "o is NULL"),
    "q misaligned": (dict(q=FAKE + 1), "q must be aligned to its 2-byte elements"),
    "o misaligned": (dict(o=FAKE + 3), "o must be aligned to its 2-byte elements"),
    "negative q stride": (dict(q_batch_stride=-8), "q strides (batch, seq, head) (-8,"),
    "negative v head stride": (dict(v_head_stride=-1), "v strides (batch, seq, head)"),
    "o overlaps": (dict(o_seq_stride=0), "make elements of o overlap"),
    "o batch overlaps": (dict(o_batch_stride=0), "make elements of o overlap"),
    "lse misaligned": (dict(lse=FAKE + 2), "lse must be 4-byte aligned"),
    "lse negative stride": (dict(lse_head_stride=-1), "lse strides (batch, head, seq)"),
    "lse overlaps": (dict(lse_seq_stride=0), "make elements of lse overlap"),
    "q overflows": (dict(q_batch_stride=2**62), "q sizes and strides overflow"),
    "lse overflows": (dict(lse_batch_stride=2**62), "lse sizes and strides overflow"),
    # The score terms (ABI 6).
    "alibi misaligned": (dict(alibi_slopes=FAKE + 2), "4-byte aligned"),
    "sinks misaligned": (dict(sinks=FAKE + 1), "4-byte aligned"),
    "alibi stride without slopes": (dict(alibi_batch_stride=4), "alibi_batch_stride must be"),
    "alibi stride negative": (
        dict(alibi_slopes=FAKE, alibi_batch_stride=-4),
        "alibi_batch_stride must be",
    ),
    "alibi stride below nheads": (
        dict(alibi_slopes=FAKE, alibi_batch_stride=2),
        "alibi_batch_stride must be",
    ),
    "dsinks in a forward": (dict(sinks=FAKE, dsinks=FAKE + 256), "dsinks is backward-only"),
    # fp8 KV caches (appended to ABI 6).
    "kv_fp8 unknown": (dict(kv_fp8=3), "kv_fp8 must be 0 (k and v hold dtype), SAMATTN_F8_E4M3"),
    "kv_fp8 reserved": (dict(kv_fp8=_lib.F8_E4M3, kv_fp8_reserved=1), "kv_fp8_reserved must"),
    "scale pointer without fp8": (dict(k_scale_ptr=FAKE), "belong to fp8 caches (kv_fp8)"),
    "scale stride without fp8": (dict(kv_scale_head_stride=1), "belong to fp8 caches"),
    "fp8 head dim 40": (dict(kv_fp8=_lib.F8_E4M3, headdim=40), "multiple of 16"),
    "fp8 scale stride 2": (
        dict(kv_fp8=_lib.F8_E5M2, kv_scale_head_stride=2),
        "kv_scale_head_stride must be 0",
    ),
    "fp8 scale misaligned": (
        dict(kv_fp8=_lib.F8_E4M3, v_scale_ptr=FAKE + 2),
        "v_scale_ptr must be a 4-byte aligned fp32 array",
    ),
    "fp8 scale value 0": (
        dict(kv_fp8=_lib.F8_E4M3, k_scale_value=0.0),
        "k_scale_value must be finite and > 0",
    ),
    "fp8 scale value nan": (
        dict(kv_fp8=_lib.F8_E4M3, v_scale_value=math.nan),
        "v_scale_value must be finite and > 0",
    ),
    "fp8 without kv_cache_batch": (
        dict(kv_fp8=_lib.F8_E4M3),
        "kv_cache_batch (the caches' leading extent) must be in 1..2^31-1",
    ),
    "fp8 cache rows off 16 bytes": (
        dict(kv_fp8=_lib.F8_E4M3, kv_cache_batch=2, k_seq_stride=136),
        "the fp8 cache k must be 16-byte aligned with strides",
    ),
    "fp8 with dropout": (
        dict(kv_fp8=_lib.F8_E4M3, kv_cache_batch=2, dropout_p=0.1, dropout_seed=FAKE),
        "dropout does not combine with the KV-cache fields",
    ),
}


@pytest.mark.parametrize("case", BAD_C)
def test_c_abi_rejects(case):
    changes, fragment = BAD_C[case]
    status, used, message = call_forward(attention_args(**changes))
    assert status == _lib.INVALID_ARGUMENT, message
    assert fragment in message, message
    assert message.startswith("samattn attention_forward") and used == _lib.FAMILY_AUTO


def test_c_abi_null_args():
    status, _, message = call_forward(None)
    assert status == _lib.INVALID_ARGUMENT and "args is NULL" in message
    assert _lib.lib().samattn_attention_forward(None, None) == _lib.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "empty",
    [dict(batch=0), dict(nheads=0), dict(seqlen_q=0), {**VARLEN, "max_seqlen_q": 0}],
    ids=["batch 0", "nheads 0", "seqlen_q 0", "varlen max_seqlen_q 0"],
)
def test_c_abi_empty_output_touches_nothing(empty):
    args = attention_args(q=None, k=None, v=None, o=None, lse=None, **empty)
    assert call_forward(args)[:2] == (_lib.OK, _lib.FAMILY_AUTO)


@pytest.mark.skipif(has_gpu(), reason="checks the no-GPU path")
@pytest.mark.parametrize(
    "changes",
    [
        dict(),
        dict(seqlen_k=0, k=None, v=None),  # no keys: K and V are never read
        dict(lse=None),
        VARLEN,
        dict(family=80, dtype=_lib.BF16, causal=1, window_left=3, softcap=30.0),
        dict(headdim=37),  # any head dim: element-by-element rows
        dict(q=FAKE + 2, k_seq_stride=129, v_head_stride=63),  # rows off 16 bytes
        dict(alibi_slopes=FAKE, sinks=FAKE + 64),
        {**VARLEN, "alibi_slopes": FAKE, "alibi_batch_stride": 4, "sinks": FAKE + 4, "causal": 1},
        dict(kv_fp8=_lib.F8_E5M2, kv_cache_batch=2, k_scale_ptr=FAKE, kv_scale_head_stride=1),
    ],
    ids=[
        "plain", "no keys", "no lse", "varlen", "bf16 forced", "head dim 37", "odd strides",
        "alibi and sinks", "varlen, alibi per sequence, sinks", "fp8 caches",
    ],
)  # fmt: skip
def test_c_abi_valid_arguments_reach_the_device(changes):
    status, used, message = call_forward(attention_args(**changes))
    assert status == _lib.CUDA_ERROR and "no CUDA device" in message, message
    assert used == _lib.FAMILY_AUTO


# ------------------------------------------------------ C ABI backward ----
FAKE6 = 0x60000  # dsinks


def workspace_size(args) -> tuple[int, int, str]:
    size = ctypes.c_int64(-1)
    pointer = ctypes.byref(args) if args is not None else None
    status = _lib.lib().samattn_attention_backward_workspace_size(pointer, ctypes.byref(size))
    return status, size.value, _lib.last_error() if status != _lib.OK else ""


BAD_C_BACKWARD = {
    # The forward's rules apply...
    "float32": (dict(dtype=_lib.F32), "dtype must be SAMATTN_F16 or SAMATTN_BF16"),
    "head dim 257": (dict(headdim=257), "got 257"),
    "GQA not divisible": (dict(nheads_k=3), "must be a multiple of nheads_k (3"),
    "q misaligned": (dict(q=FAKE + 1), "q must be aligned to its 2-byte elements"),
    "cu_seqlens misaligned": ({**VARLEN, "cu_seqlens_q": FAKE + 2}, "4-byte aligned"),
    # ... and the backward's own.
    "deterministic 2": (dict(deterministic=2), "deterministic must be 0 or 1, got 2"),
    "null o": (dict(o=None), "o is NULL"),
    "null dout": (dict(dout=None), "dout is NULL"),
    "null dq": (dict(dq=None), "dq is NULL"),
    "null dk": (dict(dk=None), "dk is NULL"),
    "null dv": (dict(dv=None), "dv is NULL"),
    "null lse": (dict(lse=None), "lse is NULL; the backward needs the forward's log-sum-exp"),
    "dout misaligned": (dict(dout=FAKE2 + 1), "dout must be aligned to its 2-byte elements"),
    "dv misaligned": (dict(dv=FAKE5 + 3), "dv must be aligned to its 2-byte elements"),
    "dout negative stride": (dict(dout_seq_stride=-260), "dout strides (batch, seq, head)"),
    "dq negative stride": (dict(dq_head_stride=-64), "dq strides (batch, seq, head)"),
    "dq overlaps": (dict(dq_seq_stride=0), "make elements of dq overlap"),
    "dk overlaps": (dict(dk_head_stride=0), "make elements of dk overlap"),
    "dv batch overlaps": (dict(dv_batch_stride=0), "make elements of dv overlap"),
    "dv overflows": (dict(dv_batch_stride=2**62), "dv sizes and strides overflow"),
    "dq is q": (dict(dq=FAKE), "dq and q are the same memory"),
    "dk is dv": (dict(dk=FAKE5), "dk and dv are the same memory"),
    "dv is dout": (dict(dv=FAKE2), "dv and dout are the same memory"),
    "no workspace": (dict(workspace=None), "bytes of workspace, got 0"),
    "small workspace": (dict(workspace_bytes=1024), "bytes of workspace, got 1024"),
    "workspace misaligned": (dict(workspace=FAKE + 16), "workspace must be 256-byte aligned"),
    "lse overlaps": (dict(lse_seq_stride=0), "make elements of lse overlap"),
    "dsinks without sinks": (dict(dsinks=FAKE6), "dsinks (the sinks' gradient) needs sinks"),
    "dsinks misaligned": (dict(sinks=FAKE, dsinks=FAKE6 + 2), "4-byte aligned"),
    "alibi misaligned": (dict(alibi_slopes=FAKE + 3), "4-byte aligned"),
    "fp8 caches": (dict(kv_fp8=_lib.F8_E4M3), "fp8 KV caches (kv_fp8) are forward-only"),
}


@pytest.mark.parametrize("case", BAD_C_BACKWARD)
def test_c_abi_backward_rejects(case):
    changes, fragment = BAD_C_BACKWARD[case]
    status, used, message = call_backward(backward_args(**changes))
    too_small = "bytes of workspace" in fragment  # the caller can retry with more
    assert status == (_lib.NEEDS_WORKSPACE if too_small else _lib.INVALID_ARGUMENT), message
    assert fragment in message, message
    assert message.startswith("samattn attention_backward") and used == _lib.FAMILY_AUTO


def test_c_abi_backward_null_args():
    status, _, message = call_backward(None)
    assert status == _lib.INVALID_ARGUMENT and "args is NULL" in message
    assert _lib.lib().samattn_attention_backward(None, None) == _lib.INVALID_ARGUMENT
    assert workspace_size(None)[0] == _lib.INVALID_ARGUMENT
    size = ctypes.c_int64()
    lib = _lib.lib()
    assert lib.samattn_attention_backward_workspace_size(None, ctypes.byref(size)) == 1
    args = backward_args()
    assert lib.samattn_attention_backward_workspace_size(ctypes.byref(args), None) == 1


@pytest.mark.parametrize(
    "empty",
    [dict(batch=0), dict(nheads=0), dict(seqlen_q=0, seqlen_k=0)],
    ids=["batch 0", "nheads 0", "no rows"],
)
def test_c_abi_backward_empty_touches_nothing(empty):
    nothing = dict(q=None, k=None, v=None, o=None, lse=None, dout=None, dq=None, dk=None, dv=None)
    args = backward_args(workspace=None, workspace_bytes=0, **nothing, **empty)
    assert call_backward(args)[:2] == (_lib.OK, _lib.FAMILY_AUTO)
    assert workspace_size(args)[:2] == (_lib.OK, 0)


def _align(n: int) -> int:
    return (n + 255) // 256 * 256


def expected_workspace(b, h, hk, sq, sk, d, deterministic, rows_q=None, rows_k=None) -> int:
    """attention_problem.h's layout: dQ accumulator (query tiles of up to 128 rows of the
    padded head dim, each sequence starting up to one tile further), dK and dV per query
    head (GQA), D, semaphores (deterministic)."""
    rows_q = b * sq if rows_q is None else rows_q
    rows_k = b * sk if rows_k is None else rows_k
    kv_rows = rows_k if h != hk else 0
    padded_d = next(p for p in (32, 64, 96, 128, 192, 256) if d <= p)
    dq_rows = rows_q + b * 128 if rows_q else 0
    total = _align(h * dq_rows * padded_d * 4) + 2 * _align(h * kv_rows * d * 4)
    total += _align(h * rows_q * 4)
    if deterministic:
        total += _align(b * h * ((sq + 15) // 16) * 4)
    return total


@pytest.mark.parametrize("deterministic", [0, 1])
@pytest.mark.parametrize(
    "changes",
    [dict(), dict(nheads_k=4), dict(headdim=256, seqlen_q=1000, seqlen_k=3), VARLEN],
    ids=["GQA", "MHA", "d256", "varlen"],
)
def test_backward_workspace_size(changes, deterministic):
    # Pointers are not inspected: the size can be asked before anything is allocated.
    nothing = dict(q=None, k=None, v=None, o=None, lse=None, dout=None, dq=None, dk=None, dv=None)
    args = backward_args(deterministic=deterministic, **nothing, **changes)
    status, size, message = workspace_size(args)
    assert status == _lib.OK, message
    b, h, hk, d = args.batch, args.nheads, args.nheads_k, args.headdim
    if args.cu_seqlens_q:  # varlen: packed rows, sequences up to max_seqlen
        expected = expected_workspace(
            b, h, hk, args.max_seqlen_q, args.max_seqlen_k, d, deterministic,
            rows_q=args.seqlen_q, rows_k=args.seqlen_k,
        )  # fmt: skip
    else:
        expected = expected_workspace(b, h, hk, args.seqlen_q, args.seqlen_k, d, deterministic)
    assert size == expected


def test_backward_workspace_size_validates_sizes():
    status, size, message = workspace_size(backward_args(headdim=300))
    assert status == _lib.INVALID_ARGUMENT and size == 0
    assert message.startswith("samattn attention_backward_workspace_size") and "got 300" in message
    status, _, message = workspace_size(backward_args(deterministic=3))
    assert status == _lib.INVALID_ARGUMENT and "deterministic must be 0 or 1" in message


@pytest.mark.skipif(has_gpu(), reason="checks the no-GPU path")
@pytest.mark.parametrize(
    "changes",
    [
        dict(),
        dict(seqlen_k=0, k=None, v=None, dk=None, dv=None),  # no keys: dq = 0 only
        dict(seqlen_q=0, q=None, o=None, dout=None, dq=None, lse=None),  # no queries: dk = dv = 0
        VARLEN,
        dict(family=80, dtype=_lib.BF16, causal=1, window_left=3, softcap=30.0, deterministic=1),
        dict(headdim=5),
        dict(dq=FAKE3 + 2, dv_seq_stride=65),
        dict(alibi_slopes=FAKE, alibi_batch_stride=8, sinks=FAKE + 64, dsinks=FAKE6),
        dict(sinks=FAKE, dsinks=FAKE6 + 4, deterministic=1),
    ],
    ids=[
        "plain",
        "no keys",
        "no queries",
        "varlen",
        "bf16 forced deterministic",
        "head dim 5",
        "odd strides",
        "alibi, sinks and dsinks",
        "dsinks deterministic",
    ],
)
def test_c_abi_backward_valid_arguments_reach_the_device(changes):
    status, used, message = call_backward(backward_args(**changes))
    assert status == _lib.CUDA_ERROR and "no CUDA device" in message, message
    assert used == _lib.FAMILY_AUTO


# ------------------------------------------------ torch.compile and fakes ----
def attend(q, k, v):
    return samattn.flash_attn_func(q, k, v, causal=True, window_size=(16, 0), softcap=20.0)


def attend_varlen(q, k, v, cu_q, cu_k):
    out, lse, _ = samattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 30, 30, causal=True, return_attn_probs=True
    )
    return out * 2, lse


def attend_sdpa(q, k, v):
    return samattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_shapes(backend):
    torch._dynamo.reset()
    q, k, v = qkv(dtype=BF16)
    out = torch.compile(attend, fullgraph=True, backend=backend)(q, k, v)
    assert out.shape == q.shape and out.dtype == BF16 and out.device.type == "meta"
    q, k, v = packed()
    out, lse = torch.compile(attend_varlen, fullgraph=True, backend=backend)(
        q, k, v, offsets(0, 10, 40), offsets(0, 20, 50)
    )
    assert out.shape == q.shape and lse.shape == (4, 40)
    q, k, v = meta(2, 4, 17, 64), meta(2, 2, 17, 64), meta(2, 2, 17, 64)
    out = torch.compile(attend_sdpa, fullgraph=True, backend=backend)(q, k, v)
    assert out.shape == (2, 4, 17, 64)


@pytest.mark.parametrize("fn, make", [(attend, qkv), (attend_sdpa, None)])
def test_no_graph_break(fn, make):
    torch._dynamo.reset()
    args = make() if make else (meta(2, 4, 17, 64), meta(2, 2, 17, 64), meta(2, 2, 17, 64))
    explanation = torch._dynamo.explain(fn)(*args)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_compiled_training_graph_traces_the_backward():
    # The backward op's fake gives shapes, so a training graph compiles before the kernel
    # exists; gradients of meta tensors come from it.
    torch._dynamo.reset()
    q, k, v = qkv(dtype=F16, grad=True)
    out = torch.compile(attend, fullgraph=True, backend="aot_eager")(q, k, v)
    out.sum().backward()
    assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)


def train_varlen(q, k, v, cu_q, cu_k):
    out = samattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 30, causal=True)
    return out.float().square().sum()


def train_sdpa(q, k, v):
    return attend_sdpa(q, k, v).sum()


def train_packed(qkv):
    return samattn.flash_attn_qkvpacked_func(qkv, causal=True, deterministic=True).sum()


def _training_inputs(which: str) -> tuple[tuple[torch.Tensor, ...], tuple]:
    """(leaf tensors that require grad, other arguments) of train_<which>."""
    if which == "varlen":
        return packed(grad=True), (offsets(0, 10, 40), offsets(0, 20, 50))
    if which == "sdpa":  # (batch, heads, seq, dim), GQA
        shapes = ((2, 4, 17, 64), (2, 2, 9, 64), (2, 2, 9, 64))
        return tuple(meta(*shape, grad=True) for shape in shapes), ()
    return (meta(2, 9, 3, 4, 32, grad=True),), ()


TRAINING = {"varlen": train_varlen, "sdpa": train_sdpa, "qkvpacked": train_packed}


@pytest.mark.parametrize("which", TRAINING)
def test_compiled_training_graphs(which):
    # Forward and backward traced through the ops' fakes (aot_eager compiles the backward
    # graph as well); gradients of the meta leaves come out with their shapes.
    torch._dynamo.reset()
    leaves, extra = _training_inputs(which)
    loss = torch.compile(TRAINING[which], fullgraph=True, backend="aot_eager")(*leaves, *extra)
    loss.backward()
    for t in leaves:
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype


@pytest.mark.parametrize("which", TRAINING)
def test_training_loss_has_no_graph_break(which):
    torch._dynamo.reset()
    leaves, extra = _training_inputs(which)
    explanation = torch._dynamo.explain(TRAINING[which])(*leaves, *extra)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_fake_cuda_tensors_keep_device_and_dtype():
    with FakeTensorMode():
        q = torch.empty(2, 9, 8, 128, dtype=BF16, device="cuda")
        k = v = torch.empty(2, 12, 1, 128, dtype=BF16, device="cuda")
        out, lse, _ = samattn.flash_attn_func(q, k, v, return_attn_probs=True)
        assert out.shape == q.shape and out.device.type == "cuda" and out.dtype == BF16
        assert lse.shape == (2, 8, 9) and lse.dtype == torch.float32
        q = torch.empty(9, 8, 128, dtype=BF16, device="cuda")
        k = v = torch.empty(12, 1, 128, dtype=BF16, device="cuda")
        cu = torch.empty(3, dtype=torch.int32, device="cuda")
        out = samattn.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9)
        assert out.shape == (9, 8, 128) and out.device.type == "cuda"


def _op_args(varlen: bool, grad: bool = False):
    if varlen:
        q, k, v = packed(grad=grad)
        cu_q, cu_k, max_q, max_k = offsets(0, 10, 40), offsets(0, 20, 50), 30, 30
    else:
        q, k, v = qkv(grad=grad)
        cu_q = cu_k = None
        max_q = max_k = 0
    return (q, k, v, cu_q, cu_k, max_q, max_k, 0.125, True, -1, 0, 0.0, False)


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_opcheck_forward(varlen):
    torch.library.opcheck(torch.ops.samattn.flash_attn_forward.default, _op_args(varlen))


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_opcheck_backward(varlen):
    args = _op_args(varlen)
    q, k, v = args[:3]
    out, lse = torch.ops.samattn.flash_attn_forward(*args)
    backward_args = (torch.empty_like(out), q, k, v, out, lse, *args[3:])
    torch.library.opcheck(torch.ops.samattn.flash_attn_backward.default, backward_args)


def _backward_args(varlen: bool = False, **changes):
    """Valid meta arguments of samattn::flash_attn_backward, with `changes` by name."""
    args = _op_args(varlen)
    q, k, v = args[:3]
    out, lse = torch.ops.samattn.flash_attn_forward(*args)
    named = dict(dout=torch.empty_like(out), q=q, k=k, v=v, out=out, softmax_lse=lse)
    named.update(changes)
    return (*named.values(), *args[3:])


BAD_BACKWARD = {
    "dout shape": (dict(dout=meta(2, 16, 4, 64)), ValueError, "dout must have the attention"),
    "dout dtype": (
        dict(dout=meta(2, 17, 4, 64, dtype=BF16)),
        TypeError,
        "dout has dtype torch.bfloat16 but q has torch.float16",
    ),
    "out shape": (dict(out=meta(2, 17, 2, 64)), ValueError, "out must have the attention"),
    "lse shape": (
        dict(softmax_lse=meta(2, 17, 4, dtype=torch.float32)),
        ValueError,
        "softmax_lse must have shape (2, 4, 17)",
    ),
    "lse dtype": (dict(softmax_lse=meta(2, 4, 17)), TypeError, "softmax_lse must have dtype"),
    "dout on cpu": (
        dict(dout=torch.empty(2, 17, 4, 64, dtype=F16)),
        ValueError,
        "need CUDA tensors, but dout is on cpu",
    ),
    "k head dim": (dict(k=meta(2, 33, 2, 32)), ValueError, "k has head dim 32 but q has 64"),
}


@pytest.mark.parametrize("case", BAD_BACKWARD)
def test_backward_op_rejects(case):
    changes, error, fragment = BAD_BACKWARD[case]
    with pytest.raises(error) as info:
        torch.ops.samattn.flash_attn_backward(*_backward_args(**changes))
    assert fragment in str(info.value), str(info.value)


def test_backward_op_rejects_varlen_lse_shape():
    with pytest.raises(ValueError, match=r"softmax_lse must have shape \(4, 40\)"):
        torch.ops.samattn.flash_attn_backward(
            *_backward_args(varlen=True, softmax_lse=meta(2, 4, 20, dtype=torch.float32))
        )


def test_backward_fake_shapes():
    for varlen in (False, True):
        args = _backward_args(varlen)
        dq, dk, dv, dsinks = torch.ops.samattn.flash_attn_backward(*args)
        assert (dq.shape, dk.shape, dv.shape) == (args[1].shape, args[2].shape, args[3].shape)
        assert dq.dtype == F16 and dq.device.type == "meta"
        # No sinks: an empty gradient.
        assert dsinks.shape == (0,) and dsinks.dtype == torch.float32
        alibi = f32(2, 4) if not varlen else f32(4)
        *_, dsinks = torch.ops.samattn.flash_attn_backward(*args, alibi, f32(4))
        assert dsinks.shape == (4,) and dsinks.dtype == torch.float32


@pytest.mark.parametrize(
    "alibi, sinks, fragment",
    [
        (f32(3), None, "alibi_slopes must have shape (nheads,) = (4,)"),
        (None, meta(4), "sinks must have dtype torch.float32"),
        (None, f32(5), "sinks must have shape (nheads,) = (4,)"),
    ],
)
def test_backward_op_rejects_bad_score_terms(alibi, sinks, fragment):
    with pytest.raises((TypeError, ValueError)) as info:
        torch.ops.samattn.flash_attn_backward(*_backward_args(), alibi, sinks)
    assert fragment in str(info.value) and "samattn.flash_attn_backward" in str(info.value)


def test_backward_cuda_implementation_checks_before_the_library():
    # CPU tensors reach the CUDA implementation, which refuses them before any C call.
    q = torch.zeros(1, 3, 2, 8, dtype=F16)
    k = v = torch.zeros(1, 4, 1, 8, dtype=F16)
    lse = torch.zeros(1, 2, 3)
    with pytest.raises(ValueError, match="need CUDA tensors, but q is on cpu"):
        torch.ops.samattn.flash_attn_backward(
            q, q, k, v, q, lse, None, None, 0, 0, 1.0, False, -1, -1, 0.0, False
        )


def test_deterministic_and_family_reach_the_backward(monkeypatch):
    seen = {}

    def fake_backward(dout, q, k, v, out, lse, *rest):
        seen["deterministic"] = rest[-3]  # before alibi_slopes and sinks
        seen["family"] = samattn._family.requested_family()
        empty = q.new_empty((0,), dtype=torch.float32)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), empty

    monkeypatch.setattr(torch.ops.samattn, "flash_attn_backward", fake_backward, raising=False)
    q, k, v = qkv(grad=True)
    with samattn.use_family("sm80"):
        out = samattn.flash_attn_func(q, k, v, deterministic=True)
    out.sum().backward()
    assert seen == {"deterministic": True, "family": _lib.FAMILY_CODES["sm80"]}


# --------------------------------------------------- the sinks' gradient ----
def _spy_backward(monkeypatch) -> list:
    """Records (alibi_slopes, sinks) of each backward op call, then runs its fake."""
    calls = []
    real = torch.ops.samattn.flash_attn_backward

    def spy(*args):
        calls.append(args[-2:])
        return real(*args)

    monkeypatch.setattr(torch.ops.samattn, "flash_attn_backward", spy, raising=False)
    return calls


def test_sinks_gradient_through_the_fakes(monkeypatch):
    calls = _spy_backward(monkeypatch)
    q, k, v = qkv(grad=True)
    sinks, alibi = f32(4, grad=True), f32(2, 4)
    out = samattn.flash_attn_func(q, k, v, causal=True, alibi_slopes=alibi, sinks=sinks)
    out.sum().backward()
    assert sinks.grad.shape == (4,) and sinks.grad.dtype == torch.float32
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    ((passed_alibi, passed_sinks),) = calls
    assert passed_alibi is alibi and passed_sinks is sinks


def test_sinks_without_grad_are_not_passed_to_the_backward(monkeypatch):
    # dq, dk, dv do not depend on the sinks (the forward's lse holds them): the backward
    # gets them only to compute their gradient.
    calls = _spy_backward(monkeypatch)
    q, k, v = qkv(grad=True)
    out = samattn.flash_attn_func(q, k, v, sinks=f32(4))
    out.sum().backward()
    assert calls == [(None, None)]


def test_only_the_sinks_require_grad(monkeypatch):
    calls = _spy_backward(monkeypatch)
    sinks = f32(4, grad=True)
    samattn.flash_attn_varlen_func(
        *packed(), offsets(0, 10, 40), offsets(0, 20, 50), 30, 30, sinks=sinks
    ).sum().backward()
    assert sinks.grad.shape == (4,) and calls[0][1] is sinks


def test_alibi_slopes_get_no_gradient():
    q, k, v = qkv(grad=True)
    alibi = f32(4, grad=True)
    samattn.flash_attn_func(q, k, v, alibi_slopes=alibi).sum().backward()
    assert alibi.grad is None and q.grad is not None


def test_paged_prefill_has_no_sinks_gradient():
    q = meta(40, 4, 64)
    cache = meta(10, 16, 2, 64)
    out = samattn.flash_attn_varlen_func(
        q, cache, cache, offsets(0, 10, 40), offsets(0, 20, 50), 30, 32,
        block_table=meta(2, 2, dtype=torch.int32), sinks=f32(4, grad=True),
    )  # fmt: skip
    with pytest.raises(NotImplementedError, match="no backward through a paged KV cache"):
        out.sum().backward()
    with torch.no_grad():
        out = samattn.flash_attn_varlen_func(
            q, cache, cache, offsets(0, 10, 40), offsets(0, 20, 50), 30, 32,
            block_table=meta(2, 2, dtype=torch.int32), sinks=f32(4, grad=True),
            alibi_slopes=f32(2, 4),
        )  # fmt: skip
    assert out.shape == q.shape


def train_with_terms(q, k, v, sinks, alibi):
    out = samattn.flash_attn_func(
        q, k, v, causal=True, window_size=(16, 0), alibi_slopes=alibi, sinks=sinks,
        deterministic=True,
    )  # fmt: skip
    return out.float().square().sum()


def train_varlen_with_terms(q, k, v, sinks, alibi, cu_q, cu_k):
    out = samattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 30, 30, causal=True, alibi_slopes=alibi, sinks=sinks
    )
    return out.float().sum()


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_compiled_training_graph_with_score_terms(varlen):
    torch._dynamo.reset()
    sinks = f32(4, grad=True)
    if varlen:
        leaves = packed(grad=True)
        fn, extra = train_varlen_with_terms, (offsets(0, 10, 40), offsets(0, 20, 50))
    else:
        leaves = qkv(grad=True)
        fn, extra = train_with_terms, ()
    alibi = f32(2, 4)
    loss = torch.compile(fn, fullgraph=True, backend="aot_eager")(*leaves, sinks, alibi, *extra)
    loss.backward()
    assert sinks.grad is not None and sinks.grad.shape == (4,)
    for t in leaves:
        assert t.grad is not None and t.grad.shape == t.shape
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*leaves, sinks, alibi, *extra)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_opcheck_with_score_terms(varlen):
    args = (*_op_args(varlen), None, f32(2, 4) if not varlen else f32(4), f32(4))
    torch.library.opcheck(torch.ops.samattn.flash_attn_forward.default, args)
    q, k, v = args[:3]
    out, lse = torch.ops.samattn.flash_attn_forward(*args)
    backward_args = (torch.empty_like(out), q, k, v, out, lse, *args[3:13], *args[14:])
    torch.library.opcheck(torch.ops.samattn.flash_attn_backward.default, backward_args)


# ----------------------------------------------------------------- SDPA ----
def sdpa_inputs(b=2, h=4, hk=4, sq=17, sk=17, d=64, dtype=F16, device="meta"):
    return (
        torch.empty(b, h, sq, d, dtype=dtype, device=device),
        torch.empty(b, hk, sk, d, dtype=dtype, device=device),
        torch.empty(b, hk, sk, d, dtype=dtype, device=device),
    )


SDPA_CASES = {
    # name: (inputs, attn_mask, is_causal, enable_gqa, reason fragment or None)
    "plain": (sdpa_inputs(), None, False, False, None),
    "causal square": (sdpa_inputs(), None, True, False, None),
    "causal, more queries than keys": (sdpa_inputs(sq=20, sk=17), None, True, False, None),
    "non-causal, sq != sk": (sdpa_inputs(sq=5, sk=300), None, False, False, None),
    "GQA enabled": (sdpa_inputs(hk=2), None, False, True, None),
    # Masks run in the kernels (their errors: test_attention_mask.py).
    "bool mask": (sdpa_inputs(), torch.empty(17, 17, dtype=torch.bool), False, False, None),
    "additive mask": (sdpa_inputs(), torch.empty(17, 17, dtype=F16), False, False, None),
    "bool mask, GQA": (
        sdpa_inputs(hk=2),
        torch.empty(2, 1, 17, 17, dtype=torch.bool),
        False,
        True,
        None,
    ),
    "nested": (
        tuple(
            torch.nested.nested_tensor([torch.empty(4, 17, 64)], layout=torch.jagged)
            for _ in range(3)
        ),
        None,
        False,
        False,
        "nested",
    ),
    "3-D": (
        tuple(t[0] for t in sdpa_inputs()),
        None,
        False,
        False,
        "not 4-D",
    ),
    "float32": (sdpa_inputs(dtype=torch.float32), None, False, False, "dtypes"),
    "cpu": (sdpa_inputs(device="cpu"), None, False, False, "not on a CUDA device"),
    "head dim 36": (sdpa_inputs(d=36), None, False, False, None),
    "head dim 1": (sdpa_inputs(d=1), None, False, False, None),
    "head dim 512": (sdpa_inputs(d=512), None, False, False, "head dim 512"),
    "GQA without enable_gqa": (sdpa_inputs(hk=2), None, False, False, "key/value heads"),
    "GQA not divisible": (sdpa_inputs(hk=3), None, False, True, "key/value heads"),
    "causal, fewer queries than keys": (sdpa_inputs(sq=5, sk=17), None, True, False, "top-left"),
    # More queries than keys: a window reaching seqlen_q - seqlen_k past the diagonal,
    # exact however far it reaches.
    "causal, sq >= 2 sk": (sdpa_inputs(sq=34, sk=17), None, True, False, None),
}


@pytest.mark.parametrize("case", SDPA_CASES)
def test_sdpa_fallback_decision(case):
    (query, key, value), mask, is_causal, enable_gqa, fragment = SDPA_CASES[case]
    reason = _checks.sdpa_fallback_reason(query, key, value, mask, is_causal, enable_gqa)
    if fragment is None:
        assert reason is None
    else:
        assert reason is not None and fragment in reason, reason


def test_sdpa_value_head_dim_differs():
    q, k, _ = sdpa_inputs()
    v = torch.empty(2, 4, 17, 32, dtype=F16, device="meta")
    assert "value head dim" in _checks.sdpa_fallback_reason(q, k, v, None, False, False)


def test_sdpa_served_calls_flash_attn_with_torch_semantics(monkeypatch):
    calls = []
    real = attention_module.flash_attn_func

    def spy(q, k, v, **kwargs):
        calls.append((q, kwargs))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(attention_module, "flash_attn_func", spy)
    query, key, value = sdpa_inputs(sq=20, sk=17)
    out = samattn.scaled_dot_product_attention(query, key, value, is_causal=True)
    assert out.shape == (2, 4, 20, 64)
    q, kwargs = calls[-1]
    # (batch, heads, seq, dim) read as (batch, seq, heads, dim) through strides, no copy.
    assert q.shape == (2, 20, 4, 64) and q.stride() == query.transpose(1, 2).stride()
    # torch's causal mask is top-left aligned: a window right of the bottom-right diagonal.
    assert kwargs == dict(softmax_scale=1 / 8, causal=False, window_size=(-1, 3))
    samattn.scaled_dot_product_attention(*sdpa_inputs(), is_causal=True, scale=0.5)
    assert calls[-1][1] == dict(softmax_scale=0.5, causal=True, window_size=(-1, -1))


def test_sdpa_fallback_runs_torch_and_warns_once(monkeypatch):
    monkeypatch.setattr(_warnings, "_warned_messages", set())
    torch.manual_seed(0)
    query, key, value = (torch.randn(1, 2, 5, 8) for _ in range(3))
    mask = torch.rand(5, 5) > 0.3
    mask[:, 0] = True
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, mask)
    with pytest.warns(UserWarning, match="query is on cpu.* running torch"):
        out = samattn.scaled_dot_product_attention(query, key, value, mask)
    torch.testing.assert_close(out, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning for the same reason would raise
        samattn.scaled_dot_product_attention(query, key, value, mask)


def test_sdpa_dropout_runs_torch(monkeypatch):
    # samattn's SDPA leaves dropout to torch (same seed, same dropout pattern).
    monkeypatch.setattr(_warnings, "_warned_messages", set())
    query, key, value = (torch.randn(1, 2, 5, 8) for _ in range(3))
    torch.manual_seed(1)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, dropout_p=0.5)
    torch.manual_seed(1)
    with pytest.warns(UserWarning, match=r"dropout_p is 0\.5 .* running torch"):
        out = samattn.scaled_dot_product_attention(query, key, value, dropout_p=0.5)
    torch.testing.assert_close(out, expected)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\]"):
        samattn.scaled_dot_product_attention(*sdpa_inputs(), dropout_p=1.5)


# ------------------------------------------- how operands reach the kernels ----
def test_attention_operand_copies_only_what_the_vectors_need():
    from samattn import _cuda

    packed = torch.zeros(2, 9, 3, 4, 64, dtype=F16)  # (batch, seq, 3, heads, dim)
    q = packed[:, :, 0]
    assert _cuda._attention_operand(q) is q  # strides multiples of 8: read in place
    odd_seq = torch.zeros(2, 9, 4, 65, dtype=F16)[..., :64]  # row stride 260: copied
    copied = _cuda._attention_operand(odd_seq)
    assert copied is not odd_seq and copied.is_contiguous()
    for d in (1, 36, 100, 255):  # no head dim of these has 16-byte rows: in place
        t = torch.zeros(2, 9, 4, d + 3, dtype=F16)[..., 1 : d + 1]
        assert _cuda._attention_operand(t) is t
    transposed = torch.zeros(2, 9, 36, 4, dtype=F16).transpose(2, 3)  # dim not contiguous
    assert _cuda._attention_operand(transposed).stride(-1) == 1
