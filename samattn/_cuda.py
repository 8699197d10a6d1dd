"""CUDA implementations of the samattn ops: fill the C argument structs and call libsamattn.

Outputs are allocated here by torch (the library never allocates); kernels run on torch's
current stream of the tensors' device.
"""

from __future__ import annotations

import ctypes
import math
import operator
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch

from . import _checks, _family, _lib, _prepared


def _operand(t: torch.Tensor, batch: int) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """A or B as the kernels take it, and its (batch, row, col) element strides (batch 0
    where it broadcasts). Either of its two last strides must be 1: transposed views
    (``.t()``, ``.mT``) qualify as they are, so they cost no copy."""
    strides = t.stride()
    if strides[-1] != 1 and strides[-2] != 1:
        t = t.contiguous()
        strides = t.stride()
    if len(strides) == 3 and t.shape[0] == batch:
        return t, strides
    return t, (0, strides[-2], strides[-1])


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(t: torch.Tensor) -> int:
    """torch's current stream on t's device, as a cudaStream_t value."""
    if _raw_stream is not None:
        return _raw_stream(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


def _gemm_args(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    alpha: float,
    beta: float,
    sizes: _checks.GemmShape,
    out_ptr: int,
    bias: torch.Tensor | None = None,
) -> tuple[_lib.GemmArgs, tuple[torch.Tensor, ...]]:
    """The C arguments of D = act(alpha * a @ b + beta * c + bias), D contiguous at
    out_ptr, and the tensors they point to (a and b as the kernels read them, the bias),
    to keep alive."""
    dtype = _checks.DTYPE_CODES[a.dtype]
    allow_tf32 = dtype == _lib.F32 and torch.get_float32_matmul_precision() != "highest"
    batch, m, n = sizes.batch, sizes.m, sizes.n
    a, a_strides = _operand(a, batch)
    b, b_strides = _operand(b, batch)
    c_ptr, c_strides = 0, (0, 0, 0)
    if c is not None and beta != 0.0:
        expanded = c.expand(sizes.out_shape)
        c_ptr, strides = expanded.data_ptr(), expanded.stride()
        c_strides = (strides[0] if len(strides) == 3 else 0, strides[-2], strides[-1])
    args = _lib.blank(_lib.GemmArgs)
    _lib.GEMM_PACKER.pack_into(
        args, 0,
        ctypes.sizeof(args), dtype, _family.requested_family(), max(a.get_device(), 0),
        int(allow_tf32), batch, m, n, sizes.k,
        a.data_ptr(), *a_strides,
        b.data_ptr(), *b_strides,
        c_ptr, *c_strides,
        out_ptr, m * n, n, 1,
        alpha, beta,
        0, 0, 0,  # stream, workspace: set by the caller
        0 if bias is None else bias.data_ptr(), sizes.activation,
        int(sizes.out_dtype is torch.float32), sizes.split_k, sizes.split_k_mode,
        0, _lib.GROUP_NONE, 0, 0,  # group_offsets, mode, list: set by the grouped calls
    )  # fmt: skip
    return args, (a, b, bias)


_GEMM = _prepared.Calls(
    _lib.GemmArgs, "samattn_gemm", "samattn_gemm_workspace_size", "samattn_gemm_with_pointers"
)


def _gemm_key(a: torch.Tensor, b: torch.Tensor, alpha: float) -> tuple:
    """The prepared-call key of D = alpha * a @ b (no c)."""
    dtype = a.dtype
    # fp32 runs on TF32 tensor cores unless torch's matmul precision is "highest".
    tf32 = dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest"
    return (
        a.shape, a.stride(), b.shape, b.stride(), dtype, b.dtype, a.get_device(),
        b.get_device(), alpha, tf32, _family.requested_family(),
    )  # fmt: skip


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
) -> torch.Tensor:
    """D = act(alpha * a @ b + beta * c + bias) on the GPU; see samattn.gemm."""
    plain = (
        bias is None
        and activation is None
        and out_dtype is None
        and split_k == "auto"
        and split_k_mode == "auto"
    )
    key = None
    if (
        c is None
        and beta == 0.0
        and type(alpha) is float
        and (plain or _keyable(activation, split_k, split_k_mode))
    ):
        key = _gemm_key(a, b, alpha)
        if not plain:
            key = (*key, _bias_key(bias), activation, out_dtype, split_k, split_k_mode)
        entry = _GEMM.entries.get(key)
        if entry is not None:  # a signature seen before: one C call with its pointers
            out = _gemm_output(a, entry.out_shape, out_dtype)
            bias_ptr = None if bias is None else bias.data_ptr()
            refused = False
            if entry.workspace == 0:
                status = _GEMM.with_pointers(
                    entry.address, a.data_ptr(), b.data_ptr(), out.data_ptr(), bias_ptr,
                    _stream(out), None, 0, _lib.family_out(),
                )  # fmt: skip
                if status == _lib.OK:
                    return out
                if status != _lib.NEEDS_WORKSPACE:
                    _lib.check(status)
                refused = True  # e.g. a newly forced family that needs one
            args = _GEMM.args(entry)
            args.a, args.b, args.d = a.data_ptr(), b.data_ptr(), out.data_ptr()
            args.bias = bias_ptr
            args.stream = _stream(out)
            _GEMM.run(key, entry, args, a, refused)
            return out
    if plain:
        sizes = _checks.gemm_quick(a, b, c, alpha, beta) or _checks.gemm(a, b, c, alpha, beta)
    else:
        sizes = _checks.gemm(
            a, b, c, alpha, beta, bias, activation, out_dtype, split_k, split_k_mode
        )
    out = _gemm_output(a, sizes.out_shape, sizes.out_dtype)
    if out.numel() == 0:
        return out
    kernel_bias = bias if bias is None or bias.stride(0) == 1 else bias.contiguous()
    args, operands = _gemm_args(a, b, c, alpha, beta, sizes, out.data_ptr(), kernel_bias)
    args.stream = _stream(out)
    _prepared.run_with_workspace("samattn_gemm", "samattn_gemm_workspace_size", args, a)
    if key is not None and operands[0] is a and operands[1] is b and kernel_bias is bias:
        _GEMM.put(key, args, out.shape)  # every tensor read in place
    return out


def _keyable(*values: object) -> bool:
    """Whether these arguments can sit in a prepared call's key (an unhashable one is left
    to the checks, which name it)."""
    return all(value is None or type(value) in (int, str) for value in values)


def _bias_key(bias: torch.Tensor | None) -> tuple | None:
    """What of the bias a prepared gemm's signature holds (its pointer is the call's)."""
    if bias is None:
        return None
    return bias.shape, bias.stride(), bias.dtype, bias.get_device()


def _gemm_output(
    a: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype | None
) -> torch.Tensor:
    """gemm's output: a's dtype by new_empty (a few microseconds cheaper than torch.empty
    with a device; the sizes as separate arguments parse faster than a tuple), another
    through the per-device prototype."""
    if dtype is None or dtype is a.dtype:
        return a.new_empty(*shape)
    return _prepared.empty(a, shape, dtype)


