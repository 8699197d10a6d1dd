"""Each "quick" check of samattn/_checks.py accepts only what its full check accepts.

The eager paths try a cheap check first (gemm_quick, softmax_quick, flash_attn_quick,
grouped_gemm_list_quick) and fall back to the full one when it answers None; each claims to
accept only what the full check accepts, with the same sizes. Here that is a property,
checked by hypothesis on fake CUDA tensors (no GPU needed) of mostly valid and some invalid
shapes, dtypes, devices and scalars: whenever the quick check answers, the full check must
not raise and must answer the same.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from samattn import _checks

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
given, settings = hypothesis.given, hypothesis.settings

# Fake CUDA tensors on a second device are refused where exactly one GPU is visible.
DEVICES = ["cuda:0", "meta", "cpu"]
if not (torch.cuda.is_available() and torch.cuda.device_count() < 2):
    DEVICES.append("cuda:1")
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.bool]
SETTINGS = settings(max_examples=300, deadline=None, derandomize=True)

dtypes = st.sampled_from(DTYPES)
devices = st.sampled_from(DEVICES)
small = st.integers(0, 6)


def tensor(shape, dtype, device, transposed=False):
    """A fake tensor (made under FakeTensorMode by the caller): no memory, any device."""
    if transposed and len(shape) >= 2:
        return torch.empty((*shape[:-2], shape[-1], shape[-2]), dtype=dtype, device=device).mT
    return torch.empty(shape, dtype=dtype, device=device)


def faults(names: list[str]):
    """None (valid) half the time, else one of `names`."""
    return st.sampled_from([None] * len(names) + names)


# ------------------------------------------------------------------ GEMM ----
GEMM_FAULTS = [
    "a 3-D", "b 3-D", "a 1-D", "inner sizes", "b dtype", "dtype", "b device", "meta", "cpu",
    "c", "beta", "alpha inf", "alpha nan", "alpha int", "a transposed", "b transposed",
]  # fmt: skip


@st.composite
def gemm_arguments(draw):
    """(a, b, c, alpha, beta) specs: a (M, K) @ b (K, N) in one dtype on one CUDA device,
    no c, half the time; else off in one place (GEMM_FAULTS), some of which the full check
    accepts (3-D operands, a c, transposed views) and the quick one leaves to it."""
    m, n, k = draw(small), draw(small), draw(small)
    dtype = draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float32]))
    a, b = [(m, k), dtype, "cuda:0", False], [(k, n), dtype, "cuda:0", False]
    c, alpha, beta = None, draw(st.sampled_from([1.0, 0.5, -2.0, 0.0])), 0.0
    fault = draw(faults(GEMM_FAULTS))
    if fault == "a 3-D":
        a[0] = (2, m, k)
    elif fault == "b 3-D":
        b[0] = (2, k, n)
    elif fault == "a 1-D":
        a[0] = (k,)
    elif fault == "inner sizes":
        b[0] = (k + 1, n)
    elif fault in ("b dtype", "dtype"):
        b[1] = draw(dtypes)
        if fault == "dtype":
            a[1] = b[1]
    elif fault == "b device":
        b[2] = draw(devices)
    elif fault in ("meta", "cpu"):
        a[2] = b[2] = fault
    elif fault == "c":
        c, beta = (m, n), draw(st.sampled_from([0.0, 1.0]))
    elif fault == "beta":
        beta = draw(st.sampled_from([1.0, math.nan]))
    elif fault in ("alpha inf", "alpha nan", "alpha int"):
        alpha = {"alpha inf": math.inf, "alpha nan": math.nan, "alpha int": 3}[fault]
    elif fault in ("a transposed", "b transposed"):
        (a if fault == "a transposed" else b)[3] = True
    return tuple(a), tuple(b), c, alpha, beta


@SETTINGS
@given(gemm_arguments())
def test_gemm_quick_accepts_only_what_gemm_accepts(arguments):
    a_spec, b_spec, c_shape, alpha, beta = arguments
    with FakeTensorMode():
        a, b = tensor(*a_spec), tensor(*b_spec)
        c = None if c_shape is None else tensor(c_shape, a.dtype, a.device)
        quick = _checks.gemm_quick(a, b, c, alpha, beta)
        if quick is not None:
            assert _checks.gemm(a, b, c, alpha, beta) == quick


# --------------------------------------------------------------- softmax ----
SOFTMAX_FAULTS = ["dim too large", "dim too small", "dim bool", "dim float", "dtype", "meta",
                  "cpu", "0-d"]  # fmt: skip


@st.composite
def softmax_arguments(draw):
    shape = tuple(draw(st.lists(small, min_size=1, max_size=4)))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    dtype, device = draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float32])), "cuda:0"
    fault = draw(faults(SOFTMAX_FAULTS))
    if fault == "dim too large":
        dim = len(shape)
    elif fault == "dim too small":
        dim = -len(shape) - 1
    elif fault in ("dim bool", "dim float"):
        dim = True if fault == "dim bool" else float(dim)
    elif fault == "dtype":
        dtype = draw(dtypes)
    elif fault in ("meta", "cpu"):
        device = fault
    elif fault == "0-d":
        shape, dim = (), draw(st.sampled_from([0, -1, 1]))
    return shape, dtype, device, dim


@SETTINGS
@given(softmax_arguments())
def test_softmax_quick_accepts_only_what_softmax_accepts(arguments):
    shape, dtype, device, dim = arguments
    with FakeTensorMode():
        x = tensor(shape, dtype, device)
        quick = _checks.softmax_quick(x, dim)
        if quick is not None:
            assert _checks.softmax(x, dim) == quick


# ------------------------------------------------------------- attention ----
ATTENTION_FAULTS = [
    "q rank", "batch", "head dim", "v shape", "heads", "q dtype", "k dtype", "v device",
    "meta", "cpu", "head dim 0", "head dim 257", "no kv heads", "float32",
]  # fmt: skip


@st.composite
def attention_arguments(draw):
    """(shape, dtype, device) of q (b, sq, h, d), k and v (b, sk, hk, d): valid (GQA heads,
    head dims up to 256, fp16 or bf16 on one CUDA device) half the time, else off in one
    place (ATTENTION_FAULTS)."""
    b, sq, sk = draw(small), draw(small), draw(small)
    hk = draw(st.integers(1, 3))
    h = hk * draw(st.integers(1, 3))
    d = draw(st.sampled_from([1, 8, 37, 64, 128, 256]))
    dtype = draw(st.sampled_from([torch.float16, torch.bfloat16]))
    q, k, v = ([(b, sq, h, d), dtype, "cuda:0"], [(b, sk, hk, d), dtype, "cuda:0"],
               [(b, sk, hk, d), dtype, "cuda:0"])  # fmt: skip
    fault = draw(st.sampled_from([None] * len(ATTENTION_FAULTS) + ATTENTION_FAULTS))
    if fault == "q rank":
        q[0] = (sq, h, d)
    elif fault == "batch":
        k[0] = v[0] = (b + 1, sk, hk, d)
    elif fault == "head dim":
        k[0] = (b, sk, hk, d + 1)
    elif fault == "v shape":
        v[0] = (b, sk + 1, hk, d)
    elif fault == "heads":
        q[0] = (b, sq, h + 1, d) if h % hk == 0 and hk > 1 else (b, sq, h, d)
    elif fault in ("q dtype", "k dtype"):
        (q if fault == "q dtype" else k)[1] = draw(dtypes)
    elif fault == "v device":
        v[2] = draw(devices)
    elif fault in ("meta", "cpu"):
        q[2] = k[2] = v[2] = fault
    elif fault in ("head dim 0", "head dim 257"):
        d = 0 if fault == "head dim 0" else 257
        q[0], k[0], v[0] = (b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d)
    elif fault == "no kv heads":
        k[0] = v[0] = (b, sk, 0, d)
    elif fault == "float32":
        q[1] = k[1] = v[1] = torch.float32
    return tuple(q), tuple(k), tuple(v)


@SETTINGS
@given(attention_arguments())
def test_flash_attn_quick_accepts_only_what_flash_attn_accepts(arguments):
    with FakeTensorMode():
        q, k, v = (tensor(*spec) for spec in arguments)
        quick = _checks.flash_attn_quick(q, k, v)
        if quick is not None:
            assert _checks.flash_attn(q, k, v) == quick


# --------------------------------------------------- grouped GEMM, a list ----
LIST_FAULTS = ["empty", "one b more", "tuple", "inner sizes", "3-D", "a dtype", "b dtype",
               "float32", "a device", "meta", "not a tensor"]  # fmt: skip


@st.composite
def gemm_lists(draw):
    """(as_, bs) specs: 1 to 3 pairs (M, K) @ (K, N) in fp16 or bf16 on one CUDA device, in
    lists, half the time; else off in one place (LIST_FAULTS)."""
    dtype = draw(st.sampled_from([torch.float16, torch.bfloat16]))
    as_, bs = [], []
    for _ in range(draw(st.integers(1, 3))):
        m, n, k = draw(small), draw(small), draw(small)
        as_.append([(m, k), dtype, "cuda:0"])
        bs.append([(k, n), dtype, "cuda:0"])
    container = list
    fault = draw(faults(LIST_FAULTS))
    i = draw(st.integers(0, len(as_) - 1))
    if fault == "empty":
        as_, bs = [], []
    elif fault == "one b more":
        bs.append([(1, 1), dtype, "cuda:0"])
    elif fault == "tuple":
        container = tuple
    elif fault == "inner sizes":
        as_[i][0] = (as_[i][0][0], bs[i][0][0] + 1)
    elif fault == "3-D":
        as_[i][0] = (1, *as_[i][0])
    elif fault in ("a dtype", "b dtype"):
        (as_ if fault == "a dtype" else bs)[i][1] = draw(dtypes)
    elif fault == "float32":
        for spec in as_ + bs:
            spec[1] = torch.float32
    elif fault == "a device":
        as_[i][2] = draw(devices)
    elif fault == "meta":
        for spec in as_ + bs:
            spec[2] = "meta"
    return [tuple(a) for a in as_], [tuple(b) for b in bs], container, fault == "not a tensor"


@SETTINGS
@given(gemm_lists())
def test_grouped_gemm_list_quick_accepts_only_what_grouped_gemm_list_accepts(arguments):
    a_specs, b_specs, container, not_a_tensor = arguments
    with FakeTensorMode():
        as_ = container(tensor(*spec) for spec in a_specs)
        bs = [tensor(*spec) for spec in b_specs]
        if not_a_tensor:
            bs[-1] = 1.0
        bs = container(bs)
        quick = _checks.grouped_gemm_list_quick(as_, bs)
        if quick is not None:
            assert _checks.grouped_gemm_list(as_, bs) == quick


def test_the_properties_see_accepted_inputs():
    """The strategies reach the quick checks' accepting side, not only their refusals."""
    with FakeTensorMode():
        a, b = tensor((4, 3), torch.float16, "cuda:0"), tensor((3, 5), torch.float16, "cuda:0")
        assert _checks.gemm_quick(a, b, None, 1.0, 0.0) == _checks.gemm(a, b, None, 1.0, 0.0)
        x = tensor((2, 3), torch.float32, "cuda:0")
        assert _checks.softmax_quick(x, -1) == _checks.softmax(x, -1)
        q = tensor((1, 2, 4, 64), torch.bfloat16, "cuda:0")
        kv = tensor((1, 3, 2, 64), torch.bfloat16, "cuda:0")
        assert _checks.flash_attn_quick(q, kv, kv) == _checks.flash_attn(q, kv, kv)
        assert _checks.grouped_gemm_list_quick([a], [b]) == _checks.grouped_gemm_list([a], [b])
