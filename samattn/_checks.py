"""Argument validation and output shapes of the samattn ops.

Shared by the fake (meta) implementations and the CUDA implementations, so that
``torch.compile`` sees the same errors as eager mode. Shapes and dtypes are checked
before devices, so that every message can be tested on "meta" tensors without a GPU.
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch._subclasses.fake_tensor import is_fake

from . import _dropout, _lib
from ._lib import ArgumentError

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
            raise ArgumentError(
                f"{op}: samattn ops need CUDA tensors, but {name} is on {t.device}; "
                f"move it with {name}.cuda()"
            )
        if t.device != first.device:
            raise ArgumentError(
                f"{op}: all tensors must be on the same CUDA device, but {first_name} is on "
                f"{first.device} and {name} is on {t.device}"
            )


def _check_finite(value: float, what: str) -> None:
    if not math.isfinite(value):
        raise ArgumentError(f"samattn.gemm: {what} must be finite, got {value}")


class GemmShape(NamedTuple):
    """Sizes of D = act(alpha * A @ B + beta * C + bias). `batch` is 1 for a 2-D output;
    `activation` is the SAMATTN_ACTIVATION_* code, `out_dtype` D's dtype (None: A's)."""

    out_shape: tuple[int, ...]
    batch: int
    m: int
    n: int
    k: int
    activation: int = 0
    out_dtype: torch.dtype | None = None
    split_k: int = 0
    split_k_mode: int = 0


def activation_code(activation: str | None, op: str) -> int:
    """The SAMATTN_ACTIVATION_* code of an activation name (None: no activation)."""
    code = None
    if activation is None or isinstance(activation, str):
        code = _lib.ACTIVATION_CODES.get(activation)
    if code is None:
        names = ", ".join(repr(name) for name in _lib.ACTIVATION_CODES if name is not None)
        raise ArgumentError(f"{op}: activation must be None or one of {names}, got {activation!r}")
    return code


def split_k_codes(split_k: int | str, split_k_mode: str, op: str) -> tuple[int, int]:
    """samattn.gemm's split_k ("auto" or 1..64) and split_k_mode ("auto", "serial" or
    "parallel") as the C API's codes (split_k 0 = automatic)."""
    if split_k == "auto":
        count = 0
    elif isinstance(split_k, bool) or not isinstance(split_k, int):
        raise TypeError(
            f"{op}: split_k must be 'auto' or an int in 1..{_lib.MAX_SPLIT_K}, got {split_k!r}"
        )
    elif not 1 <= split_k <= _lib.MAX_SPLIT_K:
        raise ArgumentError(f"{op}: split_k must be 'auto' or 1..{_lib.MAX_SPLIT_K}, got {split_k}")
    else:
        count = split_k
    mode = _lib.SPLIT_K_MODE_CODES.get(split_k_mode) if isinstance(split_k_mode, str) else None
    if mode is None:
        names = ", ".join(repr(name) for name in _lib.SPLIT_K_MODE_CODES)
        raise ArgumentError(f"{op}: split_k_mode must be one of {names}, got {split_k_mode!r}")
    return count, mode


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    alpha: float,
    beta: float,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
    split_k: int | str = "auto",
    split_k_mode: str = "auto",
) -> GemmShape:
    """Validate gemm arguments (see samattn.gemm); return the problem sizes."""
    op = "samattn.gemm"
    require_tensor(a, f"{op}: a")
    require_tensor(b, f"{op}: b")
    if c is not None:
        require_tensor(c, f"{op}: c")
    if a.dim() not in (2, 3):
        raise ArgumentError(
            f"{op}: a must be 2-D (M, K) or 3-D (batch, M, K), got shape {_shape(a)}"
        )
    if b.dim() not in (2, 3):
        raise ArgumentError(
            f"{op}: b must be 2-D (K, N) or 3-D (batch, K, N), got shape {_shape(b)}"
        )
    m, k = a.shape[-2], a.shape[-1]
    k_b, n = b.shape[-2], b.shape[-1]
    if k != k_b:
        raise ArgumentError(
            f"{op}: inner sizes differ: a has K = {k} (shape {_shape(a)}) but b has K = {k_b} "
            f"(shape {_shape(b)})"
        )
    batch_a = a.shape[0] if a.dim() == 3 else 1
    batch_b = b.shape[0] if b.dim() == 3 else 1
    if batch_a != batch_b and batch_a != 1 and batch_b != 1:
        raise ArgumentError(
            f"{op}: batch sizes {batch_a} (a) and {batch_b} (b) differ; they must be equal, "
            "or one of them 1 (or a 2-D operand) to broadcast"
        )
    batch = batch_b if batch_a == 1 else batch_a
    out_shape = (batch, m, n) if a.dim() == 3 or b.dim() == 3 else (m, n)
    _check_dtype(a, f"{op}: a")
    _check_same_dtype(b, f"{op}: b", a, "a")
    code = activation_code(activation, op)
    splits, mode = split_k_codes(split_k, split_k_mode, op)
    if out_dtype is not None and out_dtype not in (a.dtype, torch.float32):
        raise TypeError(
            f"{op}: out_dtype must be None, a's dtype ({a.dtype}) or torch.float32, got {out_dtype}"
        )
    out = a.dtype if out_dtype is None else out_dtype
    if bias is not None:
        require_tensor(bias, f"{op}: bias")
        if _shape(bias) != (n,):
            raise ArgumentError(
                f"{op}: bias must have shape (N,) = ({n},), one value per output column, "
                f"got {_shape(bias)}"
            )
        _check_same_dtype(bias, f"{op}: bias", a, "a")
    if c is not None:
        if c.dtype != out:
            raise TypeError(
                f"{op}: c has dtype {c.dtype} but the output is {out}; c must have the "
                "output's dtype"
            )
        if c.dim() > len(out_shape) or _broadcast(_shape(c), out_shape) != out_shape:
            raise ArgumentError(
                f"{op}: c of shape {_shape(c)} does not broadcast to the output shape {out_shape}"
            )
    _check_finite(alpha, "alpha")
    _check_finite(beta, "beta")
    if c is None and beta != 0.0:
        raise ArgumentError(f"{op}: beta is {beta} but c is None; pass c, or leave beta at 0")
    tensors = {"a": a, "b": b}
    if c is not None:
        tensors["c"] = c
    if bias is not None:
        tensors["bias"] = bias
    _check_devices(op, tensors)
    return GemmShape(out_shape, batch, m, n, k, code, None if out is a.dtype else out, splits, mode)


class GroupedShape(NamedTuple):
    """Sizes of a grouped GEMM: `groups` groups over `rows` rows (or K), (m, n, k) of the
    underlying GEMM as the C API takes it (see samattn.h, grouped GEMM)."""

    out_shape: tuple[int, ...]
    groups: int
    m: int
    n: int
    k: int


_GROUPED_DTYPES = (torch.float16, torch.bfloat16)
MAX_GROUPS = 65535


def _check_offsets(offsets: torch.Tensor, groups: int, limit: int, op: str) -> None:
    """offsets: (groups,) int32 cumulative ends in [0, limit], on the operands' device or
    the CPU. Values are checked only on the CPU (reading them from the GPU would wait for
    it); the kernels clamp them either way."""
    require_tensor(offsets, f"{op}: offsets")
    if offsets.dtype != torch.int32:
        raise TypeError(f"{op}: offsets must be torch.int32, got {offsets.dtype}")
    if _shape(offsets) != (groups,):
        raise ArgumentError(
            f"{op}: offsets must have shape ({groups},), one cumulative end per group, got "
            f"{_shape(offsets)}"
        )
    if offsets.device.type == "cpu" and groups > 0 and not is_fake(offsets):
        ends = offsets.tolist()
        bad = next((g for g in range(groups) if ends[g] < (ends[g - 1] if g else 0)), None)
        if bad is not None:
            raise ArgumentError(
                f"{op}: offsets must be non-decreasing from 0, but offsets[{bad}] = {ends[bad]} "
                f"follows {ends[bad - 1] if bad else 0}"
            )
        if ends[-1] > limit:
            raise ArgumentError(
                f"{op}: offsets[-1] = {ends[-1]} exceeds the {limit} rows of the input"
            )


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> GroupedShape:
    """Validate grouped_gemm arguments (see samattn.grouped_gemm); return the sizes."""
    op = "samattn.grouped_gemm"
    require_tensor(x, f"{op}: x")
    require_tensor(w, f"{op}: w")
    if x.dim() != 2:
        raise ArgumentError(f"{op}: x must be 2-D (tokens, K), got shape {_shape(x)}")
    if w.dim() != 3:
        raise ArgumentError(f"{op}: w must be 3-D (experts, K, N), got shape {_shape(w)}")
    tokens, k = x.shape
    groups, k_w, n = w.shape
    if k != k_w:
        raise ArgumentError(
            f"{op}: x has K = {k} (shape {_shape(x)}) but w has K = {k_w} (shape {_shape(w)}); "
            "a weight stored (experts, N, K) is passed as w.mT"
        )
    if not 1 <= groups <= MAX_GROUPS:
        raise ArgumentError(f"{op}: w must have 1..{MAX_GROUPS} experts, got {groups}")
    if x.dtype not in _GROUPED_DTYPES:
        raise TypeError(f"{op}: x has dtype {x.dtype}; grouped GEMMs take float16 or bfloat16")
    _check_same_dtype(w, f"{op}: w", x, "x")
    _check_offsets(offsets, groups, tokens, op)
    _check_devices(op, {"x": x, "w": w})
    if offsets.device.type != "cpu" and offsets.device != x.device:
        raise ArgumentError(
            f"{op}: offsets must be on x's device ({x.device}) or the CPU, got {offsets.device}"
        )
    return GroupedShape((tokens, n), groups, tokens, n, k)


