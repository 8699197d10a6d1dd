"""samattn.softmax on the GPU: every dtype x forced family, forward and backward.

Reference: torch.softmax in fp64 on the same inputs; the tolerances are
gpu_checks.assert_softmax_close's. NaN positions (rows of all -inf, NaN
inputs) must match the reference exactly.
"""

from __future__ import annotations

import pytest
import torch
from gpu_checks import (
    DEVICE,
    UNIT_ROUNDOFF,
    assert_close_to_reference,
    assert_softmax_close,
    call_forced,
    poison_allocator,
    randn,
)

import samattn

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def _id(shape) -> str:
    return "x".join(map(str, shape)) or "scalar"


def check_softmax(family, x, dim=-1, what=""):
    poison_allocator(x.shape, x.dtype)
    out = call_forced(family, lambda: samattn.softmax(x, dim))
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device, what
    ref = torch.softmax(x.double(), dim)
    baseline = torch.softmax(x, dim)
    assert_softmax_close(out, ref, baseline, f"{family} {x.dtype} {what}")
    return out


# Last-dim sizes, with few rows for the long ones and many for the short ones.
LAST_DIM_SHAPES = [
    (4, 1),
    (65536, 1),
    (3, 7),
    (65536, 7),
    (5, 127),
    (4096, 127),
    (4, 1000),
    (1024, 1000),
    (4, 1024),
    (2048, 1024),
    (3, 4097),
    (257, 4097),
    (2, 8192),
    (64, 8192),
    (2, 32768),
    (2, 262144),
    (2, 3, 4, 1000),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", LAST_DIM_SHAPES, ids=_id)
def test_softmax_last_dim(family, dtype, shape):
    check_softmax(family, randn(*shape, dtype=DTYPES[dtype], scale=3.0), what=_id(shape))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape, dim",
    [((4, 129, 33), 1), ((8, 1000, 3), -2), ((37, 50), 0), ((2, 3, 4097, 2), 2), ((4097, 5), 0)],
    ids=str,
)
def test_softmax_inner_dim(family, dtype, shape, dim):
    """Softmax over a dim that is not the last (inner > 1)."""
    x = randn(*shape, dtype=DTYPES[dtype], scale=3.0)
    check_softmax(family, x, dim, what=f"{_id(shape)} dim {dim}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, dim", [((), -1), ((), 0), ((1000,), 0), ((1,), -1)], ids=str)
def test_softmax_low_rank(family, dtype, shape, dim):
    x = randn(*shape, dtype=DTYPES[dtype]) if shape else randn(1, dtype=DTYPES[dtype])[0]
    check_softmax(family, x, dim, what=f"{_id(shape)} dim {dim}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, dim", [((0, 7), -1), ((5, 0), -1), ((0,), 0), ((3, 0, 4), 1)])
def test_softmax_empty(family, dtype, shape, dim):
    x = torch.empty(shape, dtype=DTYPES[dtype], device=DEVICE)
    with samattn.use_family(family):
        out = samattn.softmax(x, dim)
    assert out.shape == x.shape and out.dtype == x.dtype


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("view", ["transposed", "col_stride_2", "transposed_dim_0", "offset_1"])
def test_softmax_non_contiguous(family, dtype, view):
    base = randn(1000, 130, dtype=DTYPES[dtype], scale=3.0)
    dim = -1
    if view == "transposed":
        x = base.t()
    elif view == "col_stride_2":
        x = base[:, ::2]
    elif view == "transposed_dim_0":
        x, dim = base.t(), 0
    else:
        x = base.flatten()[1 : 1 + 129 * 1007].view(129, 1007)  # misaligned
    check_softmax(family, x, dim, what=view)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [7, 1000, 4097, 32768])
def test_softmax_infinities_and_nan(family, dtype, cols):
    """Rows of all -inf give NaN (as torch); partly -inf rows give exact zeros there."""
    x = randn(6, cols, dtype=DTYPES[dtype], scale=3.0)
    x[0] = float("-inf")
    x[1, ::2] = float("-inf")
    x[2, 1:] = float("-inf")  # one finite value: exactly 1 there
    x[3, cols // 2] = float("nan")
    x[4, -1] = float("-inf")
    out = check_softmax(family, x, what=f"inf rows, {cols} cols")
    assert (out[1, ::2] == 0).all() and out[2, 0] == 1 and (out[2, 1:] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8, 1000), (4, 32768), (1024, 7)], ids=_id)
def test_softmax_large_magnitude(family, dtype, shape):
    """Inputs of magnitude 1e4 (and a constant row): max subtraction must be exact."""
    x = (randn(*shape, dtype=torch.float32) * 1e4).clamp(-6e4, 6e4).to(DTYPES[dtype])
    x[0] = 3e4
    check_softmax(family, x, what=f"x*1e4 {_id(shape)}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape, dim",
    [((4, 1000), -1), ((3, 4097), -1), ((2, 32768), -1), ((129, 7), -1), ((4, 129, 33), 1)],
    ids=str,
)
def test_softmax_backward(family, dtype, shape, dim):
    """x.grad of samattn.softmax(x).backward(g) against fp64 torch autograd."""
    x = randn(*shape, dtype=DTYPES[dtype], scale=3.0)
    grad_out = randn(*shape, dtype=DTYPES[dtype])

    def grad(x, fn):
        leaf = x.detach().clone().requires_grad_()
        fn(leaf).backward(grad_out.to(x.dtype))
        return leaf.grad

    # Autograd runs backward on its own thread: only the forward's family is asserted.
    with samattn.use_family(family):
        got = grad(x, lambda t: call_forced(family, lambda: samattn.softmax(t, dim)))
    ref = grad(x.double(), lambda t: torch.softmax(t, dim))
    baseline = grad(x, lambda t: torch.softmax(t, dim))
    assert got.dtype == x.dtype
    what = f"{family} {dtype} backward {_id(shape)} dim {dim}"
    floor = 1e-5 if dtype == "f32" else 0.5 * UNIT_ROUNDOFF[DTYPES[dtype]]
    assert_close_to_reference(got, ref, baseline, floor, what)
