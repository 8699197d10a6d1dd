"""FlashAttention: flash-attn 2's functions and torch's scaled_dot_product_attention.

Code written for flash-attn runs by changing the import::

    from samattn import flash_attn_func, flash_attn_varlen_func

Ops (namespace ``samattn``)::

    flash_attn_forward(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q,
        Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale,
        bool causal, int window_left, int window_right, float softcap, bool deterministic,
        Tensor? block_table=None, Tensor? alibi_slopes=None, Tensor? sinks=None,
        float dropout_p=0.0, Tensor? dropout_seed=None, Tensor? k_scale=None,
        Tensor? v_scale=None, float? k_scale_value=None, float? v_scale_value=None)
        -> (Tensor out, Tensor softmax_lse)
    flash_attn_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
        Tensor softmax_lse, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q,
        int max_seqlen_k, float softmax_scale, bool causal, int window_left,
        int window_right, float softcap, bool deterministic, Tensor? alibi_slopes=None,
        Tensor? sinks=None) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)
    flash_attn_paged_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor? sinks=None)
        -> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)  (raises NotImplementedError)
    flash_attn_with_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k,
        Tensor? v, Tensor? rotary_cos, Tensor? rotary_sin, Tensor? cache_seqlens,
        Tensor? cache_batch_idx, Tensor? cache_leftpad, Tensor? block_table,
        float softmax_scale, bool causal, int window_left, int window_right, float softcap,
        bool rotary_interleaved, int num_splits, Tensor? alibi_slopes=None,
        Tensor? sinks=None, Tensor? k_scale=None, Tensor? v_scale=None,
        float? k_scale_value=None, float? v_scale_value=None)
        -> (Tensor out, Tensor softmax_lse)
    flash_attn_masked_forward(Tensor q, Tensor k, Tensor v, Tensor attn_mask,
        float softmax_scale, bool causal, int window_left, int window_right, float softcap,
        bool deterministic, Tensor? alibi_slopes=None, Tensor? sinks=None)
        -> (Tensor out, Tensor softmax_lse)
    flash_attn_masked_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
        Tensor softmax_lse, Tensor attn_mask, float softmax_scale, bool causal,
        int window_left, int window_right, float softcap, bool deterministic,
        Tensor? alibi_slopes=None, Tensor? sinks=None, bool mask_grad=False)
        -> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dmask)

block_table in flash_attn_forward: paged prefill (varlen, k and v paged caches, no
backward). alibi_slopes (float32 (nheads,) or (batch, nheads)) and sinks (float32 (nheads,)):
the score terms, None = off. The backward takes the forward's; its dsinks is the gradient
of sinks, (nheads,) float32, when sinks is given, else an empty (0,) tensor (autograd
passes sinks to it only when sinks requires grad: dq, dk, dv do not depend on it).

fp8 KV caches (flash_attn_with_kvcache, and flash_attn_forward with block_table;
docs/inference.md): the caches both torch.float8_e4m3fn or both torch.float8_e5m2, q fp16
or bf16. Each cache's scale is k_scale / v_scale where that tensor (float32, () / (1,) or
(nheads_k,)) is given, else k_scale_value / v_scale_value, else 1.0: a float reaches the
library as a value, a tensor by its pointer. Scales with 16-bit caches are an error.

The masked ops are flash_attn_forward / flash_attn_backward for fixed-length q, k, v under
an attn_mask (docs/attention_masks.md): bool or float, broadcastable to (batch, nheads,
seqlen_q, seqlen_k). Ops of their own because the C ABI's mask is fixed length only and the
backward has a fifth output: dmask, the gradient of a float attn_mask in its shape and
dtype when mask_grad (autograd sets it when the mask requires grad), else an empty (0,)
tensor.

Fixed length when cu_seqlens_q/k are None: q (batch, seqlen_q, nheads, headdim), k and v
(batch, seqlen_k, nheads_k, headdim), softmax_lse (batch, nheads, seqlen_q). Varlen: packed
(total, heads, headdim) tensors, softmax_lse (nheads, total_q). Inputs may be any view whose
head dim is contiguous (other strides multiples of 8 elements): they are read in place.

Gradients: flash_attn_forward has an autograd formula (flash_attn_backward), so every
function here is differentiable in q, k, v and sinks, also under torch.compile (both ops
have fake implementations: no graph break); alibi_slopes gets no gradient (as in
flash-attn). As in flash-attn, softmax_lse (returned with return_attn_probs=True) is
treated as a constant: a gradient flowing into it is ignored. ``deterministic=True`` makes
the backward bit-identical run to run. The backward op returns contiguous dq, dk, dv; its
scratch memory comes from torch's caching allocator, so it can be captured in CUDA graphs.

ALiBi and sinks (docs/attention_terms.md): flash-attn's documented ALiBi bias
``-slope * |i + seqlen_k - seqlen_q - j|``, exactly, also in softmax_lse (flash-attn's causal
kernel adds ``slope * j`` instead, which gives the same output but another lse); sinks are
gpt-oss's attention sinks, not in flash-attn. The kernels run ALiBi, sinks and masks on
16-byte rows: with any of them, a head dim that is not a multiple of 8 runs on copies of
q, k, v (and out, dout) padded with zeros to the next multiple of 8, the outputs and
gradients cut back (KV caches too, their appended rows copied back).

Inference (docs/inference.md): flash_attn_with_kvcache and paged prefill have no backward.
flash_attn_with_kvcache records no graph (its outputs never require grad, as in flash-attn);
a paged flash_attn_forward (block_table) on inputs that require grad runs, and its backward
raises NotImplementedError: eagerly at once, in a compiled graph through
flash_attn_paged_backward (an op that exists so that the graph traces, and raises when run).
Their integer arguments' values are checked in eager mode with one device-to-host copy,
kept for unmodified tensors (samattn.set_value_checks turns that off); unchecked, the
kernels clamp every cache index.
"""

# No `from __future__ import annotations`: torch.library reads these annotations at
# import time, and `Tensor | None` does not evaluate on Python 3.9.
import math
from typing import Any, Optional, Union

import torch
from torch._subclasses.fake_tensor import is_fake

from . import _checks, _cuda, _dropout, _eager, _family
from ._checks import AttentionParams
from ._warnings import warn_once as _warn_once

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "scaled_dot_product_attention",
]

Tensor = torch.Tensor
# flash-attn's return value: out, or (out, softmax_lse, S_dmask) with return_attn_probs.
AttentionResult = Union[Tensor, tuple[Tensor, Tensor, None]]


# ------------------------------------------------------------------- ops ----
# The torch.library ops spell their arguments out: their schemas are public
# (torch.ops.samattn.*). Inside, the scalars, score terms and dropout travel as one
# _checks.AttentionParams, built from an op's inputs where they sit (from_op_inputs):
# (its first scalar, alibi_slopes, dropout_p).
_FORWARD_PARAMS = (7, 14, 16)
_BACKWARD_PARAMS = (10, 16, 18)
_MASKED_FORWARD_PARAMS = (4, 10, 12)
_MASKED_BACKWARD_PARAMS = (7, 13, 16)
_KVCACHE_PARAMS = (-11, 18)  # five scalars from 11 (no deterministic), no dropout
# Where the fp8 caches' scales start (k_scale, v_scale, k_scale_value, v_scale_value).
_FORWARD_SCALES = 18
_KVCACHE_SCALES = 20
# Where an op's gradient-taking inputs sit, for its autograd formula.
_FORWARD_SINKS = _FORWARD_PARAMS[1] + 1
_MASK, _MASKED_SINKS = 3, _MASKED_FORWARD_PARAMS[1] + 1
_BLOCK_TABLE = 13  # flash_attn_forward's


def _input(inputs: tuple, index: int) -> Optional[Tensor]:
    """An optional trailing input of an op (callers, and torch, may leave them out)."""
    return inputs[index] if len(inputs) > index else None