def grouped_gemm_k(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> GroupedShape:
    """Validate the K-grouped GEMM out[g] = a[:, ks] @ b[ks, :] (the weight gradient of
    grouped_gemm); return the sizes."""
    op = "samattn.grouped_gemm (weight gradient)"
    require_tensor(a, f"{op}: a")
    require_tensor(b, f"{op}: b")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ArgumentError(
            f"{op}: a (M, K) and b (K, N) expected, got {_shape(a)} and {_shape(b)}"
        )
    if a.dtype not in _GROUPED_DTYPES:
        raise TypeError(f"{op}: a has dtype {a.dtype}; grouped GEMMs take float16 or bfloat16")
    _check_same_dtype(b, f"{op}: b", a, "a")
    require_tensor(offsets, f"{op}: offsets")
    groups = offsets.shape[0] if offsets.dim() == 1 else -1
    if not 1 <= groups <= MAX_GROUPS:
        raise ArgumentError(f"{op}: offsets must be 1-D with 1..{MAX_GROUPS} ends")
    m, k = a.shape
    n = b.shape[1]
    _check_offsets(offsets, groups, k, op)
    _check_devices(op, {"a": a, "b": b})
    return GroupedShape((groups, m, n), groups, m, n, k)


def grouped_gemm_list_quick(
    as_: Sequence[torch.Tensor], bs: Sequence[torch.Tensor]
) -> list[tuple[int, int, int]] | None:
    """Each GEMM's (M, N, K) for a plainly valid list of CUDA tensors, else None (then
    grouped_gemm_list() decides and raises). The eager path's cheap check: no message is
    formatted and no device object made per tensor; it accepts only what
    grouped_gemm_list() accepts."""
    if type(as_) not in (list, tuple) or type(bs) not in (list, tuple):
        return None
    if len(as_) != len(bs) or not 1 <= len(as_) <= MAX_GROUPS:
        return None
    first = as_[0]
    if not isinstance(first, torch.Tensor) or first.dtype not in _GROUPED_DTYPES:
        return None
    dtype, device = first.dtype, first.get_device()
    if device < 0:  # CPU or meta: the full check names the problem
        return None
    sizes = []
    for a, b in zip(as_, bs):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return None
        if a.dtype is not dtype or b.dtype is not dtype or not (a.is_cuda and b.is_cuda):
            return None
        if a.get_device() != device or b.get_device() != device:
            return None
        shape_a, shape_b = a.shape, b.shape
        if len(shape_a) != 2 or len(shape_b) != 2 or shape_a[1] != shape_b[0]:
            return None
        sizes.append((shape_a[0], shape_b[1], shape_a[1]))
    return sizes


def grouped_gemm_list(
    as_: Sequence[torch.Tensor], bs: Sequence[torch.Tensor]
) -> list[tuple[int, int, int]]:
    """Validate grouped_gemm_list arguments (see samattn.grouped_gemm_list); return each
    GEMM's (M, N, K)."""
    op = "samattn.grouped_gemm_list"
    for name, value in (("as_", as_), ("bs", bs)):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{op}: {name} must be a list of tensors, got {type(value).__name__}")
    if len(as_) != len(bs):
        raise ArgumentError(f"{op}: one b per a: as_ has {len(as_)} tensors, bs {len(bs)}")
    if not 1 <= len(as_) <= MAX_GROUPS:
        raise ArgumentError(f"{op}: 1..{MAX_GROUPS} GEMMs, got {len(as_)}")
    sizes = []
    tensors: dict[str, torch.Tensor] = {}
    for i, (a, b) in enumerate(zip(as_, bs)):
        require_tensor(a, f"{op}: as_[{i}]")
        require_tensor(b, f"{op}: bs[{i}]")
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
            raise ArgumentError(
                f"{op}: as_[{i}] (M, K) and bs[{i}] (K, N) expected, got {_shape(a)} and "
                f"{_shape(b)}"
            )
        if a.dtype not in _GROUPED_DTYPES:
            raise TypeError(
                f"{op}: as_[{i}] has dtype {a.dtype}; grouped GEMMs take float16 or bfloat16"
            )
        _check_same_dtype(a, f"{op}: as_[{i}]", as_[0], "as_[0]")
        _check_same_dtype(b, f"{op}: bs[{i}]", as_[0], "as_[0]")
        tensors[f"as_[{i}]"], tensors[f"bs[{i}]"] = a, b
        sizes.append((a.shape[0], b.shape[1], a.shape[1]))
    _check_devices(op, tensors)
    return sizes


def gemm_quick(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, alpha: float, beta: float
) -> GemmShape | None:
    """The sizes of a plainly valid 2-D GEMM on CUDA tensors without c, else None: then
    gemm() decides (and raises). The eager path's cheap first check; it accepts only
    what gemm() accepts."""
    if c is not None or beta != 0.0 or not (a.is_cuda and b.is_cuda):
        return None
    dtype = a.dtype
    if dtype not in DTYPE_CODES or b.dtype is not dtype or a.get_device() != b.get_device():
        return None
    shape_a, shape_b = a.shape, b.shape
    if len(shape_a) != 2 or len(shape_b) != 2 or not math.isfinite(alpha):
        return None
    m, k = shape_a
    k_b, n = shape_b
    if k != k_b:
        return None
    return GemmShape((m, n), 1, m, n, k)


def _broadcast(shape: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(shape, target))
    except RuntimeError:
        return None


class SoftmaxShape(NamedTuple):
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


def softmax_quick(x: torch.Tensor, dim: int) -> SoftmaxShape | None:
    """The view of a plainly valid softmax of a CUDA tensor of rank >= 1, else None (then
    softmax() decides and raises)."""
    shape = x.shape
    rank = len(shape)
    if type(dim) is not int or not -rank <= dim < rank:
        return None
    if not x.is_cuda or x.dtype not in DTYPE_CODES:
        return None
    dim %= rank
    return SoftmaxShape(math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1 :]))


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
        raise ArgumentError(f"{op}: dy has shape {_shape(dy)} but y has {_shape(y)}")
    _check_dtype(y, f"{op}: y")
    _check_same_dtype(dy, f"{op}: dy", y, "y")
    _check_devices(op, {"y": y, "dy": dy})
    return _softmax_view(y, axis)


# -------------------------------------------------------------- attention ----
_ATTENTION_DTYPES = (torch.float16, torch.bfloat16)
MAX_ATTENTION_HEAD_DIM = 256


class AttentionShape(NamedTuple):
    """Sizes of one attention call. Varlen: batch = len(cu_seqlens) - 1 and seqlen_q/k are
    the packed row counts (total_q, total_k)."""

    batch: int
    nheads: int
    nheads_k: int
    seqlen_q: int
    seqlen_k: int
    headdim: int
    varlen: bool

    @property
    def out_shape(self) -> tuple[int, ...]:
        if self.varlen:
            return (self.seqlen_q, self.nheads, self.headdim)
        return (self.batch, self.seqlen_q, self.nheads, self.headdim)

    @property
    def lse_shape(self) -> tuple[int, ...]:
        """flash-attn's softmax_lse: (batch, nheads, seqlen_q), or (nheads, total_q) for varlen."""
        if self.varlen:
            return (self.nheads, self.seqlen_q)
        return (self.batch, self.nheads, self.seqlen_q)