def _grouped_offsets(offsets: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The ends as the kernels read them: contiguous int32 on the operands' device (a CPU
    tensor, checked on the host already, is copied there)."""
    if offsets.device != like.device:
        offsets = offsets.to(like.device, non_blocking=True)
    return offsets if offsets.stride(0) == 1 else offsets.contiguous()


def _run_grouped(
    a: torch.Tensor,
    b: torch.Tensor,
    offsets: torch.Tensor,
    sizes: _checks.GroupedShape,
    mode: int,
) -> torch.Tensor:
    """One grouped launch (samattn.h) into a new contiguous output; a and b as _operand
    takes them."""
    out = a.new_empty(sizes.out_shape)
    if out.numel() == 0:
        return out
    shape = _checks.GemmShape(out.shape, sizes.groups, sizes.m, sizes.n, sizes.k)
    args, keep = _gemm_args(a, b, None, 1.0, 0.0, shape, out.data_ptr())
    if mode == _lib.GROUP_ROWS:
        args.d_batch_stride = 0  # the groups share D, each its own rows
    ends = _grouped_offsets(offsets, a)
    args.group_offsets, args.group_mode = ends.data_ptr(), mode
    args.stream = _stream(out)
    _prepared.run_with_workspace("samattn_gemm", "samattn_gemm_workspace_size", args, a)
    del keep, ends  # alive until the launch is queued
    return out


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """out[rows of g] = x[rows of g] @ w[g] on the GPU; see samattn.grouped_gemm."""
    return _run_grouped(x, w, offsets, _checks.grouped_gemm(x, w, offsets), _lib.GROUP_ROWS)


def grouped_gemm_k(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """out[g] = a[:, ks] @ b[ks, :] over group g's K range ks, on the GPU."""
    return _run_grouped(a, b, offsets, _checks.grouped_gemm_k(a, b, offsets), _lib.GROUP_K)


def grouped_gemm_list(as_: list[torch.Tensor], bs: list[torch.Tensor]) -> list[torch.Tensor]:
    """out[i] = as_[i] @ bs[i] for every i in one call; see samattn.grouped_gemm_list."""
    sizes = _checks.grouped_gemm_list_quick(as_, bs) or _checks.grouped_gemm_list(as_, bs)
    outs = [a.new_empty(m, n) for a, (m, n, _) in zip(as_, sizes)]
    entries = (_lib.GemmListEntry * len(sizes))()
    pack, entry_bytes = _lib.LIST_ENTRY_PACKER.pack_into, ctypes.sizeof(_lib.GemmListEntry)
    keep = []  # the operands as the kernels read them, alive until the launch is queued
    for i, (a, b, out, (m, n, k)) in enumerate(zip(as_, bs, outs, sizes)):
        a, (_, a_row, a_col) = _operand(a, 1)
        b, (_, b_row, b_col) = _operand(b, 1)
        keep += (a, b)
        pack(
            entries, i * entry_bytes,
            m, n, k, a.data_ptr(), a_row, a_col, b.data_ptr(), b_row, b_col, out.data_ptr(), n, 1,
        )  # fmt: skip
    if all(out.numel() == 0 for out in outs):
        return outs
    args = _lib.GemmArgs(
        dtype=_checks.DTYPE_CODES[as_[0].dtype],
        family=_family.requested_family(),
        device=as_[0].get_device(),
        batch=len(sizes),
        alpha=1.0,
        group_mode=_lib.GROUP_LIST,
        group_list=ctypes.cast(entries, ctypes.c_void_p),
        stream=_stream(as_[0]),
    )
    _prepared.run_with_workspace("samattn_gemm", "samattn_gemm_workspace_size", args, as_[0])
    del keep
    return outs


def gemm_plan(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
    split_k: int | str = "auto",
    split_k_mode: str = "auto",
) -> tuple[str, str]:
    """(family, configuration) samattn.gemm would use for these CUDA tensors (no launch).

    Honours the forced family (samattn.use_family / SAMATTN_FAMILY) and torch's fp32
    matmul precision like samattn.gemm. Assumes a contiguous output, as gemm allocates.
    """
    sizes = _checks.gemm(a, b, c, alpha, beta, bias, activation, out_dtype, split_k, split_k_mode)
    # A freshly allocated output is at least 16-byte aligned: stand in 256.
    args, _keep = _gemm_args(a, b, c, alpha, beta, sizes, 256, bias)
    props = _lib.device_properties(args.device)
    return _lib.gemm_plan(args, props["compute_capability"], props["sm_count"])


def _run_softmax(
    function_name: str,
    view: _checks.SoftmaxShape,
    x: torch.Tensor,
    dy: torch.Tensor | None,
    out: torch.Tensor,
) -> _lib.SoftmaxArgs:
    args = _lib.blank(_lib.SoftmaxArgs)
    _lib.SOFTMAX_PACKER.pack_into(
        args, 0,
        ctypes.sizeof(args), _checks.DTYPE_CODES[x.dtype], _family.requested_family(),
        x.get_device(), 0,
        view.outer, view.dim, view.inner,
        x.data_ptr(), 0 if dy is None else dy.data_ptr(), out.data_ptr(),
        _stream(x),
    )  # fmt: skip
    _lib.check(_prepared.bound(function_name)(ctypes.byref(args), _lib.family_out()))
    return args


_SOFTMAX = _prepared.Calls(
    _lib.SoftmaxArgs, "samattn_softmax_forward", None, "samattn_softmax_forward_with_pointers"
)
_SOFTMAX_BACKWARD = _prepared.Calls(
    _lib.SoftmaxArgs, "samattn_softmax_backward", None, "samattn_softmax_backward_with_pointers"
)


