"""CUDA implementations of the samattn ops: fill the C argument structs and call libsamattn.

Outputs are allocated here by torch (the library never allocates); kernels run on torch's
current stream of the tensors' device.
"""

from __future__ import annotations

import ctypes

import torch

from . import _checks, _family, _lib


def _operand(t: torch.Tensor) -> torch.Tensor:
    """A or B as the kernels take it: either of its two last strides must be 1.

    Transposed views (``.t()``, ``.mT``) qualify as they are, so they cost no copy.
    """
    if t.stride(-1) == 1 or t.stride(-2) == 1:
        return t
    return t.contiguous()


def _matrix_strides(t: torch.Tensor, batch: int) -> tuple[int, int, int]:
    """(batch, row, col) element strides of a 2-D or 3-D operand; 0 where it broadcasts."""
    batch_stride = t.stride(0) if t.dim() == 3 and t.shape[0] == batch else 0
    return batch_stride, t.stride(-2), t.stride(-1)


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def _gemm_args(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    alpha: float,
    beta: float,
    sizes: _checks.GemmShape,
    out_ptr: int,
) -> _lib.GemmArgs:
    """The C arguments of D = alpha * a @ b + beta * c, D contiguous at out_ptr."""
    args = _lib.GemmArgs()
    args.dtype = _checks.DTYPE_CODES[a.dtype]
    args.family = _family.requested_family()
    args.device = a.device.index if a.device.index is not None else 0
    args.allow_tf32 = int(torch.get_float32_matmul_precision() != "highest")
    args.batch, args.m, args.n, args.k = sizes.batch, sizes.m, sizes.n, sizes.k
    args.a = a.data_ptr()
    args.a_batch_stride, args.a_row_stride, args.a_col_stride = _matrix_strides(a, sizes.batch)
    args.b = b.data_ptr()
    args.b_batch_stride, args.b_row_stride, args.b_col_stride = _matrix_strides(b, sizes.batch)
    if c is not None and beta != 0.0:
        expanded = c.expand(sizes.out_shape)
        args.c = expanded.data_ptr()
        strides = expanded.stride()
        args.c_batch_stride = strides[0] if len(strides) == 3 else 0
        args.c_row_stride, args.c_col_stride = strides[-2], strides[-1]
    args.d = out_ptr
    args.d_batch_stride = sizes.m * sizes.n
    args.d_row_stride, args.d_col_stride = sizes.n, 1
    args.alpha, args.beta = alpha, beta
    return args


def gemm(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, alpha: float, beta: float
) -> torch.Tensor:
    """D = alpha * a @ b + beta * c on the GPU; see samattn.gemm."""
    sizes = _checks.gemm(a, b, c, alpha, beta)
    out = torch.empty(sizes.out_shape, dtype=a.dtype, device=a.device)
    if out.numel() == 0:
        return out
    a = _operand(a)
    b = _operand(b)
    args = _gemm_args(a, b, c, alpha, beta, sizes, out.data_ptr())
    args.stream = _stream(a.device)
    library = _lib.lib()
    needed = ctypes.c_int64(0)
    _lib.check(library.samattn_gemm_workspace_size(ctypes.byref(args), ctypes.byref(needed)))
    workspace = None
    if needed.value > 0:
        # From torch's caching allocator, so it is cheap, stream-ordered and
        # capturable in CUDA graphs; freed when the kernel is done with it.
        workspace = torch.empty(needed.value, dtype=torch.uint8, device=a.device)
        args.workspace, args.workspace_bytes = workspace.data_ptr(), needed.value
    family = ctypes.c_int32(_lib.FAMILY_AUTO)
    _lib.check(library.samattn_gemm(ctypes.byref(args), ctypes.byref(family)))
    _lib.set_last_family(family.value)
    return out