def _check_attention_dtype(t: torch.Tensor, what: str) -> None:
    if t.dtype not in _ATTENTION_DTYPES:
        raise TypeError(
            f"{what} has dtype {t.dtype}; samattn attention supports torch.float16 and "
            "torch.bfloat16"
        )


def _is_int(value: object) -> bool:
    """An int or an int-like (SymInt, numpy integer), not a bool."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return isinstance(value, torch.SymInt)
    return True


_INT32_MAX = 2**31 - 1


def window_bounds(op: str, window_size: object) -> tuple[int, int]:
    """(left, right) of flash-attn's window_size: any pair of int-likes (Python or numpy
    integers, 0-dim integer tensors), a negative bound meaning unbounded (-1 here).

    Bounds beyond int32 are capped: the C ABI's int32 cannot carry them, and a bound that
    large already reaches every key of any sequence, so the cap changes nothing.
    """
    if type(window_size) is tuple and len(window_size) == 2:
        left, right = window_size
        if type(left) is int and type(right) is int:  # plain ints (no bools): at once
            left = -1 if left < 0 else min(left, _INT32_MAX)
            return left, -1 if right < 0 else min(right, _INT32_MAX)
    try:
        left, right = window_size
    except (TypeError, ValueError):
        left = right = None
    if not (_is_int(left) and _is_int(right)):
        raise ArgumentError(
            f"{op}: window_size must be a pair of ints (left, right), -1 meaning unbounded; "
            f"got {window_size!r}"
        )
    bounds = (w if isinstance(w, torch.SymInt) else operator.index(w) for w in (left, right))
    left, right = (-1 if w < 0 else min(w, _INT32_MAX) for w in bounds)
    return left, right


class AttentionParams(NamedTuple):
    """What an attention call computes besides its tensors' shapes, normalized once by the
    public function (attention_params) and passed as one object through every route: the
    CUDA implementation, the autograd formula, the torch.library ops (whose schemas spell
    the fields out: from_op_inputs) and the fake implementations.

    The first six fields are the ops' scalars in their schema order, then the score terms
    and dropout. A plain tuple underneath (attention_params builds it without the
    NamedTuple's Python-level __new__), so that building one per eager call costs what a
    tuple does; a call without score terms and dropout keys its prepared call with it.
    """

    softmax_scale: float  # defaults to headdim ** -0.5
    causal: bool
    window_left: int  # -1: unbounded (window_bounds)
    window_right: int
    softcap: float  # 0: off
    deterministic: bool = False  # the backward's
    alibi_slopes: torch.Tensor | None = None  # float32 (nheads,) or (batch, nheads)
    sinks: torch.Tensor | None = None  # float32 (nheads,)
    dropout_p: float = 0.0  # in [0, 1)
    dropout_seed: torch.Tensor | None = None  # int64 (1,) on q's device when dropout_p > 0

    @classmethod
    def from_op_inputs(
        cls, inputs: Sequence[object], scalars: int, terms: int, dropout: int | None = None
    ) -> AttentionParams:
        """The params of a torch.library op's inputs (as its fake implementation and
        autograd setup get them: positional, trailing defaults possibly left out): its six
        scalars from index `scalars` (five for the KV-cache op, which has no deterministic:
        `scalars` negative), alibi_slopes and sinks at `terms` and `terms + 1`, dropout_p
        and dropout_seed at `dropout` and `dropout + 1`."""
        count = len(inputs)
        if scalars >= 0:
            head = inputs[scalars : scalars + 6]
        else:
            head = (*inputs[-scalars : -scalars + 5], False)
        alibi = inputs[terms] if count > terms else None
        sinks = inputs[terms + 1] if count > terms + 1 else None
        dropout_p, seed = 0.0, None
        if dropout is not None and count > dropout:
            dropout_p = inputs[dropout] or 0.0
            seed = inputs[dropout + 1] if count > dropout + 1 else None
        return cls(*head, alibi, sinks, dropout_p, seed)


# AttentionParams without the NamedTuple's Python-level __new__: _tuple_new(AttentionParams,
# (fields...)) is one C call.
_tuple_new = tuple.__new__


def attention_params(
    op: str,
    softmax_scale: float | None,
    causal: bool,
    window_size: object,
    softcap: float,
    headdim: int,
    deterministic: bool = False,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    like: torch.Tensor | None = None,
) -> AttentionParams:
    """The AttentionParams of a public attention function's arguments, built once per call:
    the scalars checked and normalized with flash-attn's defaults (softmax_scale headdim **
    -0.5, window_bounds), the score terms as they are (checked with the shapes:
    attention_extras), dropout_p checked already (check_dropout) and, with dropout_p > 0,
    the call's seed drawn on like's device (samattn/_dropout.py) once everything else is
    checked, so that a refused call draws none."""
    if softmax_scale is None:
        softmax_scale = headdim**-0.5
    elif isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(
            f"{op}: softmax_scale must be a float or None, got {type(softmax_scale).__name__}"
        )
    elif not math.isfinite(softmax_scale):
        raise ArgumentError(f"{op}: softmax_scale must be finite, got {softmax_scale}")
    else:
        softmax_scale = float(softmax_scale)
    if type(window_size) is tuple and window_size == (-1, -1):  # the default, at once
        left = right = -1
    else:
        left, right = window_bounds(op, window_size)
    if softcap != 0.0 or type(softcap) is not float:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
            raise TypeError(f"{op}: softcap must be a float, got {type(softcap).__name__}")
        if not math.isfinite(softcap) or softcap < 0:
            raise ArgumentError(f"{op}: softcap must be finite and >= 0 (0 = off), got {softcap}")
        if type(softcap) is not float:
            softcap = float(softcap)
    seed = None
    if dropout_p > 0.0:
        seed = _dropout.new_seed(like.device)
    # `True if x else False` is bool(x) without a call.
    causal = True if causal else False  # noqa: SIM210
    deterministic = True if deterministic else False  # noqa: SIM210
    return _tuple_new(AttentionParams, (
        softmax_scale, causal, left, right, softcap, deterministic, alibi_slopes, sinks,
        dropout_p, seed,
    ))  # fmt: skip


def attention_extras(
    op: str, params: AttentionParams, sizes: AttentionShape, q: torch.Tensor
) -> None:
    """The tensors of `params` checked against an attention call whose q, k, v are
    (`sizes`): the dropout arguments, then the score terms (attention_terms)."""
    if params.dropout_p != 0.0:
        attention_dropout(op, params.dropout_p, params.dropout_seed, q)
    if params.alibi_slopes is not None or params.sinks is not None:
        attention_terms(op, params.alibi_slopes, params.sinks, sizes.batch, sizes.nheads, q)


def dropout_value(op: str, dropout_p: float) -> None:
    """dropout_p checked: a float in [0, 1]."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"{op}: dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ArgumentError(f"{op}: dropout_p must be in [0, 1], got {dropout_p}")


def check_dropout(op: str, dropout_p: float) -> float:
    """dropout_p checked for the attention kernels, as a float in [0, 1)."""
    dropout_value(op, dropout_p)
    if dropout_p >= 1.0:
        raise ArgumentError(
            f"{op}: dropout_p must be < 1 (1 would drop every probability and scale the rest "
            f"by 1 / (1 - dropout_p)), got {dropout_p}"
        )
    return float(dropout_p)


def attention_dropout(op: str, dropout_p: float, dropout_seed: object, q: torch.Tensor) -> None:
    """The dropout arguments of the attention ops: dropout_p in [0, 1); with dropout_p > 0
    dropout_seed an int64 tensor of one element on q's device (samattn._dropout.new_seed)."""
    check_dropout(op, dropout_p)
    if dropout_p == 0.0:
        return
    require_tensor(dropout_seed, f"{op}: dropout_seed")
    if (
        dropout_seed.dtype != torch.int64
        or dropout_seed.numel() != 1
        or dropout_seed.device != q.device
    ):
        raise ArgumentError(
            f"{op}: dropout_seed must be an int64 tensor of one element on {q.device} "
            f"(samattn._dropout.new_seed draws one), got {dropout_seed.dtype} of shape "
            f"{tuple(dropout_seed.shape)} on {dropout_seed.device}"
        )


def _check_float32(op: str, name: str, t: object, why: str) -> None:
    require_tensor(t, f"{op}: {name}")
    if t.dtype != torch.float32:
        raise TypeError(
            f"{op}: {name} must have dtype torch.float32 ({why}), got {t.dtype}; convert it "
            f"with {name}.float()"
        )


