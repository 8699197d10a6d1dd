"""The samattn ops: torch.library schemas, fake implementations, autograd, public functions.

Ops (namespace ``samattn``)::

    gemm(Tensor a, Tensor b, Tensor? c, float alpha, float beta, Tensor? bias=None,
         str? activation=None, ScalarType? out_dtype=None, int split_k=0,
         str split_k_mode="auto") -> Tensor
    grouped_gemm(Tensor x, Tensor w, Tensor offsets) -> Tensor
    grouped_gemm_k(Tensor a, Tensor b, Tensor offsets) -> Tensor
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
import torch.nn.functional as F

from . import _checks, _cuda, _eager, _family

__all__ = ["gemm", "grouped_gemm", "linear", "softmax"]


# ------------------------------------------------------------------ gemm ----
# One implementation for every device: CPU tensors reach it too, so that they
# get samattn's "needs CUDA tensors" error rather than the dispatcher's.
@torch.library.custom_op("samattn::gemm", mutates_args=())
def _gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: Optional[torch.Tensor],
    alpha: float,
    beta: float,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    out_dtype: Optional[torch.dtype] = None,
    split_k: int = 0,
    split_k_mode: str = "auto",
) -> torch.Tensor:
    return _cuda.gemm(
        a, b, c, alpha, beta, bias, activation, out_dtype, _split_k(split_k), split_k_mode
    )


@_gemm.register_fake
def _gemm_fake(
    a: torch.Tensor,
    b: torch.Tensor,
    c: Optional[torch.Tensor],
    alpha: float,
    beta: float,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    out_dtype: Optional[torch.dtype] = None,
    split_k: int = 0,
    split_k_mode: str = "auto",
) -> torch.Tensor:
    sizes = _checks.gemm(
        a, b, c, alpha, beta, bias, activation, out_dtype, _split_k(split_k), split_k_mode
    )
    return a.new_empty(sizes.out_shape, dtype=sizes.out_dtype or a.dtype)


def _split_k(count: "int | str") -> "int | str":
    """The op's split_k (an int schema argument, 0 = automatic) as gemm's; gemm's own
    form passes unchanged."""
    return "auto" if count == 0 and type(count) is int else count


def _split_k_count(split_k: "int | str") -> "int | str":
    """gemm's split_k as the op's int (0 = automatic); anything else unchanged, for the
    checks to name."""
    return 0 if split_k == "auto" else split_k


def _gemm_setup_context(ctx, inputs, output) -> None:
    a, b, c, alpha, beta = inputs[:5]
    bias, activation, out_dtype, split_k, split_k_mode = (
        *inputs[5:],
        *(None, None, None, 0, "auto")[len(inputs) - 5 :],
    )
    # With an activation the backward recomputes the pre-activation: it needs c and bias.
    keep = (c, bias) if activation is not None else (None, None)
    ctx.save_for_backward(a, b, *keep)
    # Two attributes: each costs the eager call a setattr.
    ctx.gemm = (
        alpha, beta, None if c is None else c.shape, activation, out_dtype, _split_k(split_k),
        split_k_mode,
    )  # fmt: skip
    ctx.family = _family.requested_family()


def _gemm_any(
    a: torch.Tensor,
    b: torch.Tensor,
    c: Optional[torch.Tensor],
    alpha: float,
    beta: float,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    out_dtype: Optional[torch.dtype] = None,
    split_k: "int | str" = "auto",
    split_k_mode: str = "auto",
) -> torch.Tensor:
    """gemm by the cheapest route these tensors allow (samattn/_eager.py)."""
    route = _eager.route(a, b, c, bias)
    if route == _eager.DIRECT:
        return _cuda.gemm(a, b, c, alpha, beta, bias, activation, out_dtype, split_k, split_k_mode)
    if route == _eager.AUTOGRAD:
        return _GemmFunction.apply(
            a, b, c, alpha, beta, bias, activation, out_dtype, split_k, split_k_mode
        )
    return torch.ops.samattn.gemm(
        a, b, c, alpha, beta, bias, activation, out_dtype, _split_k_count(split_k), split_k_mode
    )


def _activate(z: torch.Tensor, activation: str) -> torch.Tensor:
    """torch's own activation, which the kernels' epilogue reproduces."""
    if activation == "relu":
        return torch.relu(z)
    if activation == "silu":
        return F.silu(z)
    return F.gelu(z, approximate="tanh" if activation == "gelu_tanh" else "none")


def _activation_grad(grad: torch.Tensor, z: torch.Tensor, activation: str) -> torch.Tensor:
    """d activation(z) / dz times grad, by torch's backward formulas."""
    if activation == "relu":
        return torch.ops.aten.threshold_backward(grad, z, 0)
    if activation == "silu":
        return torch.ops.aten.silu_backward(grad, z)
    approximate = "tanh" if activation == "gelu_tanh" else "none"
    return torch.ops.aten.gelu_backward(grad, z, approximate=approximate)