Scale = Union[float, Tensor, None]


def _op_scales(inputs: tuple, index: int) -> tuple[Scale, Scale]:
    """(k_scale, v_scale) of an op's inputs whose four scale inputs start at `index`: each
    its tensor where given, else its float value, else None."""
    k_tensor, v_tensor, k_value, v_value = (_input(inputs, i) for i in range(index, index + 4))
    return (
        k_value if k_tensor is None else k_tensor,
        v_value if v_tensor is None else v_tensor,
    )


def _scale_inputs(k_scale: Scale, v_scale: Scale) -> tuple:
    """The four op inputs of checked scales: (k_scale, v_scale) tensors, then
    (k_scale_value, v_scale_value) floats, None where a scale is not of that kind."""
    tensors = tuple(s if isinstance(s, Tensor) else None for s in (k_scale, v_scale))
    values = tuple(
        None if s is None or isinstance(s, Tensor) else float(s) for s in (k_scale, v_scale)
    )
    return (*tensors, *values)


def _scale_arg(scale: Scale) -> Scale:
    """A public function's scale as the implementations take it: an int as a float (the
    checks refuse what is neither None, a number nor a tensor)."""
    return float(scale) if type(scale) is int else scale


def _scale_tensors(k_scale: Scale, v_scale: Scale) -> tuple[Tensor, ...]:
    """The scales that are tensors, for the eager route."""
    return tuple(s for s in (k_scale, v_scale) if isinstance(s, Tensor))


@torch.library.custom_op("samattn::flash_attn_forward", mutates_args=())
def _flash_attn_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    block_table: Optional[Tensor] = None,
    alibi_slopes: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    dropout_seed: Optional[Tensor] = None,
    k_scale: Optional[Tensor] = None,
    v_scale: Optional[Tensor] = None,
    k_scale_value: Optional[float] = None,
    v_scale_value: Optional[float] = None,
) -> tuple[Tensor, Tensor]:
    # `deterministic` is the backward's; it is an argument here so that autograd sees it.
    params = AttentionParams(
        softmax_scale, causal, window_left, window_right, softcap, deterministic, alibi_slopes,
        sinks, dropout_p, dropout_seed,
    )  # fmt: skip
    return _cuda.flash_attn_forward(
        q, k, v, params, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        block_table=block_table,
        k_scale=k_scale_value if k_scale is None else k_scale,
        v_scale=v_scale_value if v_scale is None else v_scale,
    )  # fmt: skip


@_flash_attn_forward.register_fake
def _flash_attn_forward_fake(*inputs: object) -> tuple[Tensor, Tensor]:
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = inputs[:7]
    sizes = _checks.attention_sizes(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, None,
        _input(inputs, _BLOCK_TABLE), *_op_scales(inputs, _FORWARD_SCALES),
    )  # fmt: skip
    op = "samattn.flash_attn_varlen_func" if sizes.varlen else "samattn.flash_attn_func"
    params = AttentionParams.from_op_inputs(inputs, *_FORWARD_PARAMS)
    _checks.attention_extras(op, params, sizes, q)
    return q.new_empty(sizes.out_shape), q.new_empty(sizes.lse_shape, dtype=torch.float32)


@torch.library.custom_op("samattn::flash_attn_backward", mutates_args=())
def _flash_attn_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    alibi_slopes: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    dropout_seed: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    params = AttentionParams(
        softmax_scale, causal, window_left, window_right, softcap, deterministic, alibi_slopes,
        sinks, dropout_p, dropout_seed,
    )  # fmt: skip
    dq, dk, dv, dsinks = _cuda.flash_attn_backward(
        dout, q, k, v, out, softmax_lse, params, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k,
    )  # fmt: skip
    if dsinks is None:  # no sinks: an empty gradient, so that the op has one schema
        dsinks = q.new_empty((0,), dtype=torch.float32)
    return dq, dk, dv, dsinks


