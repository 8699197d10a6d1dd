"""samattn.gemm on the GPU: every dtype mode x forced family, against fp64.

Each case compares samattn with an fp64 reference and with torch.matmul in
the same dtype and precision (gpu_checks.assert_close_to_reference).
"""

from __future__ import annotations

import math

import pytest
import torch
from gpu_checks import (
    GEMM_MODES,
    assert_close_to_reference,
    call_forced,
    expected_gemm_family,
    gemm_floor,
    poison_allocator,
    randn,
)
from reference import tf32_matmul

import samattn

MODES = GEMM_MODES

# (M, N, K) from {1, 7, 127, 1000, 4097}: every size in every position, small
# and large together, without the full cube.
SHAPES = [
    (1, 1, 1),
    (7, 7, 7),
    (127, 127, 127),
    (1000, 1000, 1000),
    (1, 7, 127),
    (7, 1, 1000),
    (127, 1000, 7),
    (1000, 127, 1),
    (1, 1000, 4097),
    (4097, 1, 127),
    (4097, 7, 1000),
    (7, 4097, 127),
    (127, 4097, 1000),
    (1000, 4097, 7),
    (4097, 127, 1),
    (1000, 1, 4097),
    (1, 4097, 1000),
    (127, 7, 4097),
    (4097, 1000, 127),
    (1000, 7, 127),
    (7, 127, 4097),
    (4097, 4097, 7),
    (127, 1, 1000),
    (1, 127, 7),
    (7, 1000, 1),
    (1000, 1000, 4097),
    (4097, 4097, 1000),
    (4097, 4097, 4097),
]


def _id(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def torch_gemm(a, b, c=None, alpha=1.0, beta=0.0, tf32=False):
    """torch's result in the inputs' dtype: the baseline error to compare with."""
    out = tf32_matmul(a, b) if tf32 else torch.matmul(a, b)
    if alpha == 1.0 and (beta == 0.0 or c is None):
        return out
    acc = alpha * out.float()
    if beta != 0.0 and c is not None:
        acc = acc + beta * c.float()
    return acc.to(a.dtype)


def check_gemm(family, mode, a, b, c=None, alpha=1.0, beta=0.0, what=""):
    dtype, precision = MODES[mode]
    torch.set_float32_matmul_precision(precision)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out_shape = (*batch, a.shape[-2], b.shape[-1])
    poison_allocator(out_shape, dtype)
    out = call_forced(
        family,
        lambda: samattn.gemm(a, b, c, alpha=alpha, beta=beta),
        may_launch_nothing=math.prod(out_shape) == 0,
        expected=expected_gemm_family(family, a, b, c, alpha, beta)
        if math.prod(out_shape)
        else None,
    )
    assert out.shape == out_shape and out.dtype == dtype, what
    assert out.device == a.device and out.is_contiguous(), what

    ref = alpha * (a.double() @ b.double())
    if c is not None and beta != 0.0:
        ref = ref + beta * c.double()
    baseline = torch_gemm(a, b, c, alpha, beta, tf32=mode == "tf32")
    k = a.shape[-1]
    floor = gemm_floor(dtype, k, tf32=mode == "tf32")
    assert_close_to_reference(out, ref, baseline, floor, f"{family} {mode} {what}")
    return out


def make_operand(rows: int, cols: int, dtype: torch.dtype, view: str) -> torch.Tensor:
    """A (rows, cols) operand laid out as `view` says."""
    if view == "contiguous":
        return randn(rows, cols, dtype=dtype)
    if view == "transposed":
        return randn(cols, rows, dtype=dtype).t()
    if view == "col_stride_2":  # neither row- nor column-major
        return randn(rows, 2 * cols, dtype=dtype)[:, ::2]
    if view == "offset_1":  # data pointer one element past an aligned address
        return randn(rows * cols + 1, dtype=dtype)[1:].view(rows, cols)
    if view == "odd_leading_dim":  # row stride cols + 3: not a multiple of 8
        return randn(rows, cols + 3, dtype=dtype)[:, :cols]
    if view == "transposed_offset_1":
        return randn(rows * cols + 1, dtype=dtype)[1:].view(cols, rows).t()
    raise ValueError(view)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_gemm_shapes(family, mode, shape):
    m, n, k = shape
    dtype = MODES[mode][0]
    check_gemm(family, mode, randn(m, k, dtype=dtype), randn(k, n, dtype=dtype), what=_id(shape))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(7, 127, 0), (1000, 1, 0), (0, 7, 127), (127, 0, 7)], ids=_id)