@_family.replays_family
def _gemm_backward(ctx, grad: torch.Tensor):
    """dZ = act'(Z) dD (Z the pre-activation, recomputed), dA = alpha dZ B^T,
    dB = alpha A^T dZ, dC = beta dZ, dbias = dZ summed over rows, each summed where it
    broadcast. As many gradients as the forward had inputs."""
    a, b, c, bias = ctx.saved_tensors
    alpha, beta, c_shape, activation, out_dtype, split_k, split_k_mode = ctx.gemm
    needs = ctx.needs_input_grad
    grad_a = grad_b = grad_c = grad_bias = None
    if activation is not None:
        z = _gemm_any(a, b, c, alpha, beta, bias, None, out_dtype, split_k, split_k_mode)
        grad = _activation_grad(grad, z, activation)
    grad_in = grad if grad.dtype == a.dtype else grad.to(a.dtype)  # an fp32 output
    if needs[0]:
        grad_a = _gemm_any(grad_in, b.mT, None, alpha, 0.0)
        if grad_a.shape != a.shape:
            grad_a = grad_a.sum_to_size(a.shape)
    if needs[1]:
        grad_b = _gemm_any(a.mT, grad_in, None, alpha, 0.0)
        if grad_b.shape != b.shape:
            grad_b = grad_b.sum_to_size(b.shape)
    if needs[2]:
        grad_c = (grad * beta).sum_to_size(c_shape)
    if len(needs) > 5 and needs[5]:
        grad_bias = grad.flatten(0, -2).sum(0, dtype=torch.float32).to(a.dtype)
    grads = (grad_a, grad_b, grad_c, None, None, grad_bias, None, None, None, None)
    return grads[: len(needs)]


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


# ---------------------------------------------------------- grouped gemm ----
@torch.library.custom_op("samattn::grouped_gemm", mutates_args=())
def _grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return _cuda.grouped_gemm(x, w, offsets)