@_flash_attn_backward.register_fake
def _flash_attn_backward_fake(*inputs: object) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dout, q, k, v, out, softmax_lse = inputs[:6]
    sizes = _checks.attention_sizes(q, k, v, *inputs[6:10])
    _checks.flash_attn_backward(dout, out, softmax_lse, q, sizes)
    params = AttentionParams.from_op_inputs(inputs, *_BACKWARD_PARAMS)
    _checks.attention_extras("samattn.flash_attn_backward", params, sizes, q)
    dsinks = q.new_empty((0 if params.sinks is None else sizes.nheads,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


_PAGED_BACKWARD = (
    "samattn.flash_attn_varlen_func: no backward through a paged KV cache (block_table): "
    "paged prefill's forward runs on inputs that require grad, but its gradient is not "
    "supported (flash-attn has none either); for gradients pass k and v packed, without "
    "block_table, or run the forward under torch.no_grad()"
)


@torch.library.custom_op("samattn::flash_attn_paged_backward", mutates_args=())
def _flash_attn_paged_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor] = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward of a paged forward in a traced graph (torch.compile): it exists so that
    the graph compiles, and raises when the backward runs. Eager backwards raise at once."""
    raise NotImplementedError(_PAGED_BACKWARD)


@_flash_attn_paged_backward.register_fake
def _flash_attn_paged_backward_fake(dout, q, k, v, sinks=None):
    dsinks = q.new_empty((0 if sinks is None else sinks.shape[0],), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


def _tracing(t: Tensor) -> bool:
    """Whether a backward formula is being traced (torch.compile's joint graph) rather than
    run: fake tensors, or a dispatch mode such as the tracer's."""
    return torch.compiler.is_compiling() or _eager._dispatch_modes() > 0 or is_fake(t)


def _save_forward(
    ctx: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    varlen: tuple,
    params: AttentionParams,
    output: tuple[Tensor, Tensor],
    paged: bool,
) -> None:
    """What the backward of a forward (q, k, v; varlen = (cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k)) needs: its tensors saved, its scalars and family kept."""
    ctx.paged = paged
    if paged:  # no backward: only what the traced graph's error op takes (_paged_gradients)
        ctx.save_for_backward(q, k, v, params.sinks)
        ctx.family = _family.requested_family()
        return
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = varlen
    out, lse = output
    ctx.save_for_backward(
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, params.alibi_slopes, params.sinks,
        params.dropout_seed,
    )  # fmt: skip
    ctx.scalars, ctx.dropout_p = params[:6], params.dropout_p
    ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
    ctx.family = _family.requested_family()


def _gradients(ctx: Any, grad_out: Tensor, wants_dsinks: bool) -> tuple:
    """(dq, dk, dv, dsinks) of a forward saved by _save_forward; dsinks None unless the
    forward had sinks and `wants_dsinks`. softmax_lse's gradient is ignored (flash-attn's
    convention, documented in the module docstring); alibi_slopes gets none (as in
    flash-attn)."""
    if ctx.paged:
        return _paged_gradients(ctx, grad_out, wants_dsinks)
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, seed = ctx.saved_tensors
    if not wants_dsinks:
        sinks = None  # no gradient asked for: dq, dk and dv do not need the sinks
    params = AttentionParams(*ctx.scalars, alibi_slopes, sinks, ctx.dropout_p, seed)
    if _eager.route(grad_out, q, k, v, out, alibi_slopes, sinks) == _eager.DIRECT:
        dq, dk, dv, dsinks = _cuda.flash_attn_backward(
            grad_out, q, k, v, out, lse, params, cu_seqlens_q, cu_seqlens_k, *ctx.max_seqlens
        )
    else:
        # The dropout arguments only with dropout: plain calls keep the op's short form.
        dropout = (ctx.dropout_p, seed) if ctx.dropout_p else ()
        dq, dk, dv, dsinks = torch.ops.samattn.flash_attn_backward(
            grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.max_seqlens,
            *ctx.scalars, alibi_slopes, sinks, *dropout,
        )  # fmt: skip
    return dq, dk, dv, dsinks if sinks is not None else None


def _paged_gradients(ctx: Any, grad_out: Tensor, wants_dsinks: bool) -> tuple:
    """The backward of a paged forward (block_table): NotImplementedError when it runs. A
    traced graph gets the op that raises it when the compiled backward runs, so that a
    paged forward on inputs that require grad compiles (its backward is traced at once)."""
    if not _tracing(grad_out):
        raise NotImplementedError(_PAGED_BACKWARD)
    q, k, v, sinks = ctx.saved_tensors
    sinks = sinks if wants_dsinks else None
    dq, dk, dv, dsinks = torch.ops.samattn.flash_attn_paged_backward(grad_out, q, k, v, sinks)
    return dq, dk, dv, dsinks if sinks is not None else None


def _forward_setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    params = AttentionParams.from_op_inputs(inputs, *_FORWARD_PARAMS)
    paged = _input(inputs, _BLOCK_TABLE) is not None
    _save_forward(ctx, *inputs[:3], inputs[3:7], params, output, paged)


@_family.replays_family
def _forward_grad(ctx: Any, grad_out: Tensor, grad_lse: Optional[Tensor]) -> tuple:
    needs = ctx.needs_input_grad
    wants_dsinks = len(needs) > _FORWARD_SINKS and needs[_FORWARD_SINKS]
    dq, dk, dv, dsinks = _gradients(ctx, grad_out, wants_dsinks)
    grads = (dq, dk, dv) + (None,) * (_FORWARD_SINKS - 3) + (dsinks,)
    return grads + (None,) * (len(needs) - len(grads))


_flash_attn_forward.register_autograd(_forward_grad, setup_context=_forward_setup_context)


class _FlashAttnFunction(torch.autograd.Function):
    """The eager route with a gradient: flash_attn_forward's own forward and backward,
    without the dispatcher (see ops._GemmFunction). Takes q, k, v, cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, alibi_slopes, sinks and the
    params (whose tensors are these: inputs of their own, so that autograd sees them), then
    the scales of fp8 paged caches (no gradient: paged caches have no backward)."""

    @staticmethod
    def forward(
        ctx, q, k, v, cu_q, cu_k, max_q, max_k, block_table, alibi, sinks, params, k_scale,
        v_scale,
    ):  # fmt: skip
        varlen = (cu_q, cu_k, max_q, max_k)
        output = _cuda.flash_attn_forward(
            q, k, v, params, *varlen, block_table=block_table, k_scale=k_scale, v_scale=v_scale
        )
        _save_forward(ctx, q, k, v, varlen, params, output, block_table is not None)
        return output

    @staticmethod
    @_family.replays_family
    def backward(ctx, grad_out, grad_lse):
        dq, dk, dv, dsinks = _gradients(ctx, grad_out, ctx.needs_input_grad[9])
        return (dq, dk, dv) + (None,) * 6 + (dsinks, None, None, None)


# ----------------------------------------------------------- masked ops ----
# Attention under an attn_mask: ops of their own (fixed length only, as the C ABI's mask;
# the backward has a fifth output, the mask's gradient), so that flash_attn_forward and
# flash_attn_backward keep their schemas.
@torch.library.custom_op("samattn::flash_attn_masked_forward", mutates_args=())
def _flash_attn_masked_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    alibi_slopes: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    dropout_seed: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    params = AttentionParams(
        softmax_scale, causal, window_left, window_right, softcap, deterministic, alibi_slopes,
        sinks, dropout_p, dropout_seed,
    )  # fmt: skip
    return _cuda.flash_attn_forward(q, k, v, params, attn_mask=attn_mask)


@_flash_attn_masked_forward.register_fake
def _flash_attn_masked_forward_fake(*inputs: object) -> tuple[Tensor, Tensor]:
    q, k, v, attn_mask = inputs[:4]
    op = "samattn.flash_attn_func"
    sizes = _checks.attention_sizes(q, k, v, None, None, 0, 0, op)
    _checks.attention_mask(op, attn_mask, sizes, q)
    params = AttentionParams.from_op_inputs(inputs, *_MASKED_FORWARD_PARAMS)
    _checks.attention_extras(op, params, sizes, q)
    return q.new_empty(sizes.out_shape), q.new_empty(sizes.lse_shape, dtype=torch.float32)


@torch.library.custom_op("samattn::flash_attn_masked_backward", mutates_args=())
def _flash_attn_masked_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    attn_mask: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    alibi_slopes: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    mask_grad: bool = False,
    dropout_p: float = 0.0,
    dropout_seed: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    params = AttentionParams(
        softmax_scale, causal, window_left, window_right, softcap, deterministic, alibi_slopes,
        sinks, dropout_p, dropout_seed,
    )  # fmt: skip
    dq, dk, dv, dsinks, dmask = _cuda.flash_attn_masked_backward(
        dout, q, k, v, out, softmax_lse, attn_mask, params, mask_grad
    )
    # Gradients not asked for: empty, so that the op has one schema.
    if dsinks is None:
        dsinks = q.new_empty((0,), dtype=torch.float32)
    if dmask is None:
        dmask = q.new_empty((0,), dtype=torch.float32)
    return dq, dk, dv, dsinks, dmask


_MASK_GRAD = 15  # flash_attn_masked_backward's mask_grad


@_flash_attn_masked_backward.register_fake
def _flash_attn_masked_backward_fake(*inputs: object) -> tuple[Tensor, ...]:
    dout, q, k, v, out, softmax_lse, attn_mask = inputs[:7]
    mask_grad = bool(_input(inputs, _MASK_GRAD))
    op = "samattn.flash_attn_backward"
    sizes = _checks.attention_sizes(q, k, v, None, None, 0, 0, op)
    _checks.flash_attn_backward(dout, out, softmax_lse, q, sizes)
    _checks.attention_mask(op, attn_mask, sizes, q, grad=mask_grad)
    params = AttentionParams.from_op_inputs(inputs, *_MASKED_BACKWARD_PARAMS)
    _checks.attention_extras(op, params, sizes, q)
    dsinks = q.new_empty((0 if params.sinks is None else sizes.nheads,), dtype=torch.float32)
    if mask_grad:
        dmask = attn_mask.new_empty(attn_mask.shape)
    else:
        dmask = q.new_empty((0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks, dmask


def _save_masked(ctx: Any, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor,
                 params: AttentionParams, output: tuple[Tensor, Tensor]) -> None:  # fmt: skip
    """_save_forward for a forward under attn_mask."""
    out, lse = output
    ctx.save_for_backward(
        q, k, v, out, lse, attn_mask, params.alibi_slopes, params.sinks, params.dropout_seed
    )
    ctx.scalars, ctx.dropout_p = params[:6], params.dropout_p
    ctx.family = _family.requested_family()


def _masked_gradients(ctx: Any, grad_out: Tensor, wants_dmask: bool, wants_dsinks: bool) -> tuple:
    """(dq, dk, dv, dsinks, dmask) of a forward saved by _save_masked, as _gradients; and a
    float attn_mask whose gradient is asked for gets it (the kernels' per-pair gradient
    summed to the mask's shape, in its dtype), else dmask is None."""
    q, k, v, out, lse, attn_mask, alibi_slopes, sinks, seed = ctx.saved_tensors
    if not wants_dsinks:
        sinks = None
    mask_grad = wants_dmask and attn_mask.is_floating_point()
    params = AttentionParams(*ctx.scalars, alibi_slopes, sinks, ctx.dropout_p, seed)
    if _eager.route(grad_out, q, k, v, out, attn_mask, alibi_slopes, sinks) == _eager.DIRECT:
        dq, dk, dv, dsinks, dmask = _cuda.flash_attn_masked_backward(
            grad_out, q, k, v, out, lse, attn_mask, params, mask_grad
        )
    else:
        dropout = (ctx.dropout_p, seed) if ctx.dropout_p else ()
        dq, dk, dv, dsinks, dmask = torch.ops.samattn.flash_attn_masked_backward(
            grad_out, q, k, v, out, lse, attn_mask, *ctx.scalars, alibi_slopes, sinks,
            mask_grad, *dropout,
        )  # fmt: skip
    return dq, dk, dv, dsinks if sinks is not None else None, dmask if mask_grad else None


def _masked_setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    params = AttentionParams.from_op_inputs(inputs, *_MASKED_FORWARD_PARAMS)
    _save_masked(ctx, *inputs[:4], params, output)


@_family.replays_family
def _masked_grad(ctx: Any, grad_out: Tensor, grad_lse: Optional[Tensor]) -> tuple:
    needs = ctx.needs_input_grad
    wants_dsinks = len(needs) > _MASKED_SINKS and needs[_MASKED_SINKS]
    dq, dk, dv, dsinks, dmask = _masked_gradients(ctx, grad_out, bool(needs[_MASK]), wants_dsinks)
    grads = (dq, dk, dv, dmask) + (None,) * (_MASKED_SINKS - 4) + (dsinks,)
    return grads + (None,) * (len(needs) - len(grads))


_flash_attn_masked_forward.register_autograd(_masked_grad, setup_context=_masked_setup_context)


class _MaskedAttnFunction(torch.autograd.Function):
    """The eager route with a gradient under an attn_mask (see _FlashAttnFunction): takes
    q, k, v, attn_mask, alibi_slopes, sinks and the params."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, alibi_slopes, sinks, params):
        output = _cuda.flash_attn_forward(q, k, v, params, attn_mask=attn_mask)
        _save_masked(ctx, q, k, v, attn_mask, params, output)
        return output

    @staticmethod
    @_family.replays_family
    def backward(ctx, grad_out, grad_lse):
        needs = ctx.needs_input_grad
        dq, dk, dv, dsinks, dmask = _masked_gradients(ctx, grad_out, needs[3], needs[5])
        return dq, dk, dv, dmask, None, dsinks, None


# ------------------------------------------------------ flash-attn API ----
def _attention(
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: Optional[float],
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    alibi_slopes: Optional[Tensor],
    deterministic: bool,
    return_attn_probs: bool,
    block_table: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    attn_mask: Optional[Tensor] = None,
    k_scale: Scale = None,
    v_scale: Scale = None,
) -> AttentionResult:
    if dropout_p != 0.0 or type(dropout_p) is not float:
        dropout_p = _checks.check_dropout(op, dropout_p)
    if attn_mask is not None:  # fixed length: flash_attn_func's callers only
        return _masked_attention(
            op, q, k, v, attn_mask, softmax_scale, causal, window_size, softcap, alibi_slopes,
            deterministic, return_attn_probs, sinks, dropout_p,
        )  # fmt: skip
    scaled = k_scale is not None or v_scale is not None
    if scaled:
        k_scale, v_scale = _scale_arg(k_scale), _scale_arg(v_scale)
        route = _eager.route(
            q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, alibi_slopes, sinks,
            *_scale_tensors(k_scale, v_scale),
        )  # fmt: skip
    else:
        route = _eager.route(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, alibi_slopes, sinks)
    if route == _eager.DISPATCH:
        # Everything the kernels would reject, checked first with this function's name.
        for name, t in (("q", q), ("k", k), ("v", v)):
            _checks.require_tensor(t, f"{op}: {name}")
        if block_table is not None:
            sizes = _checks.flash_attn_varlen_paged(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, op,
                k_scale, v_scale,
            )  # fmt: skip
        elif scaled:
            _checks.kv_scales_without_cache(op, k_scale, v_scale)
        elif cu_seqlens_q is None:
            sizes = _checks.flash_attn(q, k, v, op)
        else:
            sizes = _checks.flash_attn_varlen(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, op
            )
        if alibi_slopes is not None or sinks is not None:
            _checks.attention_terms(op, alibi_slopes, sinks, sizes.batch, sizes.nheads, q)
    params = _checks.attention_params(
        op, softmax_scale, causal, window_size, softcap, q.shape[-1], deterministic,
        alibi_slopes, sinks, dropout_p, q,
    )  # fmt: skip
    # Positional arguments: a call with *args or keywords costs a microsecond more.
    if route == _eager.DIRECT:
        out, lse = _cuda.flash_attn_forward(
            q, k, v, params, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, op,
            block_table, None, return_attn_probs, k_scale, v_scale,
        )  # fmt: skip
    elif route == _eager.AUTOGRAD:
        out, lse = _FlashAttnFunction.apply(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
            alibi_slopes, sinks, params, k_scale, v_scale,
        )  # fmt: skip
    else:
        # The optional inputs only when one is given: plain calls keep the op's short form.
        optional = ()
        if block_table is not None or alibi_slopes is not None or sinks is not None:
            optional = (block_table, alibi_slopes, sinks)
        if params.dropout_seed is not None or scaled:
            optional = (block_table, alibi_slopes, sinks, dropout_p, params.dropout_seed)
        if scaled:
            optional += _scale_inputs(k_scale, v_scale)
        out, lse = torch.ops.samattn.flash_attn_forward(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *params[:6],
            *optional,
        )  # fmt: skip
    if not return_attn_probs:
        return out
    varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return out, lse, _attention_probs(q, k, lse, params, varlen)


def _attention_probs(
    q: Tensor,
    k: Tensor,
    lse: Tensor,
    params: AttentionParams,
    varlen: tuple = (None, None, 0, 0),
    attn_mask: Optional[Tensor] = None,
) -> Optional[Tensor]:
    """flash-attn's S_dmask of a call (None without dropout): the attention probabilities
    (batch, nheads, seqlen_q, seqlen_k) (varlen: each sequence in its corner) in q's dtype,
    negated where dropout dropped them (computed with torch ops on the device from the
    call's seed tensor and lse, no host synchronization: for small problems, as a check)."""
    seed = params.dropout_seed
    if seed is None:
        return None
    with torch.no_grad():
        if varlen[0] is None:
            mask = None if attn_mask is None else attn_mask.detach()
            probs = _dropout.attention_probs(q, k, lse, params, attn_mask=mask)
        else:
            probs = _dropout.varlen_probs(q, k, lse, *varlen, params)
        batch, nheads, seqlen_q, seqlen_k = probs.shape
        kept = _dropout.keep_mask(
            seed, params.dropout_p, batch, nheads, seqlen_q, seqlen_k, probs.device
        )
        return torch.where(kept, probs, -probs).to(q.dtype)


def _masked_attention(
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor,
    softmax_scale: Optional[float],
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    alibi_slopes: Optional[Tensor],
    deterministic: bool,
    return_attn_probs: bool,
    sinks: Optional[Tensor],
    dropout_p: float = 0.0,
) -> AttentionResult:
    """_attention for fixed-length q, k, v under attn_mask (flash_attn_masked_forward).
    With dropout, return_attn_probs also gives S_dmask, the mask applied."""
    route = _eager.route(q, k, v, attn_mask, alibi_slopes, sinks)
    if route == _eager.DISPATCH:
        for name, t in (("q", q), ("k", k), ("v", v)):
            _checks.require_tensor(t, f"{op}: {name}")
        sizes = _checks.flash_attn(q, k, v, op)
        _checks.attention_mask(op, attn_mask, sizes, q)
        if alibi_slopes is not None or sinks is not None:
            _checks.attention_terms(op, alibi_slopes, sinks, sizes.batch, sizes.nheads, q)
    params = _checks.attention_params(
        op, softmax_scale, causal, window_size, softcap, q.shape[-1], deterministic,
        alibi_slopes, sinks, dropout_p, q,
    )  # fmt: skip
    if route == _eager.DIRECT:
        out, lse = _cuda.flash_attn_forward(q, k, v, params, op=op, attn_mask=attn_mask)
    elif route == _eager.AUTOGRAD:
        out, lse = _MaskedAttnFunction.apply(q, k, v, attn_mask, alibi_slopes, sinks, params)
    else:
        dropout = () if params.dropout_seed is None else (dropout_p, params.dropout_seed)
        out, lse = torch.ops.samattn.flash_attn_masked_forward(
            q, k, v, attn_mask, *params[:6], alibi_slopes, sinks, *dropout
        )
    if not return_attn_probs:
        return out
    return out, lse, _attention_probs(q, k, lse, params, attn_mask=attn_mask)


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    sinks: Optional[Tensor] = None,
    attn_mask: Optional[Tensor] = None,
) -> AttentionResult:
    """Attention of flash-attn 2: ``softmax(softmax_scale * q @ k^T + mask) @ v`` per head.

    Args:
        q: (batch, seqlen_q, nheads, headdim).
        k, v: (batch, seqlen_k, nheads_k, headdim); nheads must be a multiple of nheads_k
            (GQA / MQA: query head h reads key/value head h // (nheads // nheads_k)).
            All three: torch.float16 or torch.bfloat16, one CUDA device, headdim 1 to
            256 (run in the next of 32, 64, 96, 128, 192, 256, inside the kernel). The
            kernels move rows as 16-byte vectors when headdim and the strides are
            multiples of 8, else element by element (slower). Views are read in place,
            except a non-contiguous head dim, or a headdim that is a multiple of 8 with
            strides that are not (copied, so that the vectors apply).
        dropout_p: attention dropout, in [0, 1), used rounded to a multiple of 1/256 (as
            flash-attn rounds it to 8 bits): each probability is dropped with that
            probability p and the kept ones scaled by 1 / (1 - p), in the forward and (the
            same ones) in the backward. The pattern comes from a seed drawn by torch's
            CUDA generator per call: torch.manual_seed reproduces it, two calls differ, a
            CUDA graph replay draws a new one (docs/attention_dropout.md).
        softmax_scale: defaults to headdim ** -0.5.
        causal: query i sees key j iff j <= i + seqlen_k - seqlen_q (aligned to the
            bottom-right corner of the score matrix, as flash-attn >= 2.1).
        window_size: (left, right) sliding window, any pair of int-likes (Python or numpy
            integers, 0-dim integer tensors), a negative bound unbounded: key j is visible
            to query i iff i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q +
            right, taken literally (flash-attn unbounds any bound >= seqlen_k, which differs
            when seqlen_q > seqlen_k); a query that sees no key gets zeros.
        softcap: > 0 replaces each scaled score s by softcap * tanh(s / softcap).
        alibi_slopes: None, or ALiBi slopes, torch.float32 on q's device, of shape
            (nheads,) (one per query head) or (batch, nheads): flash-attn's bias
            ``-slope * |i + seqlen_k - seqlen_q - j|`` is added to the score of query i and
            key j after the scale and softcap (bottom-right aligned, like causal). Not
            differentiable: it gets no gradient (as in flash-attn).
        deterministic: the backward gives bit-identical gradients run to run (dq and dsinks
            are summed in a fixed order: a little slower).
        return_attn_probs: also return softmax_lse and S_dmask: with dropout_p > 0 the
            attention probabilities (batch, nheads, seqlen_q, seqlen_k) in q's dtype (the
            mask applied), negated where dropout dropped them (computed apart with torch
            ops, for small problems, as flash-attn's is for its tests); otherwise None. As
            in flash-attn, gradients do not flow back through softmax_lse.
        sinks: keyword only, not in flash-attn: None, or attention sinks (gpt-oss style),
            torch.float32 (nheads,) on q's device: one logit per query head that joins every
            softmax denominator as an extra key whose value is zero, so query i's weights
            are exp(s_ij - lse_i) with lse_i = log(exp(sinks[h]) + sum_j exp(s_ij)) and sum
            to less than 1. Differentiable: a gradient flows to sinks when it requires grad.
        attn_mask: keyword only, not in flash-attn (docs/attention_masks.md): None, or a
            mask broadcastable to (batch, nheads, seqlen_q, seqlen_k) (query heads, also
            with GQA; e.g. (seqlen_q, seqlen_k) or (batch, 1, seqlen_q, seqlen_k)) on q's
            device, read by the kernels: torch.bool (True: the key takes part, as in
            torch's scaled_dot_product_attention) or float32 / float16 / bfloat16 added to
            the score after the scale, softcap and ALiBi (-inf masks; float16 and bfloat16
            are converted to float32 first). It combines with causal and the window (a key
            takes part only if all allow it). A float mask that requires grad gets its
            gradient (summed over its broadcast dims; the backward then holds a float32
            (batch, nheads, seqlen_q, seqlen_k) buffer).

    Returns:
        out (batch, seqlen_q, nheads, headdim), in q's dtype, differentiable in q, k and v
        (gradients in their dtype, GQA heads summed per group), in sinks (float32) and in
        a float attn_mask; with return_attn_probs ``(out, softmax_lse, S_dmask)``,
        softmax_lse (batch, nheads, seqlen_q) float32: the natural log of the sum of exp
        of each query's scores (after scale, softcap, ALiBi and an additive mask; the sink
        included). A query that sees no key (the mask included) gets out = 0 and
        softmax_lse = +inf, or sinks[h] with sinks.

    Raises:
        samattn.ArgumentError (a ValueError and a RuntimeError) / TypeError for bad
        arguments, samattn.UnsupportedError when this GPU, kernel family or build cannot
        run it.
    """
    return _attention(
        "samattn.flash_attn_func",
        q,
        k,
        v,
        None,
        None,
        0,
        0,
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
        sinks=sinks,
        attn_mask=attn_mask,
    )


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Optional[Tensor] = None,
    *,
    sinks: Optional[Tensor] = None,
    k_scale: Union[float, Tensor, None] = None,
    v_scale: Union[float, Tensor, None] = None,
) -> AttentionResult:
    """flash_attn_func on a batch of sequences of different lengths, packed.

    Args:
        q: (total_q, nheads, headdim); sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b+1].
        k, v: (total_k, nheads_k, headdim), likewise with cu_seqlens_k.
        cu_seqlens_q, cu_seqlens_k: torch.int32, (batch + 1,), non-decreasing offsets on the
            tensors' device. They are checked against the tensors (one small device-to-host
            copy per call, skipped while a CUDA graph is captured or when turned off with
            samattn.set_value_checks(False)).
        max_seqlen_q, max_seqlen_k: ints bounding every sequence's length.
        block_table: None, or paged prefill (no backward): (batch, max_blocks) torch.int32,
            and then k and v are paged caches (num_blocks, page_block_size, nheads_k,
            headdim), page_block_size a multiple of 16, read in place (strides multiples
            of 8 elements, 16-byte aligned) when headdim is a multiple of 8, else as
            zero-padded copies (a warning once). Sequence b's key j
            is row j % page_block_size of page block_table[b][j // page_block_size];
            cu_seqlens_k gives only each sequence's key count (cu_seqlens_k[b + 1] -
            cu_seqlens_k[b]), at most max_blocks * page_block_size. The entries of the
            pages in use are checked like the offsets (samattn.set_value_checks); the
            kernels clamp page indices into the cache. The forward runs on inputs that
            require grad, and its output then requires grad, but a gradient through a
            paged cache is not supported: the backward raises NotImplementedError (a
            RuntimeError), as flash-attn has none either.
            The paged caches may also be fp8 (not in flash-attn 2): both
            torch.float8_e4m3fn or both torch.float8_e5m2 (q stays fp16 / bf16), read
            with k_scale and v_scale, headdim a multiple of 16 (never padded), strides
            multiples of 16 elements (bytes), 16-byte aligned; run by the sm80 and sm90
            families (sm75 refuses them: samattn.UnsupportedError).
        alibi_slopes: None, (nheads,) or (batch, nheads) torch.float32, batch being the
            number of sequences (len(cu_seqlens_q) - 1); the bias of each sequence uses its
            own lengths.
        sinks: keyword only: None or (nheads,) torch.float32, as in flash_attn_func.
        k_scale, v_scale: keyword only, not in flash-attn, with fp8 paged caches only (an
            error otherwise): None (1.0), a positive float, or a torch.float32 tensor on
            q's device of shape () or (1,) (one scale for every KV head) or (nheads_k,)
            (one per KV head), contiguous, not requiring grad (two tensors: of one shape).
            A stored key element x stands for x * k_scale of its KV head (values
            likewise), as in flash_attn_with_kvcache.
        The other arguments are flash_attn_func's; causal, the window and ALiBi align each
        sequence's own bottom-right corner.

    Returns:
        out (total_q, nheads, headdim); with return_attn_probs ``(out, softmax_lse,
        S_dmask)``, softmax_lse (nheads, total_q) float32 and S_dmask as in flash_attn_func
        (None without dropout), (batch, nheads, max_seqlen_q, max_seqlen_k) with sequence
        b in its top-left corner (0 elsewhere). Rows outside every sequence are not written
        (their gradients are 0).
    """
    scaled = k_scale is not None or v_scale is not None
    if block_table is not None and not scaled and _cache_needs_padding(q, k, v) and q.dim() == 3:
        # Paged caches are read in place on 16-byte rows: any other head dim runs padded
        # (16-bit caches; fp8 ones, which come with scales or not, are refused instead).
        _warn_padded_caches("samattn.flash_attn_varlen_func", q.shape[-1], stacklevel=2)
        pad = _cuda._pad_head_dim
        result = flash_attn_varlen_func(
            pad(q), pad(k), pad(v), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            dropout_p, q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale,
            causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
            block_table, sinks=sinks,
        )  # fmt: skip
        return _cut_head_dim(result, q.shape[-1])
    if scaled:
        return _attention(
            "samattn.flash_attn_varlen_func", q, k, v, cu_seqlens_q, cu_seqlens_k,
            max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
            softcap, alibi_slopes, deterministic, return_attn_probs, block_table, sinks,
            k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip
    return _attention(
        "samattn.flash_attn_varlen_func",
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
        block_table,
        sinks,
    )


def _unpack(packed: Tensor, dim: int, count: int, what: str, layout: str) -> tuple[Tensor, ...]:
    """Views of the `count` tensors stacked at `dim` of a packed qkv / kv tensor."""
    _checks.require_tensor(packed, what)
    rank = len(layout.split(","))
    if packed.dim() != rank or packed.shape[dim] != count:
        raise _checks.ArgumentError(
            f"{what} must be {rank}-D {layout}, got shape {tuple(packed.shape)}"
        )
    return packed.unbind(dim)


def flash_attn_qkvpacked_func(
    qkv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    sinks: Optional[Tensor] = None,
) -> AttentionResult:
    """flash_attn_func with q, k, v stacked: qkv (batch, seqlen, 3, nheads, headdim).

    alibi_slopes and sinks as in flash_attn_func. Returns out (batch, seqlen, nheads,
    headdim) (see flash_attn_func)."""
    op = "samattn.flash_attn_qkvpacked_func"
    q, k, v = _unpack(qkv, 2, 3, f"{op}: qkv", "(batch, seqlen, 3, nheads, headdim)")
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, sinks=sinks,
    )  # fmt: skip


def flash_attn_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    sinks: Optional[Tensor] = None,
) -> AttentionResult:
    """flash_attn_func with k, v stacked: q (batch, seqlen_q, nheads, headdim),
    kv (batch, seqlen_k, 2, nheads_k, headdim); alibi_slopes and sinks as in
    flash_attn_func. Returns out like flash_attn_func."""
    op = "samattn.flash_attn_kvpacked_func"
    k, v = _unpack(kv, 2, 2, f"{op}: kv", "(batch, seqlen_k, 2, nheads_k, headdim)")
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, sinks=sinks,
    )  # fmt: skip


def flash_attn_varlen_qkvpacked_func(
    qkv: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    sinks: Optional[Tensor] = None,
) -> AttentionResult:
    """flash_attn_varlen_func with q, k, v stacked: qkv (total, 3, nheads, headdim), one
    cu_seqlens (batch + 1,) int32 and max_seqlen for queries and keys alike.
    alibi_slopes and sinks as in flash_attn_varlen_func. Returns out (total, nheads, headdim)
    (see flash_attn_varlen_func)."""
    op = "samattn.flash_attn_varlen_qkvpacked_func"
    q, k, v = _unpack(qkv, 1, 3, f"{op}: qkv", "(total, 3, nheads, headdim)")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
        sinks=sinks,
    )  # fmt: skip