def attention_terms(
    op: str,
    alibi_slopes: torch.Tensor | None,
    sinks: torch.Tensor | None,
    batch: int,
    nheads: int,
    q: torch.Tensor,
) -> None:
    """Validate the score terms of an attention call whose q, k, v are already checked:
    alibi_slopes float32 (nheads,) or (batch, nheads), sinks float32 (nheads,), both on q's
    device. `batch` and `nheads` are the call's (varlen: the number of sequences). Their
    strides are free: the CUDA implementation copies what the library cannot read."""
    terms = {}
    if alibi_slopes is not None:
        _check_float32(op, "alibi_slopes", alibi_slopes, "flash-attn's rule")
        if _shape(alibi_slopes) not in ((nheads,), (batch, nheads)):
            raise ArgumentError(
                f"{op}: alibi_slopes must have shape (nheads,) = ({nheads},) or (batch, "
                f"nheads) = ({batch}, {nheads}), got {_shape(alibi_slopes)}"
            )
        terms["alibi_slopes"] = alibi_slopes
    if sinks is not None:
        _check_float32(op, "sinks", sinks, "one logit per query head")
        if _shape(sinks) != (nheads,):
            raise ArgumentError(
                f"{op}: sinks must have shape (nheads,) = ({nheads},), one logit per query "
                f"head, got {_shape(sinks)}"
            )
        terms["sinks"] = sinks
    if terms:
        _check_devices(op, {"q": q, **terms})


# The dtypes of an attention mask: bool (True: the key takes part) or floating point (added
# to the scores; the kernels read float32, other float dtypes are converted).
MASK_DTYPES = (torch.bool, torch.float32, torch.float16, torch.bfloat16)


def attention_mask(
    op: str, attn_mask: torch.Tensor, sizes: AttentionShape, q: torch.Tensor, grad: bool = False
) -> None:
    """Validate the attention mask of a fixed-length attention call whose q, k, v are
    already checked (`sizes`): bool or float (float32, float16, bfloat16), broadcastable
    to (batch, nheads, seqlen_q, seqlen_k) as torch broadcasts (trailing dims aligned, each
    the size there or 1), on q's device; a float one when its gradient is asked for
    (`grad`). Its strides are free: the CUDA implementation copies what the library cannot
    read."""
    require_tensor(attn_mask, f"{op}: attn_mask")
    if sizes.varlen:
        raise ArgumentError(
            f"{op}: attn_mask is for fixed-length calls only (no cu_seqlens, no KV cache)"
        )
    if attn_mask.dtype not in MASK_DTYPES:
        raise TypeError(
            f"{op}: attn_mask must be torch.bool (True: the key takes part) or a float "
            f"tensor added to the scores (torch.float32, torch.float16 or torch.bfloat16), "
            f"got {attn_mask.dtype}"
        )
    target = (sizes.batch, sizes.nheads, sizes.seqlen_q, sizes.seqlen_k)
    shape = _shape(attn_mask)
    if len(shape) > 4 or any(
        m != 1 and m != t for m, t in zip(reversed(shape), reversed(target))
    ):  # fmt: skip
        raise ArgumentError(
            f"{op}: attn_mask of shape {shape} does not broadcast to (batch, nheads, "
            f"seqlen_q, seqlen_k) = {target}"
        )
    if grad and attn_mask.dtype == torch.bool:
        raise ArgumentError(
            f"{op}: mask_grad asks for the gradient of attn_mask, which only a float "
            "(additive) mask has; this one is torch.bool"
        )
    _check_devices(op, {"q": q, "attn_mask": attn_mask})


def _check_head_dim(op: str, headdim: int, what: str) -> None:
    if not 1 <= headdim <= MAX_ATTENTION_HEAD_DIM:
        raise ArgumentError(
            f"{op}: head dim must be in 1..{MAX_ATTENTION_HEAD_DIM}, got {headdim} ({what})"
        )


def _check_attention_tensors(
    op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, layout: str
) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(t, f"{op}: {name}")
        if t.dim() != rank:
            raise ArgumentError(
                f"{op}: {name} must be {rank}-D {layout.format(name=name)}, got shape {_shape(t)}"
            )


def _check_heads_and_dims(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: str,
    names: tuple[str, str] = ("k", "v"),
    caches: bool = False,
) -> tuple[int, int, int]:
    """(nheads, nheads_k, headdim) of q, k, v whose last two modes are (heads, headdim);
    `names` are k's and v's in messages. `caches`: k and v are KV caches, which may hold
    fp8 instead of q's dtype (kv_cache_fp8, called next, checks those)."""
    nheads, headdim = q.shape[-2], q.shape[-1]
    nheads_k = k.shape[-2]
    k_name, v_name = names
    if _shape(v)[:-1] != _shape(k)[:-1]:
        raise ArgumentError(
            f"{op}: {k_name} and {v_name} must agree on all but the head dim, got {k_name} "
            f"{_shape(k)} and {v_name} {_shape(v)} ({layout})"
        )
    for name, t in zip(names, (k, v)):
        if t.shape[-1] != headdim:
            raise ArgumentError(
                f"{op}: {name} has head dim {t.shape[-1]} but q has {headdim}; samattn needs "
                f"one head dim for q, {k_name} and {v_name}"
            )
    _check_head_dim(op, headdim, "q.shape[-1]")
    if nheads_k < 1 or nheads % nheads_k != 0:
        raise ArgumentError(
            f"{op}: q has {nheads} heads and {k_name}, {v_name} have {nheads_k}; the number "
            "of query heads must be a multiple of the number of key/value heads (GQA / MQA)"
        )
    _check_attention_dtype(q, f"{op}: q")
    if caches and (k.dtype in FP8_CODES or v.dtype in FP8_CODES):
        return nheads, nheads_k, headdim
    for name, t in zip(names, (k, v)):
        if t.dtype in FP8_CODES:
            raise TypeError(
                f"{op}: {name} has dtype {t.dtype}; fp8 keys and values are read only from "
                "KV caches (flash_attn_with_kvcache, or flash_attn_varlen_func with "
                "block_table), other k and v must have q's dtype"
            )
        _check_same_dtype(t, f"{op}: {name}", q, "q")
    return nheads, nheads_k, headdim


# ---------------------------------------------------------- fp8 KV caches ----
# The fp8 dtypes a KV cache may hold (the C ABI's kv_fp8 codes), and each one's largest
# finite value, to which appended values saturate.
FP8_CODES = {torch.float8_e4m3fn: _lib.F8_E4M3, torch.float8_e5m2: _lib.F8_E5M2}
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
# fp8 caches are read in 16-byte rows of 16 elements and never padded: head dims are
# multiples of this.
FP8_HEAD_DIM_MULTIPLE = 16
_FP8_NAMES = "torch.float8_e4m3fn or torch.float8_e5m2"
KV_SCALE_NAMES = ("k_scale", "v_scale")


def kv_cache_fp8(
    op: str,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: object,
    v_scale: object,
    nheads_k: int,
    names: tuple[str, str] = ("k_cache", "v_cache"),
) -> int:
    """The fp8 rules of a call's KV caches (`names` in messages) and their scales, one
    function for flash_attn_with_kvcache and paged prefill, eager and fake alike: the
    caches both of one fp8 dtype (FP8_CODES) with a head dim that is a multiple of 16, or
    neither (then _check_heads_and_dims holds them to q's dtype); k_scale and v_scale only
    with fp8 caches, each None (1.0), a positive finite float, or a torch.float32 tensor of
    shape (), (1,) (one scale for every KV head) or (nheads_k,) (one per KV head),
    contiguous, not requiring grad; two tensors of one element count (the C ABI's
    kv_scale_head_stride is shared). Returns the C ABI's kv_fp8 code (0: no fp8 cache).
    The scale tensors' device is checked with the call's other tensors (their caller's
    _check_devices)."""
    k_name, v_name = names
    code = FP8_CODES.get(k_cache.dtype, 0)
    if code or v_cache.dtype in FP8_CODES:
        if k_cache.dtype != v_cache.dtype:
            raise TypeError(
                f"{op}: {k_name} has dtype {k_cache.dtype} but {v_name} has {v_cache.dtype}; "
                f"fp8 KV caches must both have one fp8 dtype ({_FP8_NAMES})"
            )
        headdim = k_cache.shape[-1]
        if headdim % FP8_HEAD_DIM_MULTIPLE:
            raise ArgumentError(
                f"{op}: fp8 KV caches need a head dim that is a multiple of "
                f"{FP8_HEAD_DIM_MULTIPLE} (rows of 16-byte vectors), got {headdim}; unlike "
                "16-bit caches they are never run on padded copies"
            )
    for name, scale in zip(KV_SCALE_NAMES, (k_scale, v_scale)):
        if scale is None:
            continue
        if not code:
            raise ArgumentError(
                f"{op}: {name} is given, but {k_name} has dtype {k_cache.dtype}; k_scale and "
                f"v_scale apply to fp8 KV caches only ({_FP8_NAMES})"
            )
        _check_kv_scale(op, name, scale, nheads_k)
    if (
        isinstance(k_scale, torch.Tensor)
        and isinstance(v_scale, torch.Tensor)
        and k_scale.numel() != v_scale.numel()
    ):
        raise ArgumentError(
            f"{op}: k_scale has {k_scale.numel()} elements but v_scale has {v_scale.numel()}; "
            "two scale tensors must both hold one scale for every KV head or both one per KV "
            "head (give the other as a float, or expand it)"
        )
    return code