@_grouped_gemm.register_fake
def _grouped_gemm_fake(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return x.new_empty(_checks.grouped_gemm(x, w, offsets).out_shape)


@torch.library.custom_op("samattn::grouped_gemm_k", mutates_args=())
def _grouped_gemm_k(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return _cuda.grouped_gemm_k(a, b, offsets)


@_grouped_gemm_k.register_fake
def _grouped_gemm_k_fake(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return a.new_empty(_checks.grouped_gemm_k(a, b, offsets).out_shape)


def _grouped_gemm_setup_context(ctx, inputs, output) -> None:
    x, w, offsets = inputs
    ctx.save_for_backward(x, w, offsets)
    ctx.family = _family.requested_family()


def _grouped_gemm_backward(ctx, grad: torch.Tensor):
    """dx[rows of g] = dy[rows of g] @ w[g]^T (the rows after the last end: 0, as they
    never reached the output); dw[g] = x[rows of g]^T @ dy[rows of g] (a K-grouped GEMM:
    the rows are its K)."""
    x, w, offsets = ctx.saved_tensors
    grad_x = grad_w = None
    with _family._forced_code(ctx.family):
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.samattn.grouped_gemm(grad, w.mT, offsets)
        if ctx.needs_input_grad[1]:
            grad_w = torch.ops.samattn.grouped_gemm_k(x.mT, grad, offsets)
    return grad_x, grad_w, None


_grouped_gemm.register_autograd(_grouped_gemm_backward, setup_context=_grouped_gemm_setup_context)


@torch.library.custom_op("samattn::grouped_gemm_list", mutates_args=())
def _grouped_gemm_list(as_: list[torch.Tensor], bs: list[torch.Tensor]) -> list[torch.Tensor]:
    return _cuda.grouped_gemm_list(as_, bs)


@_grouped_gemm_list.register_fake
def _grouped_gemm_list_fake(as_: list[torch.Tensor], bs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [a.new_empty(m, n) for a, (m, n, _) in zip(as_, _checks.grouped_gemm_list(as_, bs))]


def _grouped_gemm_list_setup_context(ctx, inputs, output) -> None:
    as_, bs = inputs
    ctx.save_for_backward(*as_, *bs)
    ctx.count = len(as_)
    ctx.family = _family.requested_family()


def _grouped_gemm_list_backward(ctx, grads):
    """da[i] = dout[i] @ b[i]^T and db[i] = a[i]^T @ dout[i], each a list of GEMMs."""
    saved = ctx.saved_tensors
    as_, bs = saved[: ctx.count], saved[ctx.count :]
    grads = [
        a.new_zeros(a.shape[0], b.shape[1]) if g is None else g for a, b, g in zip(as_, bs, grads)
    ]
    grad_as = grad_bs = None
    with _family._forced_code(ctx.family):
        if ctx.needs_input_grad[0]:
            grad_as = torch.ops.samattn.grouped_gemm_list(grads, [b.mT for b in bs])
        if ctx.needs_input_grad[1]:
            grad_bs = torch.ops.samattn.grouped_gemm_list([a.mT for a in as_], grads)
    return grad_as, grad_bs


_grouped_gemm_list.register_autograd(
    _grouped_gemm_list_backward, setup_context=_grouped_gemm_list_setup_context
)


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


@_family.replays_family
def _softmax_grad(ctx, grad: torch.Tensor):
    (y,) = ctx.saved_tensors
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
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    out_dtype: Optional[torch.dtype] = None,
    split_k: "int | str" = "auto",
    split_k_mode: str = "auto",
) -> torch.Tensor:
    """``activation(alpha * a @ b + beta * c + bias)``, batched, with fp32 accumulation;
    the scaling, bias and activation run in fp32 in the GEMM's epilogue.

    Args:
        a: (M, K) or (batch, M, K).
        b: (K, N) or (batch, K, N). Batch sizes must be equal, or one of them 1 or a 2-D
            operand (broadcast). Transposed views (``x.mT``) are read without a copy.
        c: None, or a tensor of the output's dtype that broadcasts to the output shape.
        alpha, beta: finite scalars; ``beta`` must be 0 when ``c`` is None.
        bias: None, or (N,): one value per output column, broadcast over rows and batch;
            a's dtype.
        activation: None, "relu", "gelu", "gelu_tanh" or "silu" (torch's ``F.relu``,
            ``F.gelu``, ``F.gelu(approximate="tanh")``, ``F.silu``).
        out_dtype: None (a's dtype) or torch.float32 (for float16 / bfloat16 inputs: the
            fp32 result without rounding to 16 bits).
        split_k: "auto" (the kernel family decides: on Hopper, stream-K splits K when
            the output tiles cannot fill the GPU), 1 (never split), or 2..64: K is cut
            into that many ranges (fewer when K is short), computed by separate CTAs and
            added up in fp32. For a small output with a long K.
        split_k_mode: for a forced split (split_k >= 2): "auto" (the family's own),
            "serial" (the splits of a tile add up in K order inside one kernel: the sm90
            family) or "parallel" (each split writes fp32 partial sums and a second
            kernel adds them: the sm80 and sm75 families, which Hopper uses for this
            mode). Both are deterministic: a fixed split gives bit-identical results.
            Splitting needs tensor cores (not exact float32, nor bfloat16 on Turing).

    a, b and bias: the same CUDA device and the same dtype, one of torch.float16,
    torch.bfloat16, torch.float32 (float32 uses TF32 tensor cores unless
    ``torch.get_float32_matmul_precision() == "highest"``).

    Differentiable in a, b, c and bias. With an activation and a gradient to compute,
    the GEMM writes the pre-activation and torch applies the activation (its backward
    needs the pre-activation); without a gradient the activation is fused.

    Returns:
        A new contiguous tensor of dtype ``out_dtype``: (batch, M, N) if a or b is 3-D,
        else (M, N).

    Raises:
        samattn.ArgumentError (a ValueError) / TypeError for bad arguments,
        samattn.UnsupportedError when this GPU, kernel family or build cannot run them,
        RuntimeError for CUDA errors.
    """
    alpha, beta = float(alpha), float(beta)
    split = split_k != "auto" or split_k_mode != "auto"
    if split:  # named by samattn's checks, before any op's schema sees them
        _checks.split_k_codes(split_k, split_k_mode, "samattn.gemm")
    if bias is None and activation is None and out_dtype is None and not split:
        route = _eager.route(a, b, c)
        if route == _eager.DIRECT:
            return _cuda.gemm(a, b, c, alpha, beta)
        if route == _eager.AUTOGRAD:
            return _GemmFunction.apply(a, b, c, alpha, beta)
    _checks.require_tensor(a, "samattn.gemm: a")
    _checks.require_tensor(b, "samattn.gemm: b")
    if c is not None:
        _checks.require_tensor(c, "samattn.gemm: c")
    if bias is not None:
        _checks.require_tensor(bias, "samattn.gemm: bias")
    if (
        activation is not None
        and torch.is_grad_enabled()
        and (
            a.requires_grad
            or b.requires_grad
            or (c is not None and c.requires_grad)
            or (bias is not None and bias.requires_grad)
        )
    ):
        # Training: the GEMM gives the pre-activation, which the activation's
        # backward needs; torch's activation keeps it (no recomputation). The name is
        # checked here, before the GEMM runs; the fused call's checks do it otherwise.
        _checks.activation_code(activation, "samattn.gemm")
        z = gemm(
            a, b, c, alpha=alpha, beta=beta, bias=bias, out_dtype=out_dtype, split_k=split_k,
            split_k_mode=split_k_mode,
        )  # fmt: skip
        return _activate(z, activation)
    return _gemm_any(a, b, c, alpha, beta, bias, activation, out_dtype, split_k, split_k_mode)


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """A mixture-of-experts GEMM in one launch: ``out[rows of e] = x[rows of e] @ w[e]``,
    where expert e owns rows ``offsets[e-1] .. offsets[e]`` of x (``offsets[-1]`` = 0).

    Args:
        x: (tokens, K), float16 or bfloat16, rows sorted by expert.
        w: (experts, K, N), x's dtype. A weight stored (experts, N, K), as
            ``nn.Linear`` keeps it, is passed as ``w.mT`` (read in place).
        offsets: (experts,) torch.int32 cumulative row ends, non-decreasing, at most
            tokens: ``offsets = counts.cumsum(0).int()``. Experts with no rows are
            allowed. On x's device (the kernels read it there: no synchronization), or
            on the CPU (checked, then copied).

    Returns:
        (tokens, N) in x's dtype; rows after ``offsets[-1]`` are zeros. fp32 accumulation.
        Differentiable in x and w.

    Offsets on the GPU are not checked (that would wait for the GPU): the kernels clamp
    them into [0, tokens], so bad ones never address memory outside x, w or the output,
    but the rows of the experts involved are then undefined. On Hopper, runs on the sm90
    family's grouped wgmma kernel (the weight gradient too) when K and N are multiples of
    8 and x is row-major; otherwise on the tensor cores of the sm80 family (sm75 for
    float16 on Turing).
    """
    return torch.ops.samattn.grouped_gemm(x, w, offsets)


def grouped_gemm_list(as_: list[torch.Tensor], bs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Independent GEMMs of any sizes in one call: ``out[i] = as_[i] @ bs[i]``.

    Args:
        as_: a list of (M_i, K_i) tensors, float16 or bfloat16.
        bs: a list of (K_i, N_i) tensors, one per a, of the same dtype; transposed views
            (``w.mT`` of an (N_i, K_i) weight) are read in place.

    Returns:
        A list of new contiguous (M_i, N_i) tensors in that dtype, fp32 accumulation;
        zeros where K_i is 0. Differentiable in every a and b.

    All tensors on one CUDA device. On Hopper the sm90 family runs the whole list in one
    launch of its grouped wgmma kernel when every a is row-major, every b row-major or
    every b a transposed view, and every K_i and N_i a multiple of 8 (16 bytes); otherwise,
    and on older GPUs, the GEMMs run one after another (one launch each).
    """
    for name, value in (("as_", as_), ("bs", bs)):  # named before the op's schema sees them
        if not isinstance(value, (list, tuple)):
            raise TypeError(
                f"samattn.grouped_gemm_list: {name} must be a list of tensors, got "
                f"{type(value).__name__}"
            )
        for i, t in enumerate(value):
            _checks.require_tensor(t, f"samattn.grouped_gemm_list: {name}[{i}]")
    return torch.ops.samattn.grouped_gemm_list(list(as_), list(bs))


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
) -> torch.Tensor:
    """``activation(F.linear(x, weight, bias))`` as one GEMM with the bias and the
    activation in its epilogue.

    Args:
        x: (*, in_features), any leading dimensions.
        weight: (out_features, in_features), ``torch.nn.Linear``'s layout.
        bias: None or (out_features,).
        activation: None, "relu", "gelu", "gelu_tanh" or "silu" (see samattn.gemm).

    x, weight and bias: one CUDA device, one dtype (float16, bfloat16 or float32).

    Returns:
        (*, out_features), x's dtype. Differentiable in x, weight and bias.
    """
    _checks.require_tensor(x, "samattn.linear: x")
    _checks.require_tensor(weight, "samattn.linear: weight")
    if weight.dim() != 2:
        raise _checks.ArgumentError(
            "samattn.linear: weight must be 2-D (out_features, in_features), got shape "
            f"{tuple(weight.shape)}"
        )
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise _checks.ArgumentError(
            f"samattn.linear: x's last dimension must be in_features = {weight.shape[1]} "
            f"(weight {tuple(weight.shape)}), got x of shape {tuple(x.shape)}"
        )
    if x.dim() == 2:  # no reshape: each costs a dispatcher call
        return gemm(x, weight.mT, bias=bias, activation=activation)
    out = gemm(x.reshape(-1, x.shape[-1]), weight.mT, bias=bias, activation=activation)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``, computed in fp32.

    Args:
        x: any shape (0-d included), on a CUDA device; dtype torch.float16, torch.bfloat16
            or torch.float32. Non-contiguous inputs are copied to contiguous first.
        dim: the dimension to normalise; negative counts from the end.

    Returns:
        A new contiguous tensor of x's shape and dtype. Differentiable.

    Raises:
        IndexError if dim is out of range; samattn.ArgumentError (a ValueError) /
        TypeError for other bad arguments, samattn.UnsupportedError when this GPU, kernel
        family or build cannot run it.
    """
    route = _eager.route(x)
    if route == _eager.DIRECT:
        return _cuda.softmax(x, dim)
    _checks.require_tensor(x, "samattn.softmax: x")
    dim = _checks.softmax_dim(x, dim, "samattn.softmax")  # a clear error before the dispatcher's
    if route == _eager.AUTOGRAD:
        return _SoftmaxFunction.apply(x, dim)
    return torch.ops.samattn.softmax(x, dim)