def flash_attn_varlen_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    sinks: Optional[Tensor] = None,
) -> AttentionResult:
    """flash_attn_varlen_func with k, v stacked: q (total_q, nheads, headdim),
    kv (total_k, 2, nheads_k, headdim); alibi_slopes and sinks as in flash_attn_varlen_func.
    Returns out like flash_attn_varlen_func."""
    op = "samattn.flash_attn_varlen_kvpacked_func"
    k, v = _unpack(kv, 1, 2, f"{op}: kv", "(total_k, 2, nheads_k, headdim)")
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, sinks=sinks,
    )  # fmt: skip


# -------------------------------------------------------------- KV cache ----
@torch.library.custom_op("samattn::flash_attn_with_kvcache", mutates_args=("k_cache", "v_cache"))
def _flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor],
    v: Optional[Tensor],
    rotary_cos: Optional[Tensor],
    rotary_sin: Optional[Tensor],
    cache_seqlens: Optional[Tensor],
    cache_batch_idx: Optional[Tensor],
    cache_leftpad: Optional[Tensor],
    block_table: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    rotary_interleaved: bool,
    num_splits: int,
    alibi_slopes: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    k_scale: Optional[Tensor] = None,
    v_scale: Optional[Tensor] = None,
    k_scale_value: Optional[float] = None,
    v_scale_value: Optional[float] = None,
) -> tuple[Tensor, Tensor]:
    params = AttentionParams(
        softmax_scale, causal, window_left, window_right, softcap, False, alibi_slopes, sinks
    )
    return _cuda.flash_attn_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, params, rotary_interleaved, num_splits,
        k_scale=k_scale_value if k_scale is None else k_scale,
        v_scale=v_scale_value if v_scale is None else v_scale,
    )  # fmt: skip


