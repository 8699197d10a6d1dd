"""The samattn ops: torch.library schemas, fake implementations, autograd, public functions.

Ops (namespace ``samattn``)::

    gemm(Tensor a, Tensor b, Tensor? c, float alpha, float beta) -> Tensor
    softmax(Tensor x, int dim) -> Tensor
    softmax_backward(Tensor y, Tensor dy, int dim) -> Tensor

The device implementations live in ``samattn/_cuda.py``; the fake implementations here
give ``torch.compile`` output shapes without running anything. Validation is shared
(``samattn/_checks.py``), so eager and compiled code raise the same errors. In plain eager
mode the public functions skip the dispatcher (``samattn/_eager.py``).
"""

# No `from __future__ import annotations`: torch.library reads these annotations at
# import time, and `Tensor | None` does not evaluate on Python 3.9.
from typing import Optional

import torch

from . import _checks, _cuda, _eager, _family

__all__ = ["gemm", "softmax"]


# ------------------------------------------------------------------ gemm ----
# One implementation for every device: CPU tensors reach it too, so that they
# get samattn's "needs CUDA tensors" error rather than the dispatcher's.
@torch.library.custom_op("samattn::gemm", mutates_args=())
def _gemm(
    a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor], alpha: float, beta: float
) -> torch.Tensor:
    return _cuda.gemm(a, b, c, alpha, beta)


@_gemm.register_fake
def _gemm_fake(
    a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor], alpha: float, beta: float
) -> torch.Tensor:
    sizes = _checks.gemm(a, b, c, alpha, beta)
    return a.new_empty(sizes.out_shape)


def _gemm_setup_context(ctx, inputs, output) -> None:
    a, b, c, alpha, beta = inputs
    ctx.save_for_backward(a, b)
    ctx.alpha, ctx.beta = alpha, beta
    ctx.c_shape = None if c is None else c.shape
    ctx.family = _family.requested_family()


def _gemm_any(
    a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor], alpha: float, beta: float
) -> torch.Tensor:
    """gemm by the cheapest route these tensors allow (samattn/_eager.py)."""
    route = _eager.route(a, b, c)
    if route == _eager.DIRECT:
        return _cuda.gemm(a, b, c, alpha, beta)
    if route == _eager.AUTOGRAD:
        return _GemmFunction.apply(a, b, c, alpha, beta)
    return torch.ops.samattn.gemm(a, b, c, alpha, beta)


def _gemm_backward(ctx, grad: torch.Tensor):
    """dA = alpha dD B^T, dB = alpha A^T dD, dC = beta dD, each summed where it broadcast."""
    a, b = ctx.saved_tensors
    grad_a = grad_b = grad_c = None
    # The backward runs on autograd's thread: replay the forward's family choice.
    with _family._forced_code(ctx.family):
        if ctx.needs_input_grad[0]:
            grad_a = _gemm_any(grad, b.mT, None, ctx.alpha, 0.0)
            if grad_a.shape != a.shape:
                grad_a = grad_a.sum_to_size(a.shape)
        if ctx.needs_input_grad[1]:
            grad_b = _gemm_any(a.mT, grad, None, ctx.alpha, 0.0)
            if grad_b.shape != b.shape:
                grad_b = grad_b.sum_to_size(b.shape)
    if ctx.needs_input_grad[2]:
        grad_c = (grad * ctx.beta).sum_to_size(ctx.c_shape)
    return grad_a, grad_b, grad_c, None, None


_gemm.register_autograd(_gemm_backward, setup_context=_gemm_setup_context)


class _GemmFunction(torch.autograd.Function):
    """The eager route with a gradient: the op's own forward, setup and backward,
    without the dispatcher. The forward takes ctx and runs the setup itself: with a
    separate setup_context, Function.apply inspects the forward's signature on every
    call, which costs more than the dispatcher it avoids."""

    @staticmethod
    def forward(ctx, *inputs):
        out = _cuda.gemm(*inputs)
        _gemm_setup_context(ctx, inputs, out)
        return out

    backward = staticmethod(_gemm_backward)


# --------------------------------------------------------------- softmax ----
@torch.library.custom_op("samattn::softmax", mutates_args=())
def _softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    return _cuda.softmax(x, dim)


