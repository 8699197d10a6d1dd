"""Argument validation and output shapes of the samattn ops.

Shared by the fake (meta) implementations and the CUDA implementations, so that
``torch.compile`` sees the same errors as eager mode. Shapes and dtypes are checked
before devices, so that every message can be tested on "meta" tensors without a GPU.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch

from . import _lib

DTYPE_CODES = {torch.float16: _lib.F16, torch.bfloat16: _lib.BF16, torch.float32: _lib.F32}
_SUPPORTED = "torch.float16, torch.bfloat16 or torch.float32"

# "meta" is accepted too: shape propagation without a GPU (fake tensors carry "cuda").
_DEVICE_TYPES = ("cuda", "meta")


def require_tensor(value: object, what: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(value).__name__}")


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_dtype(t: torch.Tensor, what: str) -> None:
    if t.dtype not in DTYPE_CODES:
        raise TypeError(f"{what} has dtype {t.dtype}; samattn supports {_SUPPORTED}")


def _check_same_dtype(t: torch.Tensor, what: str, reference: torch.Tensor, ref_what: str) -> None:
    if t.dtype != reference.dtype:
        raise TypeError(
            f"{what} has dtype {t.dtype} but {ref_what} has {reference.dtype}; "
            "all tensors must have the same dtype"
        )


def _check_devices(op: str, tensors: dict[str, torch.Tensor]) -> None:
    """All tensors on one CUDA device (or all on "meta")."""
    first_name, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        if t.device.type not in _DEVICE_TYPES:
            raise ValueError(
                f"{op}: samattn ops need CUDA tensors, but {name} is on {t.device}; "
                f"move it with {name}.cuda()"
            )
        if t.device != first.device:
            raise ValueError(
                f"{op}: all tensors must be on the same CUDA device, but {first_name} is on "
                f"{first.device} and {name} is on {t.device}"
            )


def _check_finite(value: float, what: str) -> None:
    if not math.isfinite(value):
        raise ValueError(f"samattn.gemm: {what} must be finite, got {value}")


@dataclass(frozen=True)
class GemmShape:
    """Sizes of D = alpha * A @ B + beta * C. `batch` is 1 for a 2-D output."""

    out_shape: tuple[int, ...]
    batch: int
    m: int
    n: int
    k: int


def gemm(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, alpha: float, beta: float
) -> GemmShape:
    """Validate gemm arguments (see samattn.gemm); return the problem sizes."""
    op = "samattn.gemm"
    require_tensor(a, f"{op}: a")
    require_tensor(b, f"{op}: b")
    if c is not None:
        require_tensor(c, f"{op}: c")
    if a.dim() not in (2, 3):
        raise ValueError(f"{op}: a must be 2-D (M, K) or 3-D (batch, M, K), got shape {_shape(a)}")
    if b.dim() not in (2, 3):
        raise ValueError(f"{op}: b must be 2-D (K, N) or 3-D (batch, K, N), got shape {_shape(b)}")
    m, k = a.shape[-2], a.shape[-1]
    k_b, n = b.shape[-2], b.shape[-1]
    if k != k_b:
        raise ValueError(
            f"{op}: inner sizes differ: a has K = {k} (shape {_shape(a)}) but b has K = {k_b} "
            f"(shape {_shape(b)})"
        )
    batch_a = a.shape[0] if a.dim() == 3 else 1
    batch_b = b.shape[0] if b.dim() == 3 else 1
    if batch_a != batch_b and batch_a != 1 and batch_b != 1:
        raise ValueError(
            f"{op}: batch sizes {batch_a} (a) and {batch_b} (b) differ; they must be equal, "
            "or one of them 1 (or a 2-D operand) to broadcast"
        )
    batch = batch_b if batch_a == 1 else batch_a
    out_shape = (batch, m, n) if a.dim() == 3 or b.dim() == 3 else (m, n)
    _check_dtype(a, f"{op}: a")
    _check_same_dtype(b, f"{op}: b", a, "a")
    if c is not None:
        _check_same_dtype(c, f"{op}: c", a, "a")
        if c.dim() > len(out_shape) or _broadcast(_shape(c), out_shape) != out_shape:
            raise ValueError(
                f"{op}: c of shape {_shape(c)} does not broadcast to the output shape {out_shape}"
            )
    _check_finite(alpha, "alpha")
    _check_finite(beta, "beta")
    if c is None and beta != 0.0:
        raise ValueError(f"{op}: beta is {beta} but c is None; pass c, or leave beta at 0")
    tensors = {"a": a, "b": b}
    if c is not None:
        tensors["c"] = c
    _check_devices(op, tensors)
    return GemmShape(out_shape=out_shape, batch=batch, m=m, n=n, k=k)


def _broadcast(shape: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(shape, target))
    except RuntimeError:
        return None


@dataclass(frozen=True)
class SoftmaxShape:
    """The contiguous (outer, dim, inner) view softmax runs on."""

    outer: int
    dim: int
    inner: int


def softmax_dim(x: torch.Tensor, dim: int, op: str) -> int:
    """`dim` normalised to [0, ndim); IndexError like torch's when out of range."""
    if isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got bool")
    try:
        dim = operator.index(dim)  # ints and int-likes (numpy integers)
    except TypeError:
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}") from None
    rank = max(x.dim(), 1)  # a 0-d tensor softmaxes as one element, dim 0 or -1
    if not -rank <= dim < rank:
        raise IndexError(
            f"{op}: Dimension out of range (expected to be in range of "
            f"[{-rank}, {rank - 1}], but got {dim})"
        )
    return dim % rank


def _softmax_view(x: torch.Tensor, dim: int) -> SoftmaxShape:
    shape = _shape(x) or (1,)
    return SoftmaxShape(
        outer=math.prod(shape[:dim]), dim=shape[dim], inner=math.prod(shape[dim + 1 :])
    )


def softmax(x: torch.Tensor, dim: int) -> SoftmaxShape:
    """Validate softmax arguments (see samattn.softmax); return the (outer, dim, inner) view."""
    op = "samattn.softmax"
    require_tensor(x, f"{op}: x")
    axis = softmax_dim(x, dim, op)
    _check_dtype(x, f"{op}: x")
    _check_devices(op, {"x": x})
    return _softmax_view(x, axis)


def softmax_backward(y: torch.Tensor, dy: torch.Tensor, dim: int) -> SoftmaxShape:
    """Validate softmax_backward arguments; return the (outer, dim, inner) view."""
    op = "samattn.softmax_backward"
    require_tensor(y, f"{op}: y")
    require_tensor(dy, f"{op}: dy")
    axis = softmax_dim(y, dim, op)
    if _shape(dy) != _shape(y):
        raise ValueError(f"{op}: dy has shape {_shape(dy)} but y has {_shape(y)}")
    _check_dtype(y, f"{op}: y")
    _check_same_dtype(dy, f"{op}: dy", y, "y")
    _check_devices(op, {"y": y, "dy": dy})
    return _softmax_view(y, axis)