def _softmax_key(x: torch.Tensor, dim: int, *others: torch.Tensor) -> tuple | None:
    """The prepared-call key of a softmax (forward: x; backward: y, dy) on contiguous
    tensors of one shape, or None (the full path)."""
    if type(dim) is not int or not x.is_contiguous():
        return None
    devices: tuple[int, ...] = ()
    if others:  # the backward's dy
        for t in others:
            if not t.is_contiguous() or t.shape != x.shape or t.dtype is not x.dtype:
                return None
        devices = tuple(t.get_device() for t in others)
    return (x.shape, x.dtype, x.get_device(), devices, dim, _family.requested_family())


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax of x along dim on the GPU; see samattn.softmax."""
    key = _softmax_key(x, dim)
    entry = None if key is None else _SOFTMAX.entries.get(key)
    if entry is not None:  # a signature seen before: one C call with its pointers
        y = torch.empty_like(x)  # x is contiguous (the key's condition)
        status = _SOFTMAX.with_pointers(
            entry.address, x.data_ptr(), None, y.data_ptr(), _stream(x), _lib.family_out()
        )
        if status != _lib.OK:
            _lib.check(status)
        return y
    view = _checks.softmax_quick(x, dim) or _checks.softmax(x, dim)
    x = x.contiguous()
    y = torch.empty_like(x)
    if y.numel() > 0:
        args = _run_softmax("samattn_softmax_forward", view, x, None, y)
        if key is not None:
            _SOFTMAX.put(key, args, y.shape)
    return y


def softmax_backward(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    """dx = y * (dy - sum(dy * y, dim)) on the GPU, from the forward output y."""
    key = _softmax_key(y, dim, dy)
    entry = None if key is None else _SOFTMAX_BACKWARD.entries.get(key)
    if entry is not None:
        dx = torch.empty_like(y)
        status = _SOFTMAX_BACKWARD.with_pointers(
            entry.address, y.data_ptr(), dy.data_ptr(), dx.data_ptr(), _stream(y),
            _lib.family_out(),
        )  # fmt: skip
        if status != _lib.OK:
            _lib.check(status)
        return dx
    view = _checks.softmax_backward(y, dy, dim)
    y = y.contiguous()
    dy = dy.contiguous()
    dx = torch.empty_like(y)
    if dx.numel() > 0:
        args = _run_softmax("samattn_softmax_backward", view, y, dy, dx)
        if key is not None:
            _SOFTMAX_BACKWARD.put(key, args, dx.shape)
    return dx


# -------------------------------------------------------------- attention ----
_VECTOR_BYTES = 16  # the attention kernels move 16-byte vectors along the head dim


def _attention_operand(t: torch.Tensor) -> torch.Tensor:
    """An attention tensor as the kernels read it, with a contiguous head dim.

    The kernels move rows as 16-byte vectors when the head dim, the pointer and every
    stride are multiples of 8 elements, else element by element (several times slower).
    With a head dim that is a multiple of 8, a view whose pointer or strides break the
    vectors is copied to a contiguous tensor, which is cheaper than the element path;
    views that qualify (SDPA's (batch, heads, seq, dim) seen as (batch, seq, heads, dim),
    a slice of packed qkv) cost no copy. Any other head dim cannot have 16-byte rows, so
    its tensors are read in place (copied only when the head dim is not contiguous)."""
    if t.is_contiguous():  # a copy would be the same tensor
        return t
    strides = t.stride()
    if strides[-1] != 1:
        return t.contiguous()
    shape = t.shape
    vector = _VECTOR_BYTES // t.element_size()
    if shape[-1] % vector != 0:
        return t
    if t.data_ptr() % _VECTOR_BYTES != 0:
        return t.contiguous()
    # A stride of a mode of size 1 is never stepped over: it may be anything.
    if all(s % vector == 0 or n == 1 for n, s in zip(shape[:-1], strides[:-1])):
        return t
    return t.contiguous()


def _seq_head_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, seq, head) element strides of a 4-D (batch, seq, head, dim) or 3-D packed
    (total, head, dim) tensor; 0 for a mode of size 1 (never stepped over), and batch 0
    for a packed tensor."""
    shape = t.shape
    if len(shape) == 3:
        batch = 1
        seq, head, dim = shape
    else:
        batch, seq, head, dim = shape
    if t.is_contiguous():  # the usual case: no stride() call
        seq_stride, head_stride = head * dim, dim
        batch_stride = seq * seq_stride
    elif len(shape) == 3:
        seq_stride, head_stride, _ = t.stride()
        batch_stride = 0
    else:
        batch_stride, seq_stride, head_stride, _ = t.stride()
    return (
        batch_stride if batch > 1 else 0,
        seq_stride if seq > 1 else 0,
        head_stride if head > 1 else 0,
    )


def _checking_values() -> bool:
    """Whether to check device integer arguments' values now: not when switched off
    (samattn.set_value_checks), nor while a CUDA graph is being captured, where the
    device-to-host copy is not allowed."""
    return _checks.value_checks_enabled() and not torch.cuda.is_current_stream_capturing()


def _host_values(tensors: list[torch.Tensor | None]) -> list[list[int] | None]:
    """The values of these device integer tensors as host lists (None stays None), read
    with one device-to-host copy."""
    present = [t.reshape(-1) for t in tensors if t is not None]
    flat = torch.cat(present).tolist() if present else []
    values: list[list[int] | None] = []
    start = 0
    for t in tensors:
        if t is None:
            values.append(None)
            continue
        values.append(flat[start : start + t.numel()])
        start += t.numel()
    return values


# Value checks that passed, by the bounds they were checked against and the tensors'
# identities: (weak references to the tensors, their version counters). An entry holds
# while every tensor is the same live object, unmodified by torch since (its version
# counter unchanged): the layers of a model pass the same cu_seqlens or cache_seqlens to
# every call of a step (and autograd to the backward), which then copy nothing to the host.
_VERIFIED_LIMIT = 64
_verified: OrderedDict[Hashable, tuple[tuple[weakref.ref | None, ...], tuple[int, ...]]] = (
    OrderedDict()
)
_verified_lock = threading.Lock()  # autograd runs backward calls on a thread of its own


def _checked_once(
    bounds: Hashable,
    tensors: list[torch.Tensor | None],
    check: Callable[[list[list[int] | None]], None],
) -> None:
    """check(values of `tensors`, read with one device-to-host copy) unless these same,
    unmodified tensors passed it against the same bounds before."""
    key = (bounds, tuple(None if t is None else id(t) for t in tensors))
    versions = tuple(-1 if t is None else t._version for t in tensors)
    with _verified_lock:
        entry = _verified.get(key)
        if (
            entry is not None
            and entry[1] == versions
            and all(r is None or r() is t for r, t in zip(entry[0], tensors))
        ):
            _verified.move_to_end(key)
            return
    check(_host_values(tensors))
    refs = tuple(None if t is None else weakref.ref(t) for t in tensors)
    with _verified_lock:
        _verified[key] = (refs, versions)
        _verified.move_to_end(key)
        if len(_verified) > _VERIFIED_LIMIT:
            _verified.popitem(last=False)


def _check_cu_seqlens_on_device(
    op: str | None,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    sizes: _checks.AttentionShape,
    max_seqlen_q: int,
    max_seqlen_k: int,
    block_table: torch.Tensor | None = None,
    page_size: int = 0,
    num_blocks: int = 0,
) -> None:
    """Bad offsets (or block table entries) would make the kernels read and write outside
    the tensors, and the library cannot read device memory: check them here (one small
    device-to-host copy), unless _checking_values() says not now."""
    op = op or "samattn.flash_attn_varlen_func"
    # Paged: cu_seqlens_k gives lengths only (each sequence's keys are in its pages).
    total_k = None if block_table is not None else sizes.seqlen_k

    def check(values: list[list[int] | None]) -> None:
        values_q, values_k, table = values
        _checks.cu_seqlens_values(
            op, "cu_seqlens_q", values_q, sizes.seqlen_q, max_seqlen_q, "max_seqlen_q"
        )
        _checks.cu_seqlens_values(
            op, "cu_seqlens_k", values_k, total_k, max_seqlen_k, "max_seqlen_k"
        )
        if block_table is not None:
            lengths = [end - start for start, end in zip(values_k, values_k[1:])]
            width = block_table.shape[1]
            _checks.paged_varlen_values(op, lengths, page_size, width, num_blocks, table)

    bounds = ("varlen", op, sizes.seqlen_q, total_k, max_seqlen_q, max_seqlen_k, page_size,
              num_blocks)  # fmt: skip
    _checked_once(bounds, [cu_seqlens_q, cu_seqlens_k, block_table], check)


# The forward leaves the backward's tensors (dout, dq, dk, dv and their strides) NULL / 0.
# Pointers are packed as integers, NULL as 0.
_NO_GRADIENTS = (0, 0, 0, 0) * 4
# The KV-cache fields (seqused_k ... num_splits), all off: 23 values.
_NO_KVCACHE = (0,) * 23
# The score-term fields (alibi_slopes, alibi_batch_stride, sinks, dsinks), all off.
_NO_TERMS = (0, 0, 0, 0)
# The attention-mask fields (attn_mask ... dmask), all off: 8 values.
_NO_MASK = (0,) * 8
_NO_DROPOUT = (0.0, 0, 0)
# The fp8 KV-cache fields (kv_fp8 ... v_scale_value): no fp8 cache, scales 1.0.
_NO_FP8 = (0, 0, 0, 0, 0, 1.0, 1.0)