@_flash_attn_with_kvcache.register_fake
def _flash_attn_with_kvcache_fake(*inputs: object) -> tuple[Tensor, Tensor]:
    q = inputs[0]
    params = AttentionParams.from_op_inputs(inputs, *_KVCACHE_PARAMS)
    k_scale, v_scale = _op_scales(inputs, _KVCACHE_SCALES)
    sizes = _checks.kvcache(
        *inputs[:11], inputs[17], alibi_slopes=params.alibi_slopes, sinks=params.sinks,
        k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip
    return q.new_empty(sizes.out_shape), q.new_empty(sizes.lse_shape, dtype=torch.float32)


def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    rotary_cos: Optional[Tensor] = None,
    rotary_sin: Optional[Tensor] = None,
    cache_seqlens: Optional[Union[Tensor, int]] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    block_table: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    sinks: Optional[Tensor] = None,
    k_scale: Union[float, Tensor, None] = None,
    v_scale: Union[float, Tensor, None] = None,
) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """Attention of new queries over a KV cache, for inference (flash-attn 2's function).

    If k and v are given, they are first written into the caches in place, at rows
    cache_seqlens[b] to cache_seqlens[b] + seqlen_new - 1 of each sequence (after rotary
    embedding when rotary_cos and rotary_sin are given); then q attends each sequence's
    keys, rows cache_leftpad[b] (default 0) to cache_seqlens[b] + seqlen_new - 1 (the
    whole cache without cache_seqlens), seen as keys 0, 1, ... of that sequence: causal
    and the window are aligned to the bottom-right corner, as in flash_attn_func. One
    call does a decode step (seqlen_q = seqlen_new = 1) or a chunk of a prefill.

    Args:
        q: (batch, seqlen_q, nheads, headdim), torch.float16 or torch.bfloat16.
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim), or with
            block_table paged caches (num_blocks, page_block_size, nheads_k, headdim),
            page_block_size a positive multiple of 16. q's dtype; nheads a multiple of
            nheads_k (GQA / MQA). headdim at most 256. With a headdim that is a
            multiple of 8 they are read and updated in place, never copied, so they must
            allow the kernels' 16-byte vectors: head dim contiguous, other strides
            multiples of 8 elements, 16-byte aligned (samattn.ArgumentError otherwise).
            Any other headdim runs on zero-padded copies of the caches (the appended rows
            copied back), at the cost of copying them on every call (a warning once).
            fp8 caches (not in flash-attn 2): both torch.float8_e4m3fn or both
            torch.float8_e5m2, with q fp16 / bf16, read with k_scale and v_scale. Their
            headdim must be a multiple of 16 (never padded), their strides multiples of
            16 elements (bytes) with the head dim contiguous, 16-byte aligned. The sm80
            and sm90 families run them; sm75 refuses them (samattn.UnsupportedError).
        k, v: None, or the new keys and values (batch, seqlen_new, nheads_k, headdim),
            appended to the caches in place; they need cache_seqlens. q's dtype, also
            with fp8 caches: each element y is stored as the fp8 value nearest
            y / scale of its KV head, saturated to the largest finite value (448 for
            e4m3, 57344 for e5m2; NaN stays NaN), after rotary embedding.
        rotary_cos, rotary_sin: None, or (seqlen_ro, rotary_dim / 2) in q's dtype,
            seqlen_ro covering the cache (>= seqlen_cache, or max_blocks *
            page_block_size), rotary_dim even and <= headdim (flash-attn asks for a
            multiple of 16; any even size works here). Only with k and v: rotary
            embedding of the first rotary_dim channels of q and of the new k. New key i
            of sequence b takes position cache_seqlens[b] + i; query row i takes the
            same position when causal or a window is set, else every query row takes
            cache_seqlens[b]. rotary_interleaved rotates channel pairs (2c, 2c + 1),
            otherwise (c, c + rotary_dim / 2) (GPT-NeoX style).
        cache_seqlens: None, an int (every sequence), or (batch,) torch.int32: the rows
            of each cache sequence in use before the append.
        cache_batch_idx: None, or (batch,) torch.int32: the cache sequence of each batch
            entry (default b; batch_cache must then be >= batch). Not with block_table.
        cache_leftpad: None, or (batch,) torch.int32: each sequence's first cache row
            (left padding). Not with block_table.
        block_table: None, or (batch, max_blocks) torch.int32: sequence b's row j is row
            j % page_block_size of page block_table[b][j // page_block_size].
        softmax_scale, causal, window_size, softcap: as in flash_attn_func, relative to
            each sequence's key count.
        alibi_slopes: None, or torch.float32 (nheads,) or (batch, nheads): ALiBi as in
            flash_attn_func, ``-slope * |i + n_b - seqlen_q - j|`` with n_b the keys that
            sequence attends (its cache rows in use plus the new ones: bottom-right, as
            causal).
        num_splits: how many CTAs share one query tile's keys (split-KV, combined by
            log-sum-exp); 0 lets samattn choose from the problem and the SM count, 1
            never splits. The result does not depend on it beyond rounding.
        return_softmax_lse: also return softmax_lse.
        sinks: keyword only, not in flash-attn: None, or torch.float32 (nheads,) attention
            sinks as in flash_attn_func.
        k_scale, v_scale: keyword only, not in flash-attn, with fp8 caches only (given
            with fp16 / bf16 caches they are an error): None (1.0), a positive finite
            float, or a torch.float32 tensor on q's device of shape () or (1,) (one scale
            for every KV head) or (nheads_k,) (one per KV head), contiguous, not
            requiring grad; two tensors must have one shape. A stored key element x of KV
            head h stands for x * k_scale[h] (values likewise with v_scale): attention
            is computed on the dequantized cache. A float is passed by value (nothing
            allocated per call); a tensor is read by the kernels, so a CUDA graph replays
            whatever it holds then.

    Integer values are checked in eager mode (one device-to-host copy of the integer
    tensors, not repeated for the same unmodified tensors; see samattn.set_value_checks
    to turn it off for serving):
    cache_seqlens[b] >= 0 and cache_seqlens[b] + seqlen_new within the cache,
    cache_leftpad[b] within [0, that end], cache_batch_idx[b] in [0, batch_cache), and
    the block_table entries of the pages in use in [0, num_blocks). Unchecked (inside
    CUDA graph capture, or switched off), the kernels clamp every row and page index
    into the cache and never read or write outside it.

    No gradient: this is an inference function. Inputs that require grad are computed
    on as they are, and the outputs do not require grad (as in flash-attn).

    Returns:
        out (batch, seqlen_q, nheads, headdim), contiguous, in q's dtype; with
        return_softmax_lse ``(out, softmax_lse)``, softmax_lse (batch, nheads, seqlen_q)
        float32. A query that sees no key gets out = 0 and softmax_lse = +inf (sinks[h]
        with sinks).

    Raises:
        samattn.ArgumentError (a ValueError and a RuntimeError) / TypeError for bad
        arguments (naming the argument), samattn.UnsupportedError when this GPU, kernel
        family or build cannot run it.
    """
    op = "samattn.flash_attn_with_kvcache"
    _checks.require_tensor(q, f"{op}: q")
    headdim = q.shape[-1] if q.dim() == 4 else 1  # for the default scale; shapes checked below
    odd = q.dim() == 4 and headdim % _TERMS_HEAD_DIM_MULTIPLE
    # Scales come with fp8 caches (or are a mistake, which the checks name): never padded.
    scaled = k_scale is not None or v_scale is not None
    if odd and not scaled and _cache_needs_padding(q, k_cache, v_cache, k, v):
        return _flash_attn_with_kvcache_padded(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table,
            headdim**-0.5 if softmax_scale is None else softmax_scale, causal, window_size,
            softcap, rotary_interleaved, alibi_slopes, num_splits, return_softmax_lse,
            sinks=sinks,
        )  # fmt: skip
    params = _checks.attention_params(
        op, softmax_scale, causal, window_size, softcap, headdim, False, alibi_slopes, sinks
    )
    interleaved = True if rotary_interleaved else False  # noqa: SIM210 (bool() without a call)
    seqlens_tensor = cache_seqlens if isinstance(cache_seqlens, Tensor) else None
    scale_tensors: tuple[Tensor, ...] = ()
    if scaled:
        k_scale, v_scale = _scale_arg(k_scale), _scale_arg(v_scale)
        scale_tensors = _scale_tensors(k_scale, v_scale)
    route = _eager.route(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, seqlens_tensor, cache_batch_idx,
        cache_leftpad, block_table, alibi_slopes, sinks, *scale_tensors,
    )  # fmt: skip
    if route != _eager.DISPATCH:
        # The CUDA implementation records no autograd graph (inference only).
        # Positional arguments: a call with keywords costs more.
        out, lse = _cuda.flash_attn_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, params, interleaved, num_splits, op,
            bool(return_softmax_lse), k_scale, v_scale,
        )  # fmt: skip
    else:
        sizes = _checks.kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, num_splits, op, alibi_slopes, sinks, k_scale, v_scale,
        )  # fmt: skip
        if cache_seqlens is not None and seqlens_tensor is None:
            cache_seqlens = q.new_full((sizes.batch,), cache_seqlens, dtype=torch.int32)
        # The score terms and scales only when one is given: plain calls keep the op's
        # short form.
        terms = () if alibi_slopes is None and sinks is None else (alibi_slopes, sinks)
        if scaled:
            terms = (alibi_slopes, sinks, *_scale_inputs(k_scale, v_scale))
        with torch.no_grad():  # the op has no autograd formula: inference only
            out, lse = torch.ops.samattn.flash_attn_with_kvcache(
                q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                cache_batch_idx, cache_leftpad, block_table, *params[:5], interleaved,
                int(num_splits), *terms,
            )  # fmt: skip
    return (out, lse) if return_softmax_lse else out