def _check_kv_scale(op: str, name: str, scale: object, nheads_k: int) -> None:
    if isinstance(scale, torch.Tensor):
        if scale.dtype != torch.float32:
            raise TypeError(
                f"{op}: {name} must be a float or a torch.float32 tensor, got dtype "
                f"{scale.dtype}; convert it with {name}.float()"
            )
        shape = _shape(scale)
        if shape not in ((), (1,), (nheads_k,)):
            raise ArgumentError(
                f"{op}: {name} must have shape () or (1,) (one scale for every KV head) or "
                f"(nheads_k,) = ({nheads_k},) (one per KV head), got {shape}"
            )
        if scale.dim() == 1 and scale.shape[0] > 1 and scale.stride(0) != 1:
            raise ArgumentError(
                f"{op}: {name} must be contiguous (the kernels read it in place), got stride "
                f"{scale.stride(0)}; pass {name}.contiguous()"
            )
        if scale.requires_grad:
            raise ArgumentError(
                f"{op}: {name} requires grad, but fp8 KV caches are forward only (no "
                f"gradient reaches the scales); pass {name}.detach()"
            )
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(
            f"{op}: {name} must be None, a float or a torch.float32 tensor, got "
            f"{type(scale).__name__}"
        )
    if not (math.isfinite(scale) and scale > 0):
        raise ArgumentError(f"{op}: {name} must be positive and finite, got {scale}")


def kv_scale_tensors(k_scale: object, v_scale: object) -> dict[str, torch.Tensor]:
    """The scales given as tensors, by name: for a call's device check."""
    return {
        name: scale
        for name, scale in zip(KV_SCALE_NAMES, (k_scale, v_scale))
        if isinstance(scale, torch.Tensor)
    }


_FIXED_LAYOUT = "(batch, seqlen, nheads, headdim)"
_PACKED_LAYOUT = "(total_tokens, nheads, headdim)"


def flash_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    op: str = "samattn.flash_attn_func",
) -> AttentionShape:
    """Validate fixed-length q, k, v (see samattn.flash_attn_func); return the sizes."""
    _check_attention_tensors(op, q, k, v, 4, _FIXED_LAYOUT)
    batch, seqlen_q = q.shape[0], q.shape[1]
    batch_k, seqlen_k = k.shape[0], k.shape[1]
    if batch_k != batch:
        raise ArgumentError(
            f"{op}: q has batch {batch} but k has {batch_k} (layout {_FIXED_LAYOUT}, "
            f"q {_shape(q)}, k {_shape(k)})"
        )
    nheads, nheads_k, headdim = _check_heads_and_dims(op, q, k, v, _FIXED_LAYOUT)
    _check_devices(op, {"q": q, "k": k, "v": v})
    return AttentionShape(batch, nheads, nheads_k, seqlen_q, seqlen_k, headdim, varlen=False)


def flash_attn_quick(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> AttentionShape | None:
    """The sizes of plainly valid fixed-length q, k, v on one CUDA device, else None (then
    flash_attn() decides and raises); accepts only what flash_attn() accepts."""
    shape_q, shape_k = q.shape, k.shape
    if len(shape_q) != 4 or len(shape_k) != 4 or v.shape != shape_k:
        return None
    batch, seqlen_q, nheads, headdim = shape_q
    batch_k, seqlen_k, nheads_k, headdim_k = shape_k
    if batch_k != batch or headdim_k != headdim or not 1 <= headdim <= MAX_ATTENTION_HEAD_DIM:
        return None
    if nheads_k < 1 or nheads % nheads_k != 0:
        return None
    dtype = q.dtype
    if dtype not in _ATTENTION_DTYPES or k.dtype is not dtype or v.dtype is not dtype:
        return None
    if not (q.is_cuda and k.is_cuda and v.is_cuda):
        return None
    if not q.get_device() == k.get_device() == v.get_device():
        return None
    return AttentionShape(batch, nheads, nheads_k, seqlen_q, seqlen_k, headdim, False)


def _has_values(t: torch.Tensor) -> bool:
    """Whether t's values can be read without a device sync or a trace (eager CPU tensor)."""
    from torch._subclasses.fake_tensor import is_fake

    return t.device.type == "cpu" and not is_fake(t) and not torch.compiler.is_compiling()


def cu_seqlens_values(
    op: str, name: str, values: list[int], total: int | None, max_seqlen: int, max_name: str
) -> None:
    """Check the offsets of a varlen batch: non-decreasing from >= 0, within the packed
    tensor's `total` rows (None: they index no tensor, only their lengths count), no
    sequence longer than max_seqlen."""
    if values and values[0] < 0:
        raise ArgumentError(f"{op}: {name}[0] must be >= 0, got {values[0]}")
    lengths = [end - start for start, end in zip(values, values[1:])]
    for b, length in enumerate(lengths):
        if length < 0:
            raise ArgumentError(
                f"{op}: {name} must be non-decreasing, but {name}[{b + 1}] = {values[b + 1]} < "
                f"{name}[{b}] = {values[b]}"
            )
    if values and total is not None and values[-1] > total:
        raise ArgumentError(
            f"{op}: {name}[-1] = {values[-1]} exceeds the {total} tokens of the packed tensor"
        )
    for b, length in enumerate(lengths):
        if length > max_seqlen:
            raise ArgumentError(
                f"{op}: sequence {b} has {length} tokens ({name}[{b + 1}] - {name}[{b}]) but "
                f"{max_name} is {max_seqlen}"
            )


def flash_attn_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    op: str = "samattn.flash_attn_varlen_func",
) -> AttentionShape:
    """Validate packed q, k, v and their offsets (see samattn.flash_attn_varlen_func).

    The offsets' values are checked here when they are readable for free (an eager CPU
    tensor); CUDA offsets are checked by the CUDA implementation before the launch.
    """
    _check_attention_tensors(op, q, k, v, 3, _PACKED_LAYOUT)
    nheads, nheads_k, headdim = _check_heads_and_dims(op, q, k, v, _PACKED_LAYOUT)
    total_q, total_k = q.shape[0], k.shape[0]
    batch = _varlen_offsets(
        op, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_q,
        (total_k, f"the {total_k} tokens of the packed tensor"),
    )  # fmt: skip
    _check_devices(
        op, {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k}
    )
    return AttentionShape(batch, nheads, nheads_k, total_q, total_k, headdim, varlen=True)