def gemm_plan(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> tuple[str, str]:
    """(family, configuration) samattn.gemm would use for these CUDA tensors (no launch).

    Honours the forced family (samattn.use_family / SAMATTN_FAMILY) and torch's fp32
    matmul precision like samattn.gemm. Assumes a contiguous output, as gemm allocates.
    """
    sizes = _checks.gemm(a, b, c, alpha, beta)
    a = _operand(a)
    b = _operand(b)
    # A freshly allocated output is at least 16-byte aligned: stand in 256.
    args = _gemm_args(a, b, c, alpha, beta, sizes, 256)
    props = _lib.device_properties(args.device)
    return _lib.gemm_plan(args, props["compute_capability"], props["sm_count"])


def _run_softmax(
    function_name: str,
    view: _checks.SoftmaxShape,
    x: torch.Tensor,
    dy: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    args = _lib.SoftmaxArgs()
    args.dtype = _checks.DTYPE_CODES[x.dtype]
    args.family = _family.requested_family()
    args.device = x.device.index
    args.outer, args.dim, args.inner = view.outer, view.dim, view.inner
    args.x = x.data_ptr()
    args.dy = dy.data_ptr() if dy is not None else None
    args.out = out.data_ptr()
    args.stream = _stream(x.device)
    family = ctypes.c_int32(_lib.FAMILY_AUTO)
    function = getattr(_lib.lib(), function_name)
    _lib.check(function(ctypes.byref(args), ctypes.byref(family)))
    _lib.set_last_family(family.value)


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax of x along dim on the GPU; see samattn.softmax."""
    view = _checks.softmax(x, dim)
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if y.numel() > 0:
        _run_softmax("samattn_softmax_forward", view, x, None, y)
    return y


def softmax_backward(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    """dx = y * (dy - sum(dy * y, dim)) on the GPU, from the forward output y."""
    view = _checks.softmax_backward(y, dy, dim)
    y = y.contiguous()
    dy = dy.contiguous()
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    if dx.numel() > 0:
        _run_softmax("samattn_softmax_backward", view, y, dy, dx)
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
    if t.stride(-1) != 1:
        return t.contiguous()
    vector = _VECTOR_BYTES // t.element_size()
    if t.shape[-1] % vector != 0:
        return t
    ok = t.data_ptr() % _VECTOR_BYTES == 0 and all(
        s % vector == 0 for size, s in zip(t.shape[:-1], t.stride()[:-1]) if size > 1
    )
    return t if ok else t.contiguous()


def _seq_head_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, seq, head) element strides of a 4-D (batch, seq, head, dim) or 3-D packed
    (total, head, dim) tensor; 0 for a mode of size 1 (never stepped over), and batch 0
    for a packed tensor."""
    sizes, strides = t.shape[:-1], t.stride()[:-1]
    if t.dim() == 3:
        sizes, strides = (1, *sizes), (0, *strides)
    return tuple(s if n > 1 else 0 for n, s in zip(sizes, strides))


def _check_cu_seqlens_on_device(
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    sizes: _checks.AttentionShape,
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> None:
    """Bad offsets would make the kernels read and write outside the tensors, and the library
    cannot read device memory: check them here (one small device-to-host copy). Skipped while
    a CUDA graph is being captured, where a copy is not allowed."""
    if torch.cuda.is_current_stream_capturing():
        return
    op = "samattn.flash_attn_varlen_func"
    both = torch.cat([cu_seqlens_q, cu_seqlens_k]).tolist()
    values_q, values_k = both[: sizes.batch + 1], both[sizes.batch + 1 :]
    _checks.cu_seqlens_values(
        op, "cu_seqlens_q", values_q, sizes.seqlen_q, max_seqlen_q, "max_seqlen_q"
    )
    _checks.cu_seqlens_values(
        op, "cu_seqlens_k", values_k, sizes.seqlen_k, max_seqlen_k, "max_seqlen_k"
    )


def _attention_sizes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> _checks.AttentionShape:
    if cu_seqlens_q is None or cu_seqlens_k is None:
        return _checks.flash_attn(q, k, v)
    return _checks.flash_attn_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
    )


def _attention_args(
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
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
) -> tuple[_lib.AttentionArgs, tuple[torch.Tensor, ...]]:
    """The C arguments shared by the forward and the backward, and the tensors they point
    to (q, k, v as the kernels read them, the contiguous offsets), to keep alive."""
    q, k, v = (_attention_operand(t) for t in (q, k, v))
    args = _lib.AttentionArgs()
    args.dtype = _checks.DTYPE_CODES[q.dtype]
    args.family = _family.requested_family()
    args.device = q.device.index if q.device.index is not None else 0
    args.causal = int(causal)
    args.batch, args.nheads, args.nheads_k = sizes.batch, sizes.nheads, sizes.nheads_k
    args.seqlen_q, args.seqlen_k, args.headdim = sizes.seqlen_q, sizes.seqlen_k, sizes.headdim
    keep: tuple[torch.Tensor, ...] = (q, k, v)
    if sizes.varlen:
        cu_seqlens_q = cu_seqlens_q.contiguous()
        cu_seqlens_k = cu_seqlens_k.contiguous()
        _check_cu_seqlens_on_device(cu_seqlens_q, cu_seqlens_k, sizes, max_seqlen_q, max_seqlen_k)
        args.cu_seqlens_q, args.cu_seqlens_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
        args.max_seqlen_q, args.max_seqlen_k = max_seqlen_q, max_seqlen_k
        keep += (cu_seqlens_q, cu_seqlens_k)
    args.q = q.data_ptr()
    args.q_batch_stride, args.q_seq_stride, args.q_head_stride = _seq_head_strides(q)
    args.k = k.data_ptr()
    args.k_batch_stride, args.k_seq_stride, args.k_head_stride = _seq_head_strides(k)
    args.v = v.data_ptr()
    args.v_batch_stride, args.v_seq_stride, args.v_head_stride = _seq_head_strides(v)
    args.o = out.data_ptr()
    args.o_batch_stride, args.o_seq_stride, args.o_head_stride = _seq_head_strides(out)
    args.lse = lse.data_ptr()
    if sizes.varlen:  # (nheads, total_q)
        args.lse_batch_stride, args.lse_head_stride, args.lse_seq_stride = 0, *lse.stride()
    else:  # (batch, nheads, seqlen_q)
        args.lse_batch_stride, args.lse_head_stride, args.lse_seq_stride = lse.stride()
    args.softmax_scale = softmax_scale
    args.softcap = softcap
    args.window_left, args.window_right = window_left, window_right
    args.stream = _stream(q.device)
    return args, keep


def flash_attn_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, softmax_lse) of FlashAttention on the GPU; see samattn.flash_attn_func."""
    sizes = _attention_sizes(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    out = torch.empty(sizes.out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(sizes.lse_shape, dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    args, _keep = _attention_args(
        sizes, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, causal, window_left, window_right, softcap,
    )  # fmt: skip
    family = ctypes.c_int32(_lib.FAMILY_AUTO)
    _lib.check(_lib.lib().samattn_attention_forward(ctypes.byref(args), ctypes.byref(family)))
    _lib.set_last_family(family.value)
    return out, lse


def flash_attn_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of FlashAttention on the GPU, contiguous, in q's dtype."""
    sizes = _attention_sizes(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    _checks.flash_attn_backward(dout, out, softmax_lse, q, sizes)
    # Varlen: the library leaves rows of dq, dk, dv outside every sequence alone; their
    # gradient is 0.
    empty_batch = sizes.batch == 0 or sizes.nheads == 0
    dq = (torch.zeros if sizes.varlen else torch.empty)(q.shape, dtype=q.dtype, device=q.device)
    dk = (torch.zeros if sizes.varlen else torch.empty)(k.shape, dtype=k.dtype, device=k.device)
    dv = (torch.zeros if sizes.varlen else torch.empty)(v.shape, dtype=v.dtype, device=v.device)
    if empty_batch or (dq.numel() == 0 and dk.numel() == 0):
        return dq, dk, dv
    out, dout = _attention_operand(out), _attention_operand(dout)
    args, _keep = _attention_args(
        sizes, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
    )  # fmt: skip
    args.dout = dout.data_ptr()
    args.dout_batch_stride, args.dout_seq_stride, args.dout_head_stride = _seq_head_strides(dout)
    for name, grad in (("dq", dq), ("dk", dk), ("dv", dv)):
        setattr(args, name, grad.data_ptr())
        strides = _seq_head_strides(grad)
        for mode, stride in zip(("batch", "seq", "head"), strides):
            setattr(args, f"{name}_{mode}_stride", stride)
    args.deterministic = int(deterministic)
    library = _lib.lib()
    needed = ctypes.c_int64(0)
    _lib.check(
        library.samattn_attention_backward_workspace_size(ctypes.byref(args), ctypes.byref(needed))
    )
    # From torch's caching allocator: stream-ordered, capturable in CUDA graphs, and
    # 512-byte aligned. The library zeroes what it needs on the stream.
    workspace = torch.empty(max(needed.value, 1), dtype=torch.uint8, device=q.device)
    args.workspace, args.workspace_bytes = workspace.data_ptr(), needed.value
    family = ctypes.c_int32(_lib.FAMILY_AUTO)
    _lib.check(library.samattn_attention_backward(ctypes.byref(args), ctypes.byref(family)))
    _lib.set_last_family(family.value)
    return dq, dk, dv