_TERMS_HEAD_DIM_MULTIPLE = _cuda._TERMS_HEAD_DIM_MULTIPLE


def _cache_needs_padding(*tensors: Optional[Tensor]) -> bool:
    """Whether q, the caches (and the new k, v when given) share a head dim the kernels'
    16-byte vectors cannot read in place: not a multiple of 8, at most 256, the caches not
    fp8. Anything else, well formed or not, goes to the checks of the usual path."""
    q = tensors[0]
    # q's head dim first: the common call (a multiple of 8) pays one test.
    if not isinstance(q, Tensor) or q.dim() < 1 or q.shape[-1] % _TERMS_HEAD_DIM_MULTIPLE == 0:
        return False
    others = [t for t in tensors[1:] if t is not None]  # the caches, k and v: 4-D
    if not all(isinstance(t, Tensor) and t.dim() == 4 for t in others):
        return False
    if any(t.dtype in _checks.FP8_CODES for t in others):
        return False  # fp8 caches are never padded: the checks refuse their head dim
    headdim = q.shape[-1]
    return headdim <= 256 and all(t.shape[-1] == headdim for t in others)


def _warn_padded_caches(op: str, headdim: int, stacklevel: int) -> None:
    """Once per process; stacklevel counts from the caller, as for warnings.warn."""
    _warn_once(
        f"{op}: head dim {headdim} is not a multiple of 8, so each call runs on zero-padded "
        "copies of the KV caches (each cache copied in and, when the call appends to it, out "
        "again: several times the attention's own memory traffic); caches with a head dim "
        "that is a multiple of 8 are read in place (this warning is shown once per process)",
        stacklevel=stacklevel + 1,
    )