def _varlen_offsets(
    op: str,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    total_q: int,
    limit_k: tuple[int, str],
    paged: bool = False,
) -> int:
    """The batch of varlen offsets, checked: int32 (batch + 1,) tensors, max_seqlen_q
    within q's packed rows and max_seqlen_k within limit_k (bound, what it is); their
    values too where they are readable for free. A packed k is indexed by cu_seqlens_k;
    a paged one (limit_k a sequence's capacity) only takes its lengths."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        require_tensor(cu, f"{op}: {name}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{op}: {name} must have dtype torch.int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 1:
            raise ArgumentError(
                f"{op}: {name} must be 1-D with batch + 1 offsets, got shape {_shape(cu)}"
            )
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        raise ArgumentError(
            f"{op}: cu_seqlens_q has {cu_seqlens_q.shape[0]} offsets but cu_seqlens_k has "
            f"{cu_seqlens_k.shape[0]}; both must have batch + 1"
        )
    limits = (
        ("max_seqlen_q", max_seqlen_q, total_q, f"the {total_q} tokens of the packed tensor"),
        ("max_seqlen_k", max_seqlen_k, *limit_k),
    )
    for name, value, bound, what in limits:
        if not _is_int(value):
            raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ArgumentError(f"{op}: {name} must be >= 0, got {value}")
        if value > bound:
            raise ArgumentError(f"{op}: {name} = {value} exceeds {what}")
    for name, cu, total, max_seqlen in (
        ("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q),
        ("cu_seqlens_k", cu_seqlens_k, None if paged else limit_k[0], max_seqlen_k),
    ):
        if _has_values(cu):
            max_name = "max_seqlen_q" if name.endswith("q") else "max_seqlen_k"
            cu_seqlens_values(op, name, cu.tolist(), total, max_seqlen, max_name)
    return cu_seqlens_q.shape[0] - 1


_PAGED_LAYOUT = "(num_blocks, page_block_size, nheads_k, headdim)"


def flash_attn_varlen_paged(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    block_table: torch.Tensor,
    op: str = "samattn.flash_attn_varlen_func",
    k_scale: object = None,
    v_scale: object = None,
) -> AttentionShape:
    """Validate paged prefill (flash_attn_varlen_func with block_table): packed q, paged
    k and v caches (q's dtype, or fp8 with k_scale / v_scale: kv_cache_fp8), offsets
    whose k lengths index each sequence's pages. The sizes' seqlen_k is a sequence's
    capacity, max_blocks * page_block_size."""
    require_tensor(q, f"{op}: q")
    if q.dim() != 3:
        raise ArgumentError(f"{op}: q must be 3-D {_PACKED_LAYOUT}, got shape {_shape(q)}")
    for name, t in (("k", k), ("v", v)):
        require_tensor(t, f"{op}: {name}")
        if t.dim() != 4:
            raise ArgumentError(
                f"{op}: with block_table, {name} must be a 4-D paged cache {_PAGED_LAYOUT}, "
                f"got shape {_shape(t)}"
            )
    nheads, nheads_k, headdim = _check_heads_and_dims(op, q, k, v, _PAGED_LAYOUT, caches=True)
    kv_cache_fp8(op, k, v, k_scale, v_scale, nheads_k, names=("k", "v"))
    page_size = _check_page_size(op, k)
    batch_table, width = _check_block_table(op, block_table)
    batch = _varlen_offsets(
        op, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q.shape[0],
        (width * page_size, f"a sequence's capacity of {width * page_size} rows "
         f"(block_table's {width} pages of {page_size})"), paged=True,
    )  # fmt: skip
    if batch_table != batch:
        raise ArgumentError(
            f"{op}: block_table has {batch_table} rows but cu_seqlens_q describes {batch} "
            "sequences; block_table must be (batch, max_blocks)"
        )
    _check_cache_layout(op, {"k": k, "v": v})
    _check_devices(
        op,
        {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
         "block_table": block_table, **kv_scale_tensors(k_scale, v_scale)},
    )  # fmt: skip
    return AttentionShape(
        batch, nheads, nheads_k, q.shape[0], width * page_size, headdim, varlen=True
    )


def attention_sizes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    op: str | None = None,
    block_table: torch.Tensor | None = None,
    k_scale: object = None,
    v_scale: object = None,
) -> AttentionShape:
    """The validated sizes of an attention forward's inputs: fixed length when both
    cu_seqlens are None, varlen when both are given, paged varlen with a block_table
    (then seqlen_k is a sequence's capacity, and k and v may be fp8 caches with k_scale /
    v_scale). `op` names the public function in messages (None: flash_attn_func or
    flash_attn_varlen_func)."""
    if block_table is not None:
        return flash_attn_varlen_paged(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
            op or "samattn.flash_attn_varlen_func", k_scale, v_scale,
        )  # fmt: skip
    if k_scale is not None or v_scale is not None:
        kv_scales_without_cache(op or "samattn.flash_attn_varlen_func", k_scale, v_scale)
    if cu_seqlens_q is None and cu_seqlens_k is None:
        sizes = flash_attn_quick(q, k, v)
        return sizes or flash_attn(q, k, v, op or "samattn.flash_attn_func")
    if cu_seqlens_q is None:  # (cu_seqlens_k None: flash_attn_varlen names it below)
        raise ArgumentError(
            f"{op or 'samattn.flash_attn_forward'}: cu_seqlens_q and cu_seqlens_k must both be "
            "given (varlen) or both be None (fixed length)"
        )
    return flash_attn_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        op or "samattn.flash_attn_varlen_func",
    )  # fmt: skip


def kv_scales_without_cache(op: str, k_scale: object, v_scale: object) -> None:
    """Raise for k_scale / v_scale given to an attention call without a KV cache."""
    name = "k_scale" if k_scale is not None else "v_scale"
    raise ArgumentError(
        f"{op}: {name} is given without block_table; k_scale and v_scale apply to fp8 KV "
        "caches, which flash_attn_varlen_func reads only as paged caches (block_table)"
    )


def flash_attn_backward(
    dout: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    q: torch.Tensor,
    sizes: AttentionShape,
    op: str = "samattn.flash_attn_backward",
) -> None:
    """Validate the backward's own tensors (the forward's q, k, v already checked: `sizes`):
    dout and out with the forward output's shape and q's dtype, softmax_lse float32 with
    the forward's lse shape, all on q's device."""
    for name, t in (("dout", dout), ("out", out), ("softmax_lse", softmax_lse)):
        require_tensor(t, f"{op}: {name}")
    for name, t in (("dout", dout), ("out", out)):
        if _shape(t) != sizes.out_shape:
            raise ArgumentError(
                f"{op}: {name} must have the attention output's shape {sizes.out_shape}, "
                f"got {_shape(t)}"
            )
        _check_same_dtype(t, f"{op}: {name}", q, "q")
    if _shape(softmax_lse) != sizes.lse_shape:
        raise ArgumentError(
            f"{op}: softmax_lse must have shape {sizes.lse_shape} (the forward's), got "
            f"{_shape(softmax_lse)}"
        )
    if softmax_lse.dtype != torch.float32:
        raise TypeError(f"{op}: softmax_lse must have dtype torch.float32, got {softmax_lse.dtype}")
    _check_devices(op, {"q": q, "dout": dout, "out": out, "softmax_lse": softmax_lse})


# ----------------------------------------------------------- KV cache ----
def needs_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd would record a call on these tensors."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
    )


_VALUE_CHECKS_ENV = "SAMATTN_VALUE_CHECKS"
_value_checks = os.environ.get(_VALUE_CHECKS_ENV, "1").strip() != "0"


def set_value_checks(enabled: bool) -> None:
    """Turn the eager checks of integer arguments' values on or off, process-wide.

    With them on (the default, unless ``SAMATTN_VALUE_CHECKS=0`` is in the environment at
    import), an eager call that takes device integer tensors (cu_seqlens, cache_seqlens,
    cache_leftpad, cache_batch_idx, block_table) copies their values to the host once
    and raises samattn.ArgumentError (a ValueError) for a value outside the cache or the
    packed tensors. A check that passed is not repeated for the same tensor objects (and
    bounds) until torch records a write to one of them (its version counter): the layers
    of a model, and the backward, then share one copy per step. Writes that bypass the
    version counter (through ``.data``, DLPack or raw pointers) go unseen. The copy
    synchronizes with the GPU, which a serving loop may not afford: turned off, bad
    values are not reported, but the kernels still clamp every index into the tensors
    (no out-of-bounds access; the results of the bad sequences are then meaningless).
    Never done while a CUDA graph is being captured, nor on fake tensors under
    torch.compile's tracing.
    """
    global _value_checks
    if not isinstance(enabled, bool):
        raise TypeError(f"samattn.set_value_checks: enabled must be a bool, got {enabled!r}")
    _value_checks = enabled


def value_checks_enabled() -> bool:
    """Whether eager calls check device integer arguments' values (set_value_checks)."""
    return _value_checks


_CACHE_LAYOUT = "(batch_cache, seqlen_cache, nheads_k, headdim)"
_NEW_LAYOUT = "(batch, seqlen_new, nheads_k, headdim)"
# The kernels read and write cache rows in 16-byte vectors: 8 elements of fp16 / bf16
# (the rule for any cache that is not fp8), 16 of fp8.
_CACHE_VECTOR = 8
# Page sizes are multiples of this (the kernels' key tile).
PAGE_SIZE_MULTIPLE = 16