def _dropout_fields(dropout_p: float, dropout_seed: torch.Tensor | None) -> tuple[float, int, int]:
    """The C dropout fields (dropout_p, reserved, seed pointer); the caller keeps the seed
    tensor alive."""
    if dropout_p == 0.0 or dropout_seed is None:
        return _NO_DROPOUT
    return (dropout_p, 0, dropout_seed.data_ptr())


def _fp8_fields(cache: torch.Tensor, k_scale: object, v_scale: object) -> tuple[int | float, ...]:
    """The seven fp8 KV-cache fields of the C arguments (kv_fp8, reserved, k_scale_ptr,
    v_scale_ptr, kv_scale_head_stride, k_scale_value, v_scale_value) for caches of
    cache's dtype, with their scales checked by _checks.kv_cache_fp8: _NO_FP8 unless the
    caches are fp8. A tensor scale goes by pointer (read in place: the caller keeps it
    alive), with head stride 1 when it holds one scale per KV head; a float by value, its
    pointer NULL (no device tensor per call); None is 1.0."""
    code = _checks.FP8_CODES.get(cache.dtype)
    if code is None:
        return _NO_FP8
    k_pointer = v_pointer = head_stride = 0
    k_value = v_value = 1.0
    if isinstance(k_scale, torch.Tensor):
        k_pointer, head_stride = k_scale.data_ptr(), int(k_scale.numel() > 1)
    elif k_scale is not None:
        k_value = float(k_scale)
    if isinstance(v_scale, torch.Tensor):
        v_pointer, head_stride = v_scale.data_ptr(), int(v_scale.numel() > 1)
    elif v_scale is not None:
        v_value = float(v_scale)
    return (code, 0, k_pointer, v_pointer, head_stride, k_value, v_value)


def _score_terms(
    alibi_slopes: torch.Tensor | None,
    sinks: torch.Tensor | None,
    dsinks: torch.Tensor | None = None,
) -> tuple[tuple[int, int, int, int], tuple[torch.Tensor, ...]]:
    """The four score-term fields of the C arguments, and the tensors they point to (kept
    alive until the launch). The library reads the slopes of batch entry b at
    alibi_slopes[b * alibi_batch_stride + h] and sinks[h]: their head dim is copied to a
    contiguous one unless it already is; (batch, nheads) slopes keep their batch stride
    (0 when broadcast), (nheads,) ones get 0. Checked by _checks.attention_terms first."""
    keep: tuple[torch.Tensor, ...] = ()
    alibi_ptr = alibi_stride = sinks_ptr = 0
    if alibi_slopes is not None:
        if alibi_slopes.stride(-1) != 1 and alibi_slopes.shape[-1] > 1:
            alibi_slopes = alibi_slopes.contiguous()
        if alibi_slopes.dim() == 2 and alibi_slopes.shape[0] > 1:
            alibi_stride = alibi_slopes.stride(0)
        alibi_ptr = alibi_slopes.data_ptr()
        keep += (alibi_slopes,)
    if sinks is not None:
        if sinks.stride(0) != 1 and sinks.shape[0] > 1:
            sinks = sinks.contiguous()
        sinks_ptr = sinks.data_ptr()
        keep += (sinks,)
    return (alibi_ptr, alibi_stride, sinks_ptr, _pointer(dsinks)), keep


def _mask_fields(
    attn_mask: torch.Tensor, sizes: _checks.AttentionShape, dmask: torch.Tensor | None = None
) -> tuple[tuple[int, ...], torch.Tensor]:
    """The eight attention-mask fields of the C arguments, and the tensor they point to
    (kept alive until the launch). The library reads element (b, h, i, j) at
    b * mask_batch_stride + h * mask_head_stride + i * mask_q_stride + j * mask_k_stride
    of a bool (keep) or float32 (additive) mask, the keys contiguous: a float mask of
    another dtype is converted as given, before broadcasting (a broadcast mask stays small),
    its broadcast dims read with stride 0; a mask whose keys are broadcast or strided is
    copied with contiguous keys. dmask: the backward's zeroed float32 (batch, nheads,
    seqlen_q, seqlen_k) gradient, or None. Checked by _checks.attention_mask first."""
    mask = attn_mask
    if mask.dtype is torch.bool:
        code = _lib.BOOL
    else:
        code = _lib.F32
        if mask.dtype is not torch.float32:
            mask = mask.float()
    if mask.dim() < 4:
        mask = mask[(None,) * (4 - mask.dim())]
    seqlen_k = sizes.seqlen_k
    if seqlen_k > 1 and (mask.shape[3] == 1 or mask.stride(3) != 1):
        mask = mask.expand(*mask.shape[:3], seqlen_k).contiguous()
    strides = mask.expand(sizes.batch, sizes.nheads, sizes.seqlen_q, seqlen_k).stride()
    return (mask.data_ptr(), code, 0, *strides, _pointer(dmask)), mask