def _cut_head_dim(result: Any, headdim: int) -> Any:
    """A padded call's output (alone or first of a tuple) cut back to `headdim` columns."""
    if isinstance(result, tuple):
        return (result[0][..., :headdim].contiguous(), *result[1:])
    return result[..., :headdim].contiguous()


def _flash_attn_with_kvcache_padded(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor],
    v: Optional[Tensor],
    *args: Any,
    sinks: Optional[Tensor],
) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """flash_attn_with_kvcache for a head dim that is not a multiple of 8: on copies of q,
    the caches and k, v padded with zero columns to the next multiple of 8 (q . k and the
    softmax are unchanged, v's zero columns give zero output columns), the caches copied
    back into the caller's when k, v were appended, the output cut back. args: the call's
    other arguments in order, softmax_scale already resolved from the unpadded head dim."""
    _warn_padded_caches("samattn.flash_attn_with_kvcache", q.shape[-1], stacklevel=3)
    pad = _cuda._pad_head_dim
    k_padded, v_padded = pad(k_cache), pad(v_cache)
    result = flash_attn_with_kvcache(
        pad(q), k_padded, v_padded,
        None if k is None else pad(k), None if v is None else pad(v), *args, sinks=sinks,
    )  # fmt: skip
    if k is not None:
        k_cache.copy_(k_padded[..., : k_cache.shape[-1]])
        v_cache.copy_(v_padded[..., : v_cache.shape[-1]])
    return _cut_head_dim(result, q.shape[-1])