def _check_page_size(op: str, cache: torch.Tensor) -> int:
    page_size = cache.shape[1]
    if page_size < 1 or page_size % PAGE_SIZE_MULTIPLE != 0:
        raise ArgumentError(
            f"{op}: a paged cache's page_block_size (k_cache.shape[1]) must be a positive "
            f"multiple of {PAGE_SIZE_MULTIPLE}, got {page_size}"
        )
    return page_size


def _check_block_table(op: str, block_table: torch.Tensor) -> tuple[int, int]:
    """(batch, max_blocks) of an int32 block table."""
    require_tensor(block_table, f"{op}: block_table")
    if block_table.dtype != torch.int32:
        raise TypeError(f"{op}: block_table must have dtype torch.int32, got {block_table.dtype}")
    if block_table.dim() != 2:
        raise ArgumentError(
            f"{op}: block_table must be 2-D (batch, max_blocks), got shape {_shape(block_table)}"
        )
    return block_table.shape[0], block_table.shape[1]


def cache_layout_problem(name: str, t: torch.Tensor) -> str | None:
    """Why the kernels cannot use the cache `t` in place (its 16-byte vectors: 8 elements
    of fp16 / bf16, 16 of fp8), or None when they can. The pointer's alignment is checked
    where it exists (_cuda)."""
    vector = FP8_HEAD_DIM_MULTIPLE if t.dtype in FP8_CODES else _CACHE_VECTOR
    headdim = t.shape[-1]
    if headdim % vector != 0:
        return (
            f"{name} has head dim {headdim}; a KV cache of {t.dtype} needs a head dim that "
            f"is a multiple of {vector} (rows of 16-byte vectors)"
        )
    strides = t.stride()
    # A stride of a mode of size 1 is never stepped over: it may be anything.
    if strides[-1] != 1 or any(
        s % vector != 0 and n != 1 for n, s in zip(t.shape[:-1], strides[:-1])
    ):
        return (
            f"{name} has strides {tuple(strides)}; a KV cache is used in place, so "
            f"its head dim must be contiguous and its other strides multiples of "
            f"{vector} elements (16 bytes)"
        )
    return None


def _check_cache_layout(op: str, caches: dict[str, torch.Tensor]) -> None:
    """Caches are read (and updated) in place, never copied: they must allow the kernels'
    16-byte vectors."""
    for name, t in caches.items():
        problem = cache_layout_problem(name, t)
        if problem is not None:
            raise ArgumentError(f"{op}: {problem}")


class KVCacheShape(NamedTuple):
    """Sizes of one flash_attn_with_kvcache call. kv_cache_batch is k_cache.shape[0]
    (sequences, or pages when paged); capacity the rows a sequence can hold
    (seqlen_cache, or max_blocks * page_size); page_size 0 when not paged; seqlen_new
    and rotary_dim 0 without new keys or rotary."""

    batch: int
    seqlen_q: int
    nheads: int
    nheads_k: int
    headdim: int
    kv_cache_batch: int
    capacity: int
    page_size: int
    block_table_width: int
    seqlen_new: int
    rotary_dim: int
    rotary_seqlen: int

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.seqlen_q, self.nheads, self.headdim)

    @property
    def lse_shape(self) -> tuple[int, int, int]:
        return (self.batch, self.nheads, self.seqlen_q)


def _check_per_sequence(op: str, name: str, t: torch.Tensor, batch: int) -> None:
    require_tensor(t, f"{op}: {name}")
    if t.dtype != torch.int32:
        raise TypeError(f"{op}: {name} must have dtype torch.int32, got {t.dtype}")
    if _shape(t) != (batch,):
        raise ArgumentError(f"{op}: {name} must have shape (batch,) = ({batch},), got {_shape(t)}")


def kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    rotary_cos: torch.Tensor | None,
    rotary_sin: torch.Tensor | None,
    cache_seqlens: torch.Tensor | int | None,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    block_table: torch.Tensor | None,
    num_splits: int,
    op: str = "samattn.flash_attn_with_kvcache",
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: object = None,
    v_scale: object = None,
) -> KVCacheShape:
    """Validate flash_attn_with_kvcache's arguments (shapes, dtypes, layouts, devices; an
    int cache_seqlens' value too; fp8 caches and their scales: kv_cache_fp8); return the
    sizes. Device integer tensors' values are checked by the CUDA implementation
    (kvcache_values)."""
    paged = block_table is not None
    layout = _PAGED_LAYOUT if paged else _CACHE_LAYOUT
    for name, t, t_layout in (
        ("q", q, _FIXED_LAYOUT), ("k_cache", k_cache, layout), ("v_cache", v_cache, layout)
    ):  # fmt: skip
        require_tensor(t, f"{op}: {name}")
        if t.dim() != 4:
            raise ArgumentError(f"{op}: {name} must be 4-D {t_layout}, got shape {_shape(t)}")
    batch, seqlen_q, nheads, headdim = q.shape
    _, nheads_k, _ = _check_heads_and_dims(
        op, q, k_cache, v_cache, layout, names=("k_cache", "v_cache"), caches=True
    )
    kv_cache_fp8(op, k_cache, v_cache, k_scale, v_scale, nheads_k)
    kv_cache_batch = k_cache.shape[0]
    width = page_size = 0
    if paged:
        page_size = _check_page_size(op, k_cache)
        batch_table, width = _check_block_table(op, block_table)
        if batch_table != batch:
            raise ArgumentError(
                f"{op}: block_table has {batch_table} rows but q has batch {batch}; "
                "block_table must be (batch, max_blocks)"
            )
        capacity = width * page_size
        for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
            if t is not None:
                raise ArgumentError(
                    f"{op}: {name} cannot be combined with block_table (a paged cache's "
                    "sequences are its block_table rows, starting at row 0)"
                )
    else:
        capacity = k_cache.shape[1]
        if cache_batch_idx is None and kv_cache_batch < batch:
            raise ArgumentError(
                f"{op}: k_cache holds {kv_cache_batch} sequences but q has batch {batch}; "
                "without cache_batch_idx, batch entry b uses cache sequence b"
            )
    seqlen_new = 0
    if (k is None) != (v is None):
        raise ArgumentError(
            f"{op}: k and v (the new keys and values) must both be given or both None"
        )
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            require_tensor(t, f"{op}: {name}")
            expected = (batch, t.shape[1] if t.dim() == 4 else -1, nheads_k, headdim)
            if t.dim() != 4 or _shape(t) != expected:
                raise ArgumentError(
                    f"{op}: {name} must be 4-D {_NEW_LAYOUT} = ({batch}, seqlen_new, {nheads_k}, "
                    f"{headdim}), got shape {_shape(t)}"
                )
            if t.dtype in FP8_CODES and t.dtype != q.dtype:
                raise TypeError(
                    f"{op}: {name} has dtype {t.dtype}; the new keys and values have q's dtype "
                    f"({q.dtype}), also for fp8 caches, which the library quantizes them into"
                )
            _check_same_dtype(t, f"{op}: {name}", q, "q")
        if k.shape[1] != v.shape[1]:
            raise ArgumentError(
                f"{op}: k has {k.shape[1]} new rows but v has {v.shape[1]}; they must agree"
            )
        seqlen_new = k.shape[1]
        if seqlen_new > capacity:
            raise ArgumentError(
                f"{op}: k has {seqlen_new} new rows but a cache sequence holds {capacity}"
            )
        if cache_seqlens is None:
            raise ArgumentError(
                f"{op}: appending k and v needs cache_seqlens (where each sequence's new rows go)"
            )
    rotary_dim = rotary_seqlen = 0
    if (rotary_cos is None) != (rotary_sin is None):
        raise ArgumentError(f"{op}: rotary_cos and rotary_sin must both be given or both None")
    if rotary_cos is not None:
        if k is None:
            raise ArgumentError(
                f"{op}: rotary_cos / rotary_sin apply to q and the new k: they need k and v"
            )
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            require_tensor(t, f"{op}: {name}")
            if t.dim() != 2 or _shape(t) != _shape(rotary_cos):
                raise ArgumentError(
                    f"{op}: rotary_cos and rotary_sin must be 2-D (seqlen_ro, rotary_dim / 2) of "
                    f"one shape, got {_shape(rotary_cos)} and {_shape(rotary_sin)}"
                )
            _check_same_dtype(t, f"{op}: {name}", q, "q")
        rotary_seqlen, rotary_dim = rotary_cos.shape[0], 2 * rotary_cos.shape[1]
        if not 0 < rotary_dim <= headdim:
            raise ArgumentError(
                f"{op}: rotary_dim (2 * rotary_cos.shape[1]) must be in 2..{headdim} (the head "
                f"dim), got {rotary_dim}"
            )
        if rotary_seqlen < capacity:
            raise ArgumentError(
                f"{op}: rotary_cos has {rotary_seqlen} positions but a cache sequence holds "
                f"{capacity}; seqlen_ro must cover the cache"
            )
    if isinstance(cache_seqlens, torch.Tensor):
        _check_per_sequence(op, "cache_seqlens", cache_seqlens, batch)
    elif cache_seqlens is not None:
        if not _is_int(cache_seqlens):
            raise TypeError(
                f"{op}: cache_seqlens must be an int, an int32 tensor (batch,) or None, got "
                f"{type(cache_seqlens).__name__}"
            )
        if not isinstance(cache_seqlens, torch.SymInt):
            kvcache_values(
                op, KVCacheShape(batch, seqlen_q, nheads, nheads_k, headdim, kv_cache_batch,
                                 capacity, page_size, width, seqlen_new, rotary_dim,
                                 rotary_seqlen),
                [operator.index(cache_seqlens)] * batch, None, None, None,
            )  # fmt: skip
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            _check_per_sequence(op, name, t, batch)
    if isinstance(num_splits, bool) or not _is_int(num_splits):
        raise TypeError(f"{op}: num_splits must be an int, got {type(num_splits).__name__}")
    if not 0 <= num_splits <= _INT32_MAX:
        raise ArgumentError(f"{op}: num_splits must be >= 0 (0: chosen for you), got {num_splits}")
    caches = {"k_cache": k_cache, "v_cache": v_cache}
    _check_cache_layout(op, caches)
    tensors = {"q": q, **caches}
    optional = {
        "k": k, "v": v, "rotary_cos": rotary_cos, "rotary_sin": rotary_sin,
        "cache_seqlens": cache_seqlens, "cache_batch_idx": cache_batch_idx,
        "cache_leftpad": cache_leftpad, "block_table": block_table,
    }  # fmt: skip
    tensors.update((n, t) for n, t in optional.items() if isinstance(t, torch.Tensor))
    if k_scale is not None or v_scale is not None:
        tensors.update(kv_scale_tensors(k_scale, v_scale))
    _check_devices(op, tensors)
    if alibi_slopes is not None or sinks is not None:
        attention_terms(op, alibi_slopes, sinks, batch, nheads, q)
    return KVCacheShape(
        batch, seqlen_q, nheads, nheads_k, headdim, kv_cache_batch, capacity, page_size, width,
        seqlen_new, rotary_dim, rotary_seqlen,
    )  # fmt: skip