def test_gemm_empty(family, mode, shape):
    """K = 0 gives beta * C (zeros without C); M or N = 0 gives an empty output."""
    m, n, k = shape
    dtype = MODES[mode][0]
    a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
    out = check_gemm(family, mode, a, b, what=_id(shape))
    assert torch.count_nonzero(out) == 0
    if m and n:
        c = randn(m, n, dtype=dtype)
        check_gemm(family, mode, a, b, c, alpha=2.0, beta=0.5, what=f"{_id(shape)} with C")


LAYOUTS = [(a, b) for a in ("contiguous", "transposed") for b in ("contiguous", "transposed")]
STRIDED = [
    ("offset_1", "contiguous"),
    ("contiguous", "offset_1"),
    ("col_stride_2", "contiguous"),
    ("contiguous", "col_stride_2"),
    ("col_stride_2", "col_stride_2"),
    ("odd_leading_dim", "odd_leading_dim"),
    ("transposed_offset_1", "transposed"),
    ("odd_leading_dim", "transposed_offset_1"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "shape, a_view, b_view",
    [(s, a, b) for s in [(127, 1000, 127), (1000, 7, 4097), (64, 128, 256)] for a, b in LAYOUTS]
    + [(s, a, b) for s in [(127, 1000, 127), (4097, 127, 7)] for a, b in STRIDED],
    ids=lambda p: _id(p) if isinstance(p, tuple) else p,
)
def test_gemm_operand_views(family, mode, shape, a_view, b_view):
    """All four transposition combos, strided views and misaligned pointers."""
    m, n, k = shape
    dtype = MODES[mode][0]
    a = make_operand(m, k, dtype, a_view)
    b = make_operand(k, n, dtype, b_view)
    check_gemm(family, mode, a, b, what=f"{_id(shape)} A {a_view} B {b_view}")


def _batched_operands(case: str, batch: int, m: int, n: int, k: int, dtype: torch.dtype):
    if case == "both_3d":
        return randn(batch, m, k, dtype=dtype), randn(batch, k, n, dtype=dtype)
    if case == "a_2d":
        return randn(m, k, dtype=dtype), randn(batch, k, n, dtype=dtype)
    if case == "b_2d":
        return randn(batch, m, k, dtype=dtype), randn(k, n, dtype=dtype)
    if case == "a_batch_1":
        return randn(1, m, k, dtype=dtype), randn(batch, k, n, dtype=dtype)
    if case == "b_batch_1":
        return randn(batch, m, k, dtype=dtype), randn(1, k, n, dtype=dtype)
    if case == "both_mT":
        return randn(batch, k, m, dtype=dtype).mT, randn(batch, n, k, dtype=dtype).mT
    if case == "batch_stride_gap":
        return randn(2 * batch, m, k, dtype=dtype)[::2], randn(batch, k, n, dtype=dtype)
    raise ValueError(case)


BATCH_CASES = ["both_3d", "a_2d", "b_2d", "a_batch_1", "b_batch_1", "both_mT", "batch_stride_gap"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", BATCH_CASES)
@pytest.mark.parametrize("shape", [(4, 127, 65, 1000), (3, 7, 1000, 127)], ids=_id)
def test_gemm_batched(family, mode, case, shape):
    batch, m, n, k = shape
    a, b = _batched_operands(case, batch, m, n, k, MODES[mode][0])
    check_gemm(family, mode, a, b, what=f"{case} {_id(shape)}")


def _c_operand(kind: str, batch: int, m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    if kind == "full":
        return randn(m, n, dtype=dtype)
    if kind == "row":
        return randn(n, dtype=dtype)
    if kind == "column":
        return randn(m, 1, dtype=dtype)
    if kind == "batched_full":
        return randn(batch, m, n, dtype=dtype)
    if kind == "batched_shared":  # one (m, n) C for every batch
        return randn(m, n, dtype=dtype)
    raise ValueError(kind)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("c_kind", ["full", "row", "column", "batched_full", "batched_shared"])
@pytest.mark.parametrize("alpha, beta", [(1.0, 1.0), (0.5, -2.0), (-1.0, 0.25), (0.0, 1.5)])
def test_gemm_alpha_beta(family, mode, c_kind, alpha, beta):
    dtype = MODES[mode][0]
    batch, m, n, k = 3, 127, 1000, 129
    c = _c_operand(c_kind, batch, m, n, dtype)
    if c_kind.startswith("batched"):
        a, b = randn(batch, m, k, dtype=dtype), randn(batch, k, n, dtype=dtype)
    else:
        a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
    check_gemm(family, mode, a, b, c, alpha=alpha, beta=beta, what=f"C {c_kind} a={alpha} b={beta}")


@pytest.mark.parametrize("mode", MODES)
def test_gemm_beta_zero_ignores_nan_c(family, mode):
    """beta = 0 must not read C: NaN in C may not reach the output."""
    dtype = MODES[mode][0]
    a, b = randn(127, 129, dtype=dtype), randn(129, 65, dtype=dtype)
    c = torch.full((127, 65), float("nan"), dtype=dtype, device=a.device)
    out = check_gemm(family, mode, a, b, c, alpha=1.0, beta=0.0, what="NaN C, beta 0")
    assert torch.isfinite(out).all()


# ------------------------------------------------------------------ autograd


GRAD_CASES = {
    # name: (a shape, b shape, c shape or None)
    "2d": ((127, 65), (65, 33), None),
    "2d_c_full": ((127, 65), (65, 33), (127, 33)),
    "2d_c_row": ((127, 65), (65, 33), (33,)),
    "3d": ((3, 31, 17), (3, 17, 9), None),
    "a_2d_b_3d": ((31, 17), (4, 17, 9), (4, 31, 9)),
    "a_batch_1": ((1, 31, 17), (4, 17, 9), (31, 9)),
}


@pytest.mark.parametrize("mode", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("case", GRAD_CASES)
def test_gemm_backward(family, mode, case):
    """Gradients of A, B and C against fp64 autograd (torch's own as the baseline)."""
    dtype, precision = MODES[mode]
    torch.set_float32_matmul_precision(precision)
    a_shape, b_shape, c_shape = GRAD_CASES[case]
    alpha, beta = (1.5, 0.5) if c_shape else (1.0, 0.0)
    inputs = [randn(*a_shape, dtype=dtype), randn(*b_shape, dtype=dtype)]
    if c_shape:
        inputs.append(randn(*c_shape, dtype=dtype))

    def grads(tensors, fn, grad_out=None):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        out = fn(*leaves)
        if grad_out is None:
            grad_out = randn(*out.shape, dtype=out.dtype)
        return grad_out, torch.autograd.grad(out, leaves, grad_out.to(out.dtype))

    def samattn_gemm(a, b, c=None):
        expected = expected_gemm_family(family, a, b, c, alpha, beta)
        return call_forced(
            family, lambda: samattn.gemm(a, b, c, alpha=alpha, beta=beta), expected=expected
        )

    def torch_gemm_autograd(a, b, c=None):
        out = alpha * torch.matmul(a, b)
        return out if c is None else out + beta * c

    # Autograd runs backward on its own thread, so only the forward's family
    # is asserted; the context still forces the family wherever it applies.
    with samattn.use_family(family):
        grad_out, got = grads(inputs, samattn_gemm)
    _, ref = grads([t.double() for t in inputs], torch_gemm_autograd, grad_out)
    _, baseline = grads(inputs, torch_gemm_autograd, grad_out)

    k = max(max(a_shape), max(b_shape)) * math.prod(a_shape[:-2] or b_shape[:-2] or (1,))
    floor = gemm_floor(dtype, k, tf32=False)
    for name, g, r, base, x in zip("abc", got, ref, baseline, inputs):
        assert g.shape == x.shape and g.dtype == x.dtype, f"grad {name}"
        assert_close_to_reference(g, r, base, floor, f"{family} {mode} {case} grad {name}")