# ------------------------------------------------------------------ SDPA ----
def _warn_fallback_once(reason: str) -> None:
    _warn_once(
        f"samattn.scaled_dot_product_attention: {reason}, so samattn is running "
        "torch.nn.functional.scaled_dot_product_attention for this call (this warning is "
        "shown once per process for each reason)",
        stacklevel=3,
    )


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> Tensor:
    """torch.nn.functional.scaled_dot_product_attention on samattn's kernels.

    Args:
        query: (batch, heads, seqlen_q, headdim); key, value: (batch, heads_k, seqlen_k,
            headdim), torch.float16 or torch.bfloat16 on one CUDA device, headdim 1 to
            256. Read in place through their strides (no copies) when the head dim is
            contiguous.
        attn_mask: None, or a mask broadcastable to (batch, heads, seqlen_q, seqlen_k)
            (e.g. (seqlen_q, seqlen_k), or (batch, 1, seqlen_q, seqlen_k) for padding) on
            query's device, read by the kernels: torch.bool, True where the key takes part,
            or a float tensor (float32, float16, bfloat16) added to the scaled scores. A
            float mask that requires grad gets its gradient. See docs/attention_masks.md.
        dropout_p: 0.0 runs samattn; dropout_p > 0 runs torch's implementation (with its
            generator's dropout pattern; samattn's dropout is flash_attn_func's), with a
            warning the first time.
        is_causal: torch's causal mask, aligned to the top-left corner when
            seqlen_q != seqlen_k. Together with attn_mask: RuntimeError, as torch documents.
        scale: defaults to headdim ** -0.5.
        enable_gqa: as torch's: heads_k may divide heads (grouped-query attention).

    A query row whose keys are all masked gets zeros (torch's results for such rows depend
    on its version and backend). Other inputs samattn cannot serve (other ranks or dtypes,
    CPU tensors, nested tensors, a different value head dim) run torch's implementation,
    with a one-time warning per reason.

    Returns:
        (batch, heads, seqlen_q, headdim) in query's dtype: a (batch, heads)-transposed view
        of a contiguous (batch, seqlen_q, heads, headdim) tensor, as torch's flash backend.
    """
    op = "samattn.scaled_dot_product_attention"
    _checks.dropout_value(op, dropout_p)
    if is_causal and attn_mask is not None:
        raise RuntimeError(
            f"{op}: Explicit attn_mask should not be set when is_causal=True (torch documents "
            "the combination as an error); fold the causal mask into attn_mask instead"
        )
    reason = _checks.sdpa_fallback_reason(
        query, key, value, attn_mask, is_causal, enable_gqa, dropout_p
    )
    if reason is not None:
        _warn_fallback_once(reason)
        extra = {"enable_gqa": True} if enable_gqa else {}
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **extra
        )
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    causal, window = bool(is_causal), (-1, -1)
    if is_causal and seqlen_q != seqlen_k:
        # Top-left causal (j <= i) is bottom-right causal shifted by seqlen_q - seqlen_k:
        # a window reaching that far right of the bottom-right diagonal.
        causal, window = False, (-1, seqlen_q - seqlen_k)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if attn_mask is None:
        out = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window)
    else:  # checked here, so that errors name this function (is_causal is False here)
        batch, heads, _, headdim = query.shape
        sizes = _checks.AttentionShape(
            batch, heads, key.shape[1], seqlen_q, seqlen_k, headdim, varlen=False
        )
        _checks.attention_mask(op, attn_mask, sizes, query)
        out = flash_attn_func(q, k, v, softmax_scale=scale, attn_mask=attn_mask)
    return out.transpose(1, 2)