def kvcache_values(
    op: str,
    sizes: KVCacheShape,
    cache_seqlens: list[int] | None,
    cache_leftpad: list[int] | None,
    cache_batch_idx: list[int] | None,
    block_table: list[int] | None,
) -> None:
    """Check the values of flash_attn_with_kvcache's integer arguments (host lists;
    block_table flattened row by row): every index the kernels would take inside the
    cache. Pure: the CUDA implementation copies the values once and calls it."""
    new = sizes.seqlen_new
    for b in range(sizes.batch):
        if cache_seqlens is None:
            end = sizes.capacity
        else:
            used = cache_seqlens[b]
            if used < 0:
                raise ArgumentError(f"{op}: cache_seqlens[{b}] = {used} is negative")
            end = used + new
            if end > sizes.capacity:
                plus = f" plus the {new} new rows" if new else ""
                pages = ""
                if sizes.page_size:  # flash-attn's message names block_table too
                    pages = (
                        f" (block_table's {sizes.block_table_width} pages of "
                        f"{sizes.page_size} rows)"
                    )
                raise ArgumentError(
                    f"{op}: cache_seqlens[{b}] = {used}{plus} exceeds the {sizes.capacity} rows "
                    f"a cache sequence holds{pages}"
                )
        if cache_leftpad is not None and not 0 <= cache_leftpad[b] <= end:
            raise ArgumentError(
                f"{op}: cache_leftpad[{b}] = {cache_leftpad[b]} is outside [0, {end}] (the "
                "sequence's rows in use)"
            )
        if cache_batch_idx is not None and not 0 <= cache_batch_idx[b] < sizes.kv_cache_batch:
            raise ArgumentError(
                f"{op}: cache_batch_idx[{b}] = {cache_batch_idx[b]} is outside "
                f"[0, {sizes.kv_cache_batch}) (the cache's sequences)"
            )
        if block_table is not None:
            pages = -(-end // sizes.page_size)
            row = block_table[b * sizes.block_table_width : b * sizes.block_table_width + pages]
            _check_pages(op, b, row, sizes.kv_cache_batch)


def _check_pages(op: str, b: int, pages: list[int], num_blocks: int) -> None:
    for j, page in enumerate(pages):
        if not 0 <= page < num_blocks:
            raise ArgumentError(
                f"{op}: block_table[{b}][{j}] = {page} is outside [0, {num_blocks}) (the "
                "cache's pages); the entries of the pages in use must index the cache"
            )


def paged_varlen_values(
    op: str, lengths_k: list[int], page_size: int, width: int, num_blocks: int,
    block_table: list[int],
) -> None:  # fmt: skip
    """Check the block_table entries of paged prefill's pages in use (host lists;
    block_table flattened row by row), given each sequence's key count."""
    for b, length in enumerate(lengths_k):
        pages = -(-length // page_size)
        _check_pages(op, b, block_table[b * width : b * width + pages], num_blocks)


def sdpa_fallback_reason(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    enable_gqa: bool,
    dropout_p: float = 0.0,
) -> str | None:
    """Why samattn.scaled_dot_product_attention hands this call to torch's (None: it serves
    it itself), as a clause that completes "samattn.scaled_dot_product_attention: ..., so
    ...". Pure: looks at shapes, dtypes and devices only. An attn_mask is served by the
    kernels: attention_mask checks it (and raises) once this says None."""
    tensors = {"query": query, "key": key, "value": value}
    if not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        return "query, key and value are not all tensors"
    if any(t.is_nested for t in tensors.values()):
        return "the inputs are nested tensors"
    if dropout_p > 0.0:
        return (
            f"dropout_p is {dropout_p} (samattn's dropout runs in flash_attn_func and the "
            "transformers integration; its scaled_dot_product_attention leaves dropout to "
            "torch, whose generator and pattern SDPA users may rely on)"
        )
    if any(t.dim() != 4 for t in tensors.values()):
        return "the inputs are not 4-D (batch, heads, seq, dim)"
    for name, t in tensors.items():
        if t.device.type not in _DEVICE_TYPES:
            return f"{name} is on {t.device}, not on a CUDA device"
    dtypes = [t.dtype for t in tensors.values()]
    if any(d not in _ATTENTION_DTYPES for d in dtypes) or len(set(dtypes)) != 1:
        return (
            f"the dtypes of query, key and value are {dtypes[0]}, {dtypes[1]} and {dtypes[2]}, "
            "not all torch.float16 or all torch.bfloat16"
        )
    batch, heads, seqlen_q, headdim = query.shape
    batch_k, heads_k, seqlen_k, headdim_k = key.shape
    if _shape(value)[:3] != _shape(key)[:3] or batch_k != batch:
        return "the shapes of query, key and value do not match"
    if value.shape[3] != headdim or headdim_k != headdim:
        return "the value head dim differs from the query's"
    if not 1 <= headdim <= MAX_ATTENTION_HEAD_DIM:
        return f"head dim {headdim} is outside samattn's range of 1 to {MAX_ATTENTION_HEAD_DIM}"
    if heads_k != heads and not enable_gqa:
        return (
            f"the key/value heads ({heads_k}) differ from the query heads ({heads}) and "
            "enable_gqa is False"
        )
    if heads_k != heads and not (heads_k > 0 and heads % heads_k == 0):
        return f"the query heads ({heads}) are not a multiple of the key/value heads ({heads_k})"
    if is_causal and seqlen_q < seqlen_k:
        # torch aligns a non-square causal mask top-left. With more queries than keys that
        # is a window reaching seqlen_q - seqlen_k right of samattn's bottom-right diagonal;
        # with fewer, the bound would be negative, which flash-attn's API reads as none.
        return (
            "is_causal with seqlen_q < seqlen_k asks for torch's top-left causal mask, which "
            "samattn's kernels cannot express"
        )
    return None