@_softmax.register_fake
def _softmax_fake(x: torch.Tensor, dim: int) -> torch.Tensor:
    _checks.softmax(x, dim)
    return x.new_empty(x.shape)


@torch.library.custom_op("samattn::softmax_backward", mutates_args=())
def _softmax_backward(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    return _cuda.softmax_backward(y, dy, dim)


@_softmax_backward.register_fake
def _softmax_backward_fake(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    _checks.softmax_backward(y, dy, dim)
    return y.new_empty(y.shape)


def _softmax_setup_context(ctx, inputs, output) -> None:
    _, dim = inputs
    ctx.save_for_backward(output)
    ctx.dim = dim
    ctx.family = _family.requested_family()


def _softmax_grad(ctx, grad: torch.Tensor):
    (y,) = ctx.saved_tensors
    with _family._forced_code(ctx.family):
        if _eager.route(y, grad) == _eager.DIRECT:
            return _cuda.softmax_backward(y, grad, ctx.dim), None
        return torch.ops.samattn.softmax_backward(y, grad, ctx.dim), None


_softmax.register_autograd(_softmax_grad, setup_context=_softmax_setup_context)


class _SoftmaxFunction(torch.autograd.Function):
    """The eager route with a gradient (see _GemmFunction)."""

    @staticmethod
    def forward(ctx, *inputs):
        out = _cuda.softmax(*inputs)
        _softmax_setup_context(ctx, inputs, out)
        return out

    backward = staticmethod(_softmax_grad)


# ------------------------------------------------------- public functions ----
def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: Optional[torch.Tensor] = None,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> torch.Tensor:
    """``alpha * a @ b + beta * c``, batched, with fp32 accumulation.

    Args:
        a: (M, K) or (batch, M, K).
        b: (K, N) or (batch, K, N). Batch sizes must be equal, or one of them 1 or a 2-D
            operand (broadcast). Transposed views (``x.mT``) are read without a copy.
        c: None, or a tensor that broadcasts to the output shape (e.g. a bias of shape (N,)).
        alpha, beta: finite scalars; ``beta`` must be 0 when ``c`` is None.

    All tensors: the same CUDA device and the same dtype, one of torch.float16,
    torch.bfloat16, torch.float32 (float32 uses TF32 tensor cores unless
    ``torch.get_float32_matmul_precision() == "highest"``).

    Returns:
        A new contiguous tensor of the input dtype: (batch, M, N) if a or b is 3-D, else (M, N).

    Raises:
        ValueError / TypeError for bad arguments, samattn.UnsupportedError when this GPU,
        kernel family or build cannot run them, RuntimeError for CUDA errors.
    """
    alpha, beta = float(alpha), float(beta)
    route = _eager.route(a, b, c)
    if route == _eager.DIRECT:
        return _cuda.gemm(a, b, c, alpha, beta)
    if route == _eager.AUTOGRAD:
        return _GemmFunction.apply(a, b, c, alpha, beta)
    _checks.require_tensor(a, "samattn.gemm: a")
    _checks.require_tensor(b, "samattn.gemm: b")
    if c is not None:
        _checks.require_tensor(c, "samattn.gemm: c")
    return torch.ops.samattn.gemm(a, b, c, alpha, beta)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``, computed in fp32.

    Args:
        x: any shape (0-d included), on a CUDA device; dtype torch.float16, torch.bfloat16
            or torch.float32. Non-contiguous inputs are copied to contiguous first.
        dim: the dimension to normalise; negative counts from the end.

    Returns:
        A new contiguous tensor of x's shape and dtype. Differentiable.

    Raises:
        IndexError if dim is out of range; ValueError / TypeError for other bad arguments,
        samattn.UnsupportedError when this GPU, kernel family or build cannot run it.
    """
    route = _eager.route(x)
    if route == _eager.DIRECT:
        return _cuda.softmax(x, dim)
    _checks.require_tensor(x, "samattn.softmax: x")
    dim = _checks.softmax_dim(x, dim, "samattn.softmax")  # a clear error before the dispatcher's
    if route == _eager.AUTOGRAD:
        return _SoftmaxFunction.apply(x, dim)
    return torch.ops.samattn.softmax(x, dim)