def _mask_gradient(dmask: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
    """The gradient of attn_mask from the kernels' (batch, nheads, seqlen_q, seqlen_k)
    dmask: summed over the dims attn_mask broadcasts, in its shape and dtype."""
    shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
    return dmask.sum_to_size(shape).reshape(attn_mask.shape).to(attn_mask.dtype)


# The kernels run the score terms (ALiBi, sinks, masks) on 16-byte rows only: head dims
# that are multiples of 8 elements. Other head dims are padded with zeros to one.
_TERMS_HEAD_DIM_MULTIPLE = _VECTOR_BYTES // 2


def _pad_head_dim(t: torch.Tensor) -> torch.Tensor:
    """t with zero columns appended to its head dim, up to the next multiple of 8: q . k
    and the softmax are unchanged, and v's zero columns give zero output columns."""
    return torch.nn.functional.pad(t, (0, -t.shape[-1] % _TERMS_HEAD_DIM_MULTIPLE))


def _attention_args(
    op: str | None,
    sizes: _checks.AttentionShape,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    params: _checks.AttentionParams,
    gradients: tuple[torch.Tensor, ...] = (),
    kvcache: tuple[int, ...] | None = None,
    terms: tuple[int, int, int, int] = _NO_TERMS,
    mask: tuple[int, ...] = _NO_MASK,
    dropout: tuple[float, int, int] = _NO_DROPOUT,
    fp8: tuple[int | float, ...] = _NO_FP8,
) -> tuple[_lib.AttentionArgs, tuple[torch.Tensor, ...]]:
    """The C arguments of the forward, or of the backward when `gradients` holds
    (dout, dq, dk, dv); and the tensors they point to (q, k, v as the kernels read them,
    the contiguous offsets), to keep alive until the launch. `params`: the scalars (its
    tensors are the caller's to pass as fields, below). With `kvcache` (the 23
    KV-cache fields) k and v are caches, used in place as they are (checked by
    _cache_pointers); varlen offsets are then the caller's to check. `terms`: the four
    score-term fields (_score_terms; the caller keeps their tensors alive); `mask` the eight
    attention-mask fields (_mask_fields, likewise); `dropout` the three dropout fields
    (_dropout_fields); `fp8` the seven fp8 KV-cache fields (_fp8_fields; the caller keeps
    the scale tensors alive)."""
    q = _attention_operand(q)
    if kvcache is None:
        k, v = _attention_operand(k), _attention_operand(v)
    keep: tuple[torch.Tensor, ...] = (q, k, v)
    cu_q = cu_k = 0
    if sizes.varlen:
        cu_seqlens_q = cu_seqlens_q.contiguous()
        cu_seqlens_k = cu_seqlens_k.contiguous()
        if kvcache is None and _checking_values():
            _check_cu_seqlens_on_device(
                op, cu_seqlens_q, cu_seqlens_k, sizes, max_seqlen_q, max_seqlen_k
            )
        cu_q, cu_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
        keep += (cu_seqlens_q, cu_seqlens_k)
    else:
        max_seqlen_q = max_seqlen_k = 0
    if sizes.varlen:  # (nheads, total_q)
        lse_strides = (0, *lse.stride())
    else:  # (batch, nheads, seqlen_q)
        lse_strides = lse.stride()
    backward, deterministic = _NO_GRADIENTS, 0
    if gradients:
        backward = ()
        for t in gradients:
            backward += (t.data_ptr(), *_seq_head_strides(t))
        deterministic = int(params.deterministic)
    args = _lib.blank(_lib.AttentionArgs)
    _lib.ATTENTION_PACKER.pack_into(
        args, 0,
        ctypes.sizeof(args), _checks.DTYPE_CODES[q.dtype], _family.requested_family(),
        q.get_device(), int(params.causal),
        sizes.batch, sizes.nheads, sizes.nheads_k, sizes.seqlen_q, sizes.seqlen_k, sizes.headdim,
        cu_q, cu_k, max_seqlen_q, max_seqlen_k,
        q.data_ptr(), *_seq_head_strides(q),
        k.data_ptr(), *_seq_head_strides(k),
        v.data_ptr(), *_seq_head_strides(v),
        out.data_ptr(), *_seq_head_strides(out),
        lse.data_ptr(), *lse_strides,
        params.softmax_scale, params.softcap, params.window_left, params.window_right,
        *backward,
        deterministic, 0, _stream(q), 0, 0,
        *(kvcache or _NO_KVCACHE),
        *terms,
        *mask,
        *dropout,
        *fp8,
    )  # fmt: skip
    return args, keep


def flash_attn_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    params: _checks.AttentionParams,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    op: str | None = None,
    block_table: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    want_lse: bool = True,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, softmax_lse) of FlashAttention on the GPU; see samattn.flash_attn_func.
    `params`: the call's scalars, score terms (alibi_slopes and sinks, float32, None = off)
    and dropout (dropout_p > 0: dropout_seed is the call's seed, _dropout.new_seed).
    Fixed length without cu_seqlens_q/k, varlen with them. `op` names the public function
    in error messages. With block_table (paged prefill, varlen only) k and v are paged
    caches (num_blocks, page_size, nheads_k, headdim), of q's dtype, or fp8 with k_scale
    and v_scale (None, a float or a float32 tensor: _checks.kv_cache_fp8). attn_mask: None,
    or a bool / float mask broadcastable to (batch, nheads, seqlen_q, seqlen_k), fixed
    length only. With score terms, a mask or dropout, a head dim that is not a multiple of
    8 runs padded with zeros to one (the kernels run the terms on 16-byte rows).
    want_lse=False: the caller discards softmax_lse (inference), so a prepared call
    allocates none and the kernels write none (returned as None; the first call of a
    signature still makes one)."""
    key = None
    alibi_slopes, sinks, dropout_p = params.alibi_slopes, params.sinks, params.dropout_p
    plain = cu_seqlens_q is None and block_table is None and attn_mask is None and dropout_p == 0.0
    if plain and alibi_slopes is None and sinks is None and cu_seqlens_k is None:
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())  # read once: the key's too
        key = _attention_key(q, k, v, params, pointers)
        entry = _ATTENTION.get(key)
        if entry is not None:
            args, out, lse = _prepared_forward_args(_ATTENTION, entry, q, pointers, want_lse)
            _ATTENTION.run(key, entry, args, q)
            return out, lse
    sizes = _checks.attention_sizes(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, op, block_table,
        k_scale, v_scale,
    )  # fmt: skip
    terms, mask, dropout, fp8 = _NO_TERMS, _NO_MASK, _NO_DROPOUT, _NO_FP8
    if alibi_slopes is not None or sinks is not None or attn_mask is not None or dropout_p:
        name = _op_name(op, sizes)
        _checks.attention_extras(name, params, sizes, q)
        if attn_mask is not None:
            _checks.attention_mask(name, attn_mask, sizes, q)
        if sizes.headdim % _TERMS_HEAD_DIM_MULTIPLE:
            out, lse = flash_attn_forward(
                _pad_head_dim(q), _pad_head_dim(k), _pad_head_dim(v), params, cu_seqlens_q,
                cu_seqlens_k, max_seqlen_q, max_seqlen_k, op, block_table, attn_mask,
                k_scale=k_scale, v_scale=v_scale,
            )  # fmt: skip
            return out[..., : sizes.headdim].contiguous(), lse
        # _keep_terms, _keep_mask: alive until the launch is queued.
        terms, _keep_terms = _score_terms(alibi_slopes, sinks)
        if attn_mask is not None:
            mask, _keep_mask = _mask_fields(attn_mask, sizes)
        if dropout_p:
            dropout = _dropout_fields(dropout_p, params.dropout_seed)
    # out has q's shape (fixed length and varlen alike) and is contiguous.
    out = torch.empty_like(q) if q.is_contiguous() else q.new_empty(sizes.out_shape)
    lse = q.new_empty(sizes.lse_shape, dtype=torch.float32)
    if out.numel() == 0:
        return out, lse
    kvcache = keep_table = None
    if block_table is not None:
        _cache_pointers(op or "samattn.flash_attn_varlen_func", {"k": k, "v": v})
        keep_table = _rows_contiguous(block_table)
        num_blocks, page_size = k.shape[0], k.shape[1]
        if _checking_values():
            _check_cu_seqlens_on_device(
                op, cu_seqlens_q, cu_seqlens_k, sizes, max_seqlen_q, max_seqlen_k,
                keep_table, page_size, num_blocks,
            )  # fmt: skip
        kvcache = (
            0, 0, 0, keep_table.data_ptr(), keep_table.stride(0), keep_table.shape[1],
            page_size, num_blocks, *_NO_KVCACHE[8:],
        )  # fmt: skip
        fp8 = _fp8_fields(k, k_scale, v_scale)
    args, keep = _attention_args(
        op, sizes, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        params, kvcache=kvcache, terms=terms, mask=mask, dropout=dropout, fp8=fp8,
    )  # fmt: skip
    # Decode-shaped problems (the query heads of a KV head fit one 64-row tile) split the
    # keys over CTAs, and the sm90 family maps a mask's tiles, both in a workspace.
    decode = not sizes.varlen and sizes.seqlen_q * (sizes.nheads // max(sizes.nheads_k, 1)) <= 64
    _prepared.run_with_workspace(
        "samattn_attention_forward", "samattn_attention_forward_workspace_size", args, q,
        expected=decode or attn_mask is not None,
    )  # fmt: skip
    if key is not None and keep[0] is q and keep[1] is k and keep[2] is v:  # read in place
        _ATTENTION.put(key, args, out.shape, lse.shape)
    return out, lse


_ATTENTION = _prepared.Calls(
    _lib.AttentionArgs, "samattn_attention_forward", "samattn_attention_forward_workspace_size"
)


def _prepared_forward_args(
    calls: _prepared.Calls[_lib.AttentionArgs],
    entry: _prepared.Entry,
    q: torch.Tensor,
    pointers: tuple[int, int, int],
    want_lse: bool,
) -> tuple[_lib.AttentionArgs, torch.Tensor, torch.Tensor | None]:
    """A prepared forward's struct with this call's q, k, v (`pointers`), stream and new
    outputs (out; softmax_lse only when wanted, else NULL, which the kernels skip); (args,
    out, lse)."""
    out = torch.empty_like(q) if q.is_contiguous() else q.new_empty(entry.out_shape)
    args = calls.args(entry)
    args.q, args.k, args.v = pointers
    args.o, args.stream = out.data_ptr(), _stream(q)
    lse = None
    if want_lse:
        lse = _prepared.empty(q, entry.aux_shape, torch.float32)
        args.lse = lse.data_ptr()
    else:
        args.lse = None  # its strides stay valid for the next call that wants it
    return args, out, lse


def _attention_key(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    params: _checks.AttentionParams,
    pointers: tuple[int, int, int],
) -> tuple:
    """The prepared-call key of a fixed-length forward without score terms, dropout or mask:
    the layouts and the params (its tensors None). The 16-byte residues of the pointers
    (q's, k's, v's) are in it: they decide whether a strided view is read in place
    (_attention_operand)."""
    q_pointer, k_pointer, v_pointer = pointers
    return (
        q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype,
        v.dtype, q.get_device(), k.get_device(), v.get_device(), q_pointer % _VECTOR_BYTES,
        k_pointer % _VECTOR_BYTES, v_pointer % _VECTOR_BYTES, params,
        _family.thread_state.family,
    )  # fmt: skip


def _pointer(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _op_name(op: str | None, sizes: _checks.AttentionShape) -> str:
    """The public function to name in messages (op None: the op was called directly)."""
    if op is not None:
        return op
    return "samattn.flash_attn_varlen_func" if sizes.varlen else "samattn.flash_attn_func"


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """A 2-D integer table whose rows the library reads with a unit inner stride."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _cache_pointers(op: str, caches: dict[str, torch.Tensor]) -> None:
    """Caches are used in place: their pointers must allow 16-byte vectors (the layout
    was checked by _checks, which has no pointers on fake tensors)."""
    for name, t in caches.items():
        if t.data_ptr() % _VECTOR_BYTES != 0:
            raise _lib.ArgumentError(
                f"{op}: {name} starts at an address that is not 16-byte aligned (a view at an "
                "odd offset?); a KV cache is used in place, so it must allow 16-byte vectors"
            )


def flash_attn_kvcache(
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
    params: _checks.AttentionParams,
    rotary_interleaved: bool,
    num_splits: int,
    op: str = "samattn.flash_attn_with_kvcache",
    want_lse: bool = True,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, softmax_lse) of attention over a KV cache on the GPU, appending k and v into
    the caches in place first; see samattn.flash_attn_with_kvcache (whose arguments
    these are; `params` holds its normalized scalars and score terms, no dropout; k_scale
    and v_scale those of fp8 caches). want_lse=False: the caller discards softmax_lse, so
    a prepared call makes none (returned as None)."""
    tensors = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
               cache_batch_idx, cache_leftpad, block_table)  # fmt: skip
    alibi_slopes, sinks = params.alibi_slopes, params.sinks
    key = None
    if alibi_slopes is None and sinks is None and type(num_splits) is int:
        key = _kvcache_key(tensors, (params, rotary_interleaved, num_splits), k_scale, v_scale)
        entry = _KVCACHE.get(key) if key is not None else None
        if entry is not None:
            done = _prepared_kvcache(key, entry, op, tensors, want_lse, k_scale, v_scale)
            if done is not None:
                return done
    sizes = _checks.kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, num_splits, op, alibi_slopes, sinks, k_scale, v_scale,
    )  # fmt: skip
    out = torch.empty_like(q) if q.is_contiguous() else q.new_empty(sizes.out_shape)
    lse = q.new_empty(sizes.lse_shape, dtype=torch.float32)
    if out.numel() == 0 and sizes.seqlen_new == 0:
        return out, lse
    _cache_pointers(op, {"k_cache": k_cache, "v_cache": v_cache})
    given = (k, v, rotary_cos, rotary_sin, cache_leftpad, cache_batch_idx, block_table)
    given_seqlens = cache_seqlens
    seqlens_value = None
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        seqlens_value = operator.index(cache_seqlens)  # checked by _checks.kvcache
        cache_seqlens = _int_seqlens(q, sizes.batch, seqlens_value)
    ints = [cache_seqlens, cache_leftpad, cache_batch_idx]
    cache_seqlens, cache_leftpad, cache_batch_idx = (
        None if t is None else t.contiguous() for t in ints
    )
    if block_table is not None:
        block_table = _rows_contiguous(block_table)
    if _checking_values():
        _check_kvcache_values(
            op, sizes, cache_seqlens, seqlens_value, cache_leftpad, cache_batch_idx, block_table
        )
    new = (0,) * 8
    if k is not None:
        k, v = _attention_operand(k), _attention_operand(v)
        new = (k.data_ptr(), *_seq_head_strides(k), v.data_ptr(), *_seq_head_strides(v))
    rotary = (0, 0)
    if rotary_cos is not None:
        rotary_cos, rotary_sin = rotary_cos.contiguous(), rotary_sin.contiguous()
        rotary = (rotary_cos.data_ptr(), rotary_sin.data_ptr())
    table = (0, 0, 0)
    if block_table is not None:
        table = (block_table.data_ptr(), block_table.stride(0), block_table.shape[1])
    kvcache = (
        _pointer(cache_seqlens), _pointer(cache_leftpad), _pointer(cache_batch_idx), *table,
        sizes.page_size, sizes.kv_cache_batch, *new, sizes.seqlen_new, *rotary,
        sizes.rotary_dim, sizes.rotary_seqlen, int(rotary_interleaved), operator.index(num_splits),
    )  # fmt: skip
    shape = _checks.AttentionShape(
        sizes.batch, sizes.nheads, sizes.nheads_k, sizes.seqlen_q, sizes.capacity,
        sizes.headdim, varlen=False,
    )  # fmt: skip
    terms = _NO_TERMS
    if alibi_slopes is not None or sinks is not None:
        terms, _keep_terms = _score_terms(alibi_slopes, sinks)
    fp8 = _fp8_fields(k_cache, k_scale, v_scale)  # _NO_FP8 for 16-bit caches
    args, keep = _attention_args(
        op, shape, q, k_cache, v_cache, out, lse, None, None, 0, 0, params, kvcache=kvcache,
        terms=terms, fp8=fp8,
    )  # fmt: skip
    _prepared.run_with_workspace(
        "samattn_attention_forward", "samattn_attention_forward_workspace_size", args, q,
        expected=True,
    )  # fmt: skip
    used = (k, v, rotary_cos, rotary_sin, cache_leftpad, cache_batch_idx, block_table)
    # Cached only where every tensor was read in place (an int cache_seqlens' tensor is
    # made per call, see _int_seqlens), so the struct's strides are the signature's.
    in_place = (
        keep[0] is q
        and (seqlens_value is not None or cache_seqlens is given_seqlens)
        and all(a is b for a, b in zip(used, given))
    )
    if key is not None and in_place:
        _KVCACHE.put(key, args, out.shape, lse.shape, sizes)
    return out, lse


_KVCACHE = _prepared.Calls(
    _lib.AttentionArgs, "samattn_attention_forward", "samattn_attention_forward_workspace_size"
)


def _layout_key(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


def _scale_key(scale: object) -> object:
    """What of an fp8 cache's scale a prepared KV-cache call's key holds: its kind (None,
    float, or a tensor's layout: the value or pointer is each call's); False for what the
    full path must convert or refuse (an int, a bool, anything else)."""
    if scale is None:
        return None
    if type(scale) is float:
        return float
    if isinstance(scale, torch.Tensor):
        return (scale.shape, scale.stride(), scale.dtype, scale.get_device(), scale.requires_grad)
    return False


def _kvcache_key(
    tensors: tuple, scalars: tuple, k_scale: object = None, v_scale: object = None
) -> tuple | None:
    """The prepared-call key of a KV-cache call without score terms: every tensor's
    layout (None where absent; the caches' dtype says whether they are fp8), the 16-byte
    residues of the tensors _attention_operand may copy (q and the new k, v), the
    scalars, the kind of each fp8 scale (_scale_key) and the forced family. None (no
    prepared call) for what the full path must convert or refuse: a cache_seqlens that is
    neither a tensor, an int nor None, another argument that is neither a tensor nor None,
    a scale that is neither None, a float nor a tensor."""
    scales: tuple = ()
    if k_scale is not None or v_scale is not None:
        scales = (_scale_key(k_scale), _scale_key(v_scale))
        if scales[0] is False or scales[1] is False:
            return None
    q, k, v, seqlens = tensors[0], tensors[3], tensors[4], tensors[7]
    if type(seqlens) is int:
        seqlens_key: tuple | str | None = "int"
    elif seqlens is None or isinstance(seqlens, torch.Tensor):
        seqlens_key = _layout_key(seqlens)
    else:
        return None
    for t in tensors:
        if t is not None and t is not seqlens and not isinstance(t, torch.Tensor):
            return None  # the full path names it
    residues = (q.data_ptr() % _VECTOR_BYTES,)
    if k is not None:
        residues += (k.data_ptr() % _VECTOR_BYTES, v.data_ptr() % _VECTOR_BYTES)
    layouts = tuple(_layout_key(t) for i, t in enumerate(tensors) if i != 7)
    return (*layouts, seqlens_key, *residues, *scalars, *scales, _family.thread_state.family)


def _prepared_kvcache(
    key: tuple,
    entry: _prepared.Entry,
    op: str,
    tensors: tuple,
    want_lse: bool,
    k_scale: object = None,
    v_scale: object = None,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """A KV-cache call of a signature that ran before: its integer values (and float fp8
    scales) checked as on the full path, then one C call with this call's pointers and
    scales. None: leave this call to the full path (which raises what is wrong)."""
    (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
     cache_leftpad, block_table) = tensors  # fmt: skip
    scaled = k_scale is not None or v_scale is not None
    if scaled:  # the key holds their kind; a float's value is this call's
        for scale in (k_scale, v_scale):
            if type(scale) is float and not 0.0 < scale < math.inf:
                return None
    sizes: _checks.KVCacheShape = entry.sizes
    k_pointer, v_pointer = k_cache.data_ptr(), v_cache.data_ptr()
    if (k_pointer | v_pointer) % _VECTOR_BYTES:
        return None
    seqlens_value = None
    if type(cache_seqlens) is int:
        seqlens_value = cache_seqlens
        if not 0 <= seqlens_value <= sizes.capacity - sizes.seqlen_new:
            return None
        cache_seqlens = _int_seqlens(q, sizes.batch, seqlens_value)
    if _checking_values():
        _check_kvcache_values(
            op, sizes, cache_seqlens, seqlens_value, cache_leftpad, cache_batch_idx, block_table
        )
    pointers = (q.data_ptr(), k_pointer, v_pointer)
    args, out, lse = _prepared_forward_args(_KVCACHE, entry, q, pointers, want_lse)
    # The key says which optional tensors are present: the others' fields stay NULL.
    if cache_seqlens is not None:
        args.seqused_k = cache_seqlens.data_ptr()
    if cache_leftpad is not None:
        args.leftpad_k = cache_leftpad.data_ptr()
    if cache_batch_idx is not None:
        args.kv_batch_idx = cache_batch_idx.data_ptr()
    if block_table is not None:
        args.block_table = block_table.data_ptr()
    if k is not None:
        args.k_new, args.v_new = k.data_ptr(), v.data_ptr()
    if rotary_cos is not None:
        args.rotary_cos, args.rotary_sin = rotary_cos.data_ptr(), rotary_sin.data_ptr()
    if scaled:  # every call's own: a float's value, a tensor's pointer
        if type(k_scale) is float:
            args.k_scale_value = k_scale
        elif k_scale is not None:
            args.k_scale_ptr = k_scale.data_ptr()
        if type(v_scale) is float:
            args.v_scale_value = v_scale
        elif v_scale is not None:
            args.v_scale_ptr = v_scale.data_ptr()
    _KVCACHE.run(key, entry, args, q)
    return out, lse


# The tensor of the last int cache_seqlens per (device, stream, batch): every layer of a
# decode step passes the same int, so all but the first reuse one tensor (the kernels only
# read it). Keyed on the stream, so that a replaced tensor's memory is reused only behind
# the kernels that read it; not used while a CUDA graph is captured (the graph's memory).
_SEQLENS_CONSTANTS: dict[tuple[int, int, int], tuple[int, torch.Tensor]] = {}
_SEQLENS_CONSTANTS_LIMIT = 64


def _int_seqlens(q: torch.Tensor, batch: int, value: int) -> torch.Tensor:
    """cache_seqlens given as an int, as the (batch,) int32 tensor the kernels read."""
    if not q.is_cuda or torch.cuda.is_current_stream_capturing():
        return q.new_full((batch,), value, dtype=torch.int32)
    key = (q.get_device(), _stream(q), batch)
    cached = _SEQLENS_CONSTANTS.get(key)
    if cached is not None and cached[0] == value:
        return cached[1]
    if len(_SEQLENS_CONSTANTS) >= _SEQLENS_CONSTANTS_LIMIT:
        _SEQLENS_CONSTANTS.clear()
    tensor = q.new_full((batch,), value, dtype=torch.int32)
    _SEQLENS_CONSTANTS[key] = (value, tensor)
    return tensor


def _check_kvcache_values(
    op: str,
    sizes: _checks.KVCacheShape,
    cache_seqlens: torch.Tensor | None,
    seqlens_value: int | None,
    cache_leftpad: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    block_table: torch.Tensor | None,
) -> None:
    """The KV-cache call's integer values (kvcache_values), read with one device-to-host
    copy unless these same tensors passed before. seqlens_value: cache_seqlens was given as
    this int (checked already; its tensor is not read back)."""
    known = seqlens_value is not None
    tensors = [None if known else cache_seqlens, cache_leftpad, cache_batch_idx]

    def check(values: list[list[int] | None]) -> None:
        if known:
            values[0] = [seqlens_value] * sizes.batch
        _checks.kvcache_values(op, sizes, *values)

    _checked_once(("kvcache", op, sizes, seqlens_value), [*tensors, block_table], check)


def flash_attn_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    params: _checks.AttentionParams,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    op: str | None = None,
    attn_mask: torch.Tensor | None = None,
    dmask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dq, dk, dv, dsinks) of FlashAttention on the GPU: dq, dk, dv contiguous in q's
    dtype; dsinks (nheads,) float32, the gradient of the forward's sinks, when
    params.sinks is given (the forward's: its lse includes them), else None. `params`
    and attn_mask: the forward's (its deterministic asks for a bit-identical backward).
    dmask: None, or with a float attn_mask a zeroed float32 (batch, nheads, seqlen_q,
    seqlen_k) tensor that receives the gradient of every (batch, head, query, key) pair
    (flash_attn_masked_backward sums it to the mask's shape). Head dims that are not
    multiples of 8 run padded, as in the forward."""
    key = None
    alibi_slopes, sinks, dropout_p = params.alibi_slopes, params.sinks, params.dropout_p
    plain = cu_seqlens_q is None and cu_seqlens_k is None and attn_mask is None and dropout_p == 0.0
    if plain and alibi_slopes is None and sinks is None and dmask is None:
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())
        key = _attention_backward_key(dout, q, k, v, out, softmax_lse, params, pointers)
        entry = _ATTENTION_BACKWARD.get(key)
        if entry is not None:
            dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
            args = _ATTENTION_BACKWARD.args(entry)
            args.q, args.k, args.v = pointers
            args.o, args.lse, args.dout = out.data_ptr(), softmax_lse.data_ptr(), dout.data_ptr()
            args.dq, args.dk, args.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
            args.stream = _stream(q)
            _ATTENTION_BACKWARD.run(key, entry, args, q)
            return dq, dk, dv, None
    sizes = _checks.attention_sizes(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, op
    )
    _checks.flash_attn_backward(dout, out, softmax_lse, q, sizes)
    terms, mask, dsinks, dropout = _NO_TERMS, _NO_MASK, None, _NO_DROPOUT
    if alibi_slopes is not None or sinks is not None or attn_mask is not None or dropout_p:
        name = "samattn.flash_attn_backward"
        _checks.attention_extras(name, params, sizes, q)
        if attn_mask is not None:
            _checks.attention_mask(name, attn_mask, sizes, q)
        if sizes.headdim % _TERMS_HEAD_DIM_MULTIPLE:
            padded = (_pad_head_dim(t) for t in (dout, q, k, v, out))
            dq, dk, dv, dsinks = flash_attn_backward(
                *padded, softmax_lse, params, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                max_seqlen_k, op, attn_mask, dmask,
            )  # fmt: skip
            d = sizes.headdim
            return (
                dq[..., :d].contiguous(),
                dk[..., :d].contiguous(),
                dv[..., :d].contiguous(),
                dsinks,
            )
        if sinks is not None:
            # Written by the library (every head, deterministically): no zeroing.
            dsinks = q.new_empty((sizes.nheads,), dtype=torch.float32)
        terms, _keep_terms = _score_terms(alibi_slopes, sinks, dsinks)
        if attn_mask is not None:
            mask, _keep_mask = _mask_fields(attn_mask, sizes, dmask)
        if dropout_p:
            dropout = _dropout_fields(dropout_p, params.dropout_seed)
    # Varlen: the library leaves rows of dq, dk, dv outside every sequence alone; their
    # gradient is 0.
    if sizes.varlen:
        dq, dk, dv = q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)
    else:
        dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    if sizes.batch == 0 or sizes.nheads == 0 or (dq.numel() == 0 and dk.numel() == 0):
        if dsinks is not None:
            dsinks.zero_()  # no row: nothing flows into the sinks
        return dq, dk, dv, dsinks
    operands = (q, k, v, out, dout)
    out, dout = _attention_operand(out), _attention_operand(dout)
    args, keep = _attention_args(
        op, sizes, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, params, (dout, dq, dk, dv), terms=terms, mask=mask, dropout=dropout,
    )  # fmt: skip
    library = _lib.lib()
    args_ref = ctypes.byref(args)
    needed = ctypes.c_int64(0)
    _lib.check(library.samattn_attention_backward_workspace_size(args_ref, ctypes.byref(needed)))
    # From torch's caching allocator: stream-ordered, capturable in CUDA graphs, and
    # 512-byte aligned. The library zeroes what it needs on the stream.
    workspace = q.new_empty(max(needed.value, 1), dtype=torch.uint8)
    args.workspace, args.workspace_bytes = workspace.data_ptr(), needed.value
    _lib.check(library.samattn_attention_backward(args_ref, _lib.family_out()))
    if key is not None and all(a is b for a, b in zip((*keep[:3], out, dout), operands)):
        _ATTENTION_BACKWARD.put(key, args, q.shape)  # every operand read in place
    return dq, dk, dv, dsinks


_ATTENTION_BACKWARD = _prepared.Calls(
    _lib.AttentionArgs, "samattn_attention_backward", "samattn_attention_backward_workspace_size"
)


def _attention_backward_key(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    params: _checks.AttentionParams,
    pointers: tuple[int, int, int],
) -> tuple:
    """The prepared-call key of a fixed-length backward without score terms or mask: the
    forward's key (params, deterministic included) with dout, out and softmax_lse added."""
    return (
        *_attention_key(q, k, v, params, pointers),
        dout.shape, dout.stride(), dout.dtype, dout.get_device(), dout.data_ptr() % _VECTOR_BYTES,
        out.shape, out.stride(), out.dtype, out.get_device(), out.data_ptr() % _VECTOR_BYTES,
        softmax_lse.shape, softmax_lse.stride(), softmax_lse.dtype, softmax_lse.get_device(),
    )  # fmt: skip


def flash_attn_masked_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    attn_mask: torch.Tensor,
    params: _checks.AttentionParams,
    mask_grad: bool = False,
    op: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dq, dk, dv, dsinks, dmask) of fixed-length attention under attn_mask on the GPU:
    flash_attn_backward's four, and with mask_grad (a float mask only) the gradient of
    attn_mask, in its shape and dtype, else None. `params`: the forward's."""
    dmask = None
    if mask_grad:  # checked in the fake's order, before dmask is allocated
        sizes = _checks.attention_sizes(q, k, v, None, None, 0, 0, op)
        _checks.flash_attn_backward(dout, out, softmax_lse, q, sizes)
        _checks.attention_mask(op or "samattn.flash_attn_backward", attn_mask, sizes, q, grad=True)
        shape = (sizes.batch, sizes.nheads, sizes.seqlen_q, sizes.seqlen_k)
        # The library writes the gradient of the pairs it visits; the others (outside the
        # causal mask or the window, rows without keys) keep this zero.
        dmask = q.new_zeros(shape, dtype=torch.float32)
    dq, dk, dv, dsinks = flash_attn_backward(
        dout, q, k, v, out, softmax_lse, params, op=op, attn_mask=attn_mask, dmask=dmask
    )
    if dmask is not None:
        dmask = _mask_gradient(dmask, attn_mask)
    return dq, dk, dv, dsinks, dmask
