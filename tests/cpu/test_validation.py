"""Argument validation of samattn.gemm / samattn.softmax, without a GPU.

Shapes and dtypes are checked before devices, so "meta" tensors reach every check; CPU
tensors get the "needs CUDA tensors" error; two fake CUDA devices test device mixing.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import samattn
from samattn import _lib

# Fake CUDA tensors on a second device need no GPU, but on a machine with one GPU torch
# checks the ordinal and refuses cuda:1.
needs_fake_cuda1 = pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2,
    reason="fake cuda:1 tensors are refused where exactly one GPU is visible",
)


def meta(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def cpu(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


# name -> (call, exception type, substrings the message must contain)
BAD_GEMM = {
    "a 1-D": (lambda: samattn.gemm(meta(5), meta(5, 7)), ValueError, ["a must be 2-D", "(5,)"]),
    "a 4-D": (
        lambda: samattn.gemm(meta(2, 2, 4, 5), meta(5, 7)),
        ValueError,
        ["a must be 2-D (M, K) or 3-D (batch, M, K)"],
    ),
    "b 1-D": (lambda: samattn.gemm(meta(4, 5), meta(5)), ValueError, ["b must be 2-D"]),
    "inner sizes": (
        lambda: samattn.gemm(meta(4, 5), meta(6, 7)),
        ValueError,
        ["inner sizes differ", "K = 5", "K = 6"],
    ),
    "batch sizes": (
        lambda: samattn.gemm(meta(3, 4, 5), meta(2, 5, 7)),
        ValueError,
        ["batch sizes 3 (a) and 2 (b)"],
    ),
    "float64": (
        lambda: samattn.gemm(meta(4, 5, dtype=torch.float64), meta(5, 7, dtype=torch.float64)),
        TypeError,
        ["torch.float64", "torch.float16, torch.bfloat16 or torch.float32"],
    ),
    "int32": (
        lambda: samattn.gemm(meta(4, 5, dtype=torch.int32), meta(5, 7, dtype=torch.int32)),
        TypeError,
        ["torch.int32"],
    ),
    "mixed dtypes": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7, dtype=torch.float32)),
        TypeError,
        ["b has dtype torch.float32", "same dtype"],
    ),
    "c dtype": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), meta(4, 7, dtype=torch.bfloat16), beta=1),
        TypeError,
        ["c has dtype torch.bfloat16"],
    ),
    "c shape": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), meta(3, 7), beta=1.0),
        ValueError,
        ["c of shape (3, 7)", "output shape (4, 7)"],
    ),
    "c rank": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), meta(2, 4, 7), beta=1.0),
        ValueError,
        ["c of shape (2, 4, 7)"],
    ),
    "alpha nan": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), alpha=math.nan),
        ValueError,
        ["alpha must be finite", "nan"],
    ),
    "alpha inf": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), alpha=math.inf),
        ValueError,
        ["alpha must be finite"],
    ),
    "beta inf": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), meta(4, 7), beta=-math.inf),
        ValueError,
        ["beta must be finite"],
    ),
    "beta without c": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), beta=0.5),
        ValueError,
        ["beta is 0.5 but c is None"],
    ),
    "cpu tensors": (
        lambda: samattn.gemm(cpu(4, 5), cpu(5, 7)),
        ValueError,
        ["samattn ops need CUDA tensors", "a is on cpu"],
    ),
    "cpu b": (
        lambda: samattn.gemm(meta(4, 5), cpu(5, 7)),
        ValueError,
        ["need CUDA tensors", "b is on cpu"],
    ),
    "cpu c": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), cpu(7), beta=1.0),
        ValueError,
        ["need CUDA tensors", "c is on cpu"],
    ),
    "a not a tensor": (
        lambda: samattn.gemm([[1.0]], meta(1, 1)),
        TypeError,
        ["a must be a torch.Tensor"],
    ),
    "c not a tensor": (
        lambda: samattn.gemm(meta(1, 1), meta(1, 1), 1.0, beta=1.0),
        TypeError,
        ["c must be a torch.Tensor"],
    ),
}

BAD_SOFTMAX = {
    "dim too large": (
        lambda: samattn.softmax(meta(4, 5), dim=2),
        IndexError,
        ["Dimension out of range", "[-2, 1]", "got 2"],
    ),
    "dim too small": (lambda: samattn.softmax(meta(4, 5), dim=-3), IndexError, ["got -3"]),
    "0-d dim 1": (lambda: samattn.softmax(meta(), dim=1), IndexError, ["[-1, 0]"]),
    "dim not int": (lambda: samattn.softmax(meta(4, 5), dim=1.0), TypeError, ["dim must be"]),
    "float64": (
        lambda: samattn.softmax(meta(4, 5, dtype=torch.float64)),
        TypeError,
        ["torch.float64", "torch.float16, torch.bfloat16 or torch.float32"],
    ),
    "int64": (lambda: samattn.softmax(meta(4, dtype=torch.int64)), TypeError, ["torch.int64"]),
    "cpu": (lambda: samattn.softmax(cpu(4, 5)), ValueError, ["need CUDA tensors", "x is on cpu"]),
    "not a tensor": (lambda: samattn.softmax([1.0]), TypeError, ["x must be a torch.Tensor"]),
    "backward shapes": (
        lambda: torch.ops.samattn.softmax_backward(meta(4, 5), meta(4, 6), -1),
        ValueError,
        ["dy has shape (4, 6) but y has (4, 5)"],
    ),
    "unknown activation": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), activation="tanh"),
        ValueError,
        ["activation must be None or one of", "'gelu_tanh'", "'tanh'"],
    ),
    "unknown activation, training": (
        lambda: samattn.gemm(meta(4, 5).requires_grad_(), meta(5, 7), activation="tanh"),
        ValueError,
        ["activation must be None or one of", "'tanh'"],
    ),
    "bias shape": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), bias=meta(4)),
        ValueError,
        ["bias must have shape (N,) = (7,)", "(4,)"],
    ),
    "bias 2-D": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), bias=meta(1, 7)),
        ValueError,
        ["bias must have shape (N,)"],
    ),
    "bias dtype": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), bias=meta(7, dtype=torch.float32)),
        TypeError,
        ["bias has dtype torch.float32"],
    ),
    "bias not a tensor": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), bias=[0.0] * 7),
        TypeError,
        ["bias must be a torch.Tensor"],
    ),
    "out_dtype": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), out_dtype=torch.bfloat16),
        TypeError,
        ["out_dtype must be None, a's dtype (torch.float16) or torch.float32"],
    ),
    "c of the input dtype with an fp32 output": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), meta(4, 7), beta=1.0, out_dtype=torch.float32),
        TypeError,
        ["c has dtype torch.float16 but the output is torch.float32"],
    ),
    "bias on the cpu": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), bias=cpu(7)),
        ValueError,
        ["bias is on cpu"],
    ),
    "linear weight 1-D": (
        lambda: samattn.linear(meta(4, 5), meta(5)),
        ValueError,
        ["weight must be 2-D (out_features, in_features)"],
    ),
    "linear in_features": (
        lambda: samattn.linear(meta(3, 4, 6), meta(7, 5)),
        ValueError,
        ["x's last dimension must be in_features = 5", "(3, 4, 6)"],
    ),
    "backward dtypes": (
        lambda: torch.ops.samattn.softmax_backward(meta(4, 5), meta(4, 5, dtype=torch.float32), 1),
        TypeError,
        ["dy has dtype torch.float32"],
    ),
    "backward cpu": (
        lambda: torch.ops.samattn.softmax_backward(cpu(4, 5), cpu(4, 5), 1),
        ValueError,
        ["need CUDA tensors"],
    ),
}


def ends(*values: int, device: str = "meta") -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32).to(device)


BAD_MODES = {
    "split_k zero": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), split_k=0),
        ValueError,
        ["split_k must be 'auto' or 1..64, got 0"],
    ),
    "split_k float": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), split_k=2.0),
        TypeError,
        ["split_k must be 'auto' or an int in 1..64, got 2.0"],
    ),
    "split_k_mode": (
        lambda: samattn.gemm(meta(4, 5), meta(5, 7), split_k=2, split_k_mode="atomic"),
        ValueError,
        ["split_k_mode must be one of 'auto', 'serial', 'parallel', got 'atomic'"],
    ),
    "grouped x 3-D": (
        lambda: samattn.grouped_gemm(meta(2, 4, 5), meta(3, 5, 7), ends(1, 2, 4)),
        ValueError,
        ["x must be 2-D (tokens, K)", "(2, 4, 5)"],
    ),
    "grouped w 2-D": (
        lambda: samattn.grouped_gemm(meta(4, 5), meta(5, 7), ends(4)),
        ValueError,
        ["w must be 3-D (experts, K, N)"],
    ),
    "grouped K": (
        lambda: samattn.grouped_gemm(meta(4, 5), meta(3, 7, 5), ends(1, 2, 4)),
        ValueError,
        ["x has K = 5", "w has K = 7", "passed as w.mT"],
    ),
    "grouped fp32": (
        lambda: samattn.grouped_gemm(
            meta(4, 5, dtype=torch.float32), meta(3, 5, 7, dtype=torch.float32), ends(1, 2, 4)
        ),
        TypeError,
        ["grouped GEMMs take float16 or bfloat16"],
    ),
    "grouped offsets dtype": (
        lambda: samattn.grouped_gemm(
            meta(4, 5), meta(3, 5, 7), torch.tensor([1, 2, 4], device="meta")
        ),
        TypeError,
        ["offsets must be torch.int32, got torch.int64"],
    ),
    "grouped offsets shape": (
        lambda: samattn.grouped_gemm(meta(4, 5), meta(3, 5, 7), ends(1, 4)),
        ValueError,
        ["offsets must have shape (3,)", "got (2,)"],
    ),
    "grouped offsets decrease": (
        lambda: samattn.grouped_gemm(meta(4, 5), meta(3, 5, 7), ends(2, 1, 4, device="cpu")),
        ValueError,
        ["offsets must be non-decreasing", "offsets[1] = 1 follows 2"],
    ),
    "grouped offsets negative": (
        lambda: samattn.grouped_gemm(meta(4, 5), meta(3, 5, 7), ends(-1, 1, 4, device="cpu")),
        ValueError,
        ["offsets[0] = -1 follows 0"],
    ),
    "grouped offsets beyond": (
        lambda: samattn.grouped_gemm(meta(4, 5), meta(3, 5, 7), ends(1, 2, 5, device="cpu")),
        ValueError,
        ["offsets[-1] = 5 exceeds the 4 rows"],
    ),
    "grouped cpu": (
        lambda: samattn.grouped_gemm(cpu(4, 5), cpu(3, 5, 7), ends(1, 2, 4, device="cpu")),
        ValueError,
        ["need CUDA tensors"],
    ),
    "list not a list": (
        lambda: samattn.grouped_gemm_list(meta(4, 5), [meta(5, 7)]),
        TypeError,
        ["as_ must be a list of tensors, got Tensor"],
    ),
    "list lengths": (
        lambda: samattn.grouped_gemm_list([meta(4, 5), meta(2, 3)], [meta(5, 7)]),
        ValueError,
        ["one b per a: as_ has 2 tensors, bs 1"],
    ),
    "list empty": (
        lambda: samattn.grouped_gemm_list([], []),
        ValueError,
        ["1..65535 GEMMs, got 0"],
    ),
    "list K": (
        lambda: samattn.grouped_gemm_list([meta(4, 5), meta(2, 3)], [meta(5, 7), meta(4, 7)]),
        ValueError,
        ["as_[1] (M, K) and bs[1] (K, N) expected", "(2, 3) and (4, 7)"],
    ),
    "list not a tensor": (
        lambda: samattn.grouped_gemm_list([meta(4, 5), 3], [meta(5, 7), meta(4, 7)]),
        TypeError,
        ["as_[1] must be a torch.Tensor"],
    ),
    "list fp32": (
        lambda: samattn.grouped_gemm_list(
            [meta(4, 5, dtype=torch.float32)], [meta(5, 7, dtype=torch.float32)]
        ),
        TypeError,
        ["as_[0] has dtype torch.float32; grouped GEMMs take float16 or bfloat16"],
    ),
    "list mixed dtypes": (
        lambda: samattn.grouped_gemm_list(
            [meta(4, 5), meta(2, 3)], [meta(5, 7), meta(3, 7, dtype=torch.bfloat16)]
        ),
        TypeError,
        ["bs[1] has dtype torch.bfloat16 but as_[0] has torch.float16"],
    ),
    "list cpu": (
        lambda: samattn.grouped_gemm_list([cpu(4, 5)], [cpu(5, 7)]),
        ValueError,
        ["need CUDA tensors", "as_[0] is on cpu"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_GEMM) + list(BAD_SOFTMAX) + list(BAD_MODES))
def test_bad_arguments(case):
    call, error, fragments = {**BAD_GEMM, **BAD_SOFTMAX, **BAD_MODES}[case]
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    if error is ValueError:  # and a RuntimeError, as flash-attn's checks raise
        assert isinstance(raised.value, samattn.ArgumentError), type(raised.value)


def test_argument_errors_are_value_errors_and_runtime_errors(monkeypatch):
    assert issubclass(samattn.ArgumentError, ValueError)
    assert issubclass(samattn.ArgumentError, RuntimeError)
    assert not issubclass(samattn.ArgumentError, samattn.UnsupportedError)
    for caught in (ValueError, RuntimeError, samattn.ArgumentError):
        with pytest.raises(caught, match="inner sizes differ"):
            samattn.gemm(meta(4, 5), meta(6, 7))
    with pytest.raises(RuntimeError, match="unknown family 'sm99'"):
        samattn.use_family("sm99")
    # The library's statuses: INVALID_ARGUMENT (and NEEDS_WORKSPACE, when nothing gave one)
    # are argument errors; UNSUPPORTED and CUDA errors are not.
    monkeypatch.setattr(_lib, "last_error", lambda: "samattn gemm: a is NULL")
    for status in (_lib.INVALID_ARGUMENT, _lib.NEEDS_WORKSPACE):
        with pytest.raises(samattn.ArgumentError, match="a is NULL"):
            _lib.check(status)
    with pytest.raises(samattn.UnsupportedError):
        _lib.check(_lib.UNSUPPORTED)
    with pytest.raises(RuntimeError) as raised:
        _lib.check(_lib.CUDA_ERROR)
    assert not isinstance(raised.value, ValueError)


def test_shapes_are_checked_before_devices():
    with pytest.raises(ValueError, match="inner sizes differ"):
        samattn.gemm(cpu(4, 5), cpu(6, 7))


@needs_fake_cuda1
def test_mixed_cuda_devices():
    with FakeTensorMode():
        a = torch.empty(4, 5, dtype=torch.float16, device="cuda:0")
        b = torch.empty(5, 7, dtype=torch.float16, device="cuda:1")
        with pytest.raises(ValueError, match=r"same CUDA device.*cuda:0.*cuda:1"):
            samattn.gemm(a, b)


@pytest.mark.parametrize(
    "a_shape, b_shape, out_shape",
    [
        ((4, 5), (5, 7), (4, 7)),
        ((3, 4, 5), (5, 7), (3, 4, 7)),
        ((4, 5), (3, 5, 7), (3, 4, 7)),
        ((1, 4, 5), (3, 5, 7), (3, 4, 7)),
        ((3, 4, 5), (1, 5, 7), (3, 4, 7)),
        ((1, 4, 5), (5, 7), (1, 4, 7)),
        ((0, 4, 5), (0, 5, 7), (0, 4, 7)),
        ((0, 5), (5, 7), (0, 7)),
        ((4, 5), (5, 0), (4, 0)),
        ((4, 0), (0, 7), (4, 7)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gemm_output_shape(a_shape, b_shape, out_shape, dtype):
    out = samattn.gemm(meta(*a_shape, dtype=dtype), meta(*b_shape, dtype=dtype))
    assert out.shape == out_shape and out.dtype == dtype and out.is_contiguous()


@pytest.mark.parametrize("c_shape", [(), (7,), (1, 7), (4, 1), (4, 7), (1, 4, 7), (3, 1, 7)])
def test_gemm_c_broadcasts(c_shape):
    out = samattn.gemm(meta(3, 4, 5), meta(5, 7), meta(*c_shape), beta=0.5)
    assert out.shape == (3, 4, 7)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_gemm_epilogue_output(activation):
    a, b = meta(3, 4, 5, dtype=torch.bfloat16), meta(5, 7, dtype=torch.bfloat16)
    out = samattn.gemm(a, b, bias=meta(7, dtype=torch.bfloat16), activation=activation)
    assert out.shape == (3, 4, 7) and out.dtype == torch.bfloat16
    out = samattn.gemm(a, b, meta(7, dtype=torch.float32), beta=1.0, out_dtype=torch.float32)
    assert out.shape == (3, 4, 7) and out.dtype == torch.float32
    assert samattn.gemm(a, b, out_dtype=torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_grouped_gemm_output_shape(dtype):
    out = samattn.grouped_gemm(meta(9, 5, dtype=dtype), meta(3, 5, 7, dtype=dtype), ends(2, 2, 9))
    assert out.shape == (9, 7) and out.dtype == dtype
    # A weight stored (experts, N, K), read through .mT.
    w = meta(3, 7, 5, dtype=dtype).mT
    assert samattn.grouped_gemm(meta(9, 5, dtype=dtype), w, ends(2, 2, 9)).shape == (9, 7)
    grad_w = torch.ops.samattn.grouped_gemm_k(meta(5, 9), meta(9, 7), ends(2, 2, 9))
    assert grad_w.shape == (3, 5, 7)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_grouped_gemm_list_output_shapes(dtype):
    as_ = [meta(4, 5, dtype=dtype), meta(1, 8, dtype=dtype), meta(0, 3, dtype=dtype)]
    bs = [meta(5, 7, dtype=dtype), meta(9, 8, dtype=dtype).mT, meta(3, 2, dtype=dtype)]
    outs = samattn.grouped_gemm_list(as_, bs)
    assert [tuple(o.shape) for o in outs] == [(4, 7), (1, 9), (0, 2)]
    assert all(o.dtype == dtype and o.is_contiguous() for o in outs)
    # A tuple works as well as a list; K = 0 gives (M, N) (zeros on a GPU).
    (out,) = samattn.grouped_gemm_list((meta(3, 0, dtype=dtype),), (meta(0, 4, dtype=dtype),))
    assert out.shape == (3, 4)


@pytest.mark.parametrize("x_shape", [(5,), (4, 5), (2, 3, 5), (0, 5)])
def test_linear_output_shape(x_shape):
    out = samattn.linear(meta(*x_shape), meta(7, 5), meta(7), activation="silu")
    assert out.shape == (*x_shape[:-1], 7) and out.dtype == torch.float16


def test_gemm_accepts_c_with_zero_beta_and_int_scalars():
    assert samattn.gemm(meta(4, 5), meta(5, 7), meta(4, 7), alpha=2).shape == (4, 7)


@pytest.mark.parametrize(
    "shape, dim", [((), 0), ((), -1), ((5,), 0), ((4, 5), -1), ((2, 3, 4), 1), ((0, 5), 1)]
)
def test_softmax_output_shape(shape, dim):
    out = samattn.softmax(meta(*shape), dim=dim)
    assert out.shape == shape and out.dtype == torch.float16
