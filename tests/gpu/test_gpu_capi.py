"""The C ABI called directly on buffers the test owns.

Python's samattn.gemm / softmax allocate their outputs, so these tests go
one level down: each output lives in a NaN-filled buffer with guard elements
around it (and, for GEMM, between rows and batches: padded and transposed D
strides). Every output element must be written and correct; every other
element of the buffer must still be NaN afterwards (no stray writes). The
structs are samattn._lib's mirror of cpp/include/samattn/samattn.h.
"""

from __future__ import annotations

import ctypes

import pytest
import torch
from gpu_checks import (
    COMPLETE_FAMILIES,
    DEVICE,
    GEMM_MODES,
    UNIT_ROUNDOFF,
    assert_close_to_reference,
    assert_cuda_healthy,
    assert_softmax_close,
    gemm_floor,
    randn,
)
from reference import tf32_matmul

from samattn import _lib

DTYPE_CODES = {torch.float16: _lib.F16, torch.bfloat16: _lib.BF16, torch.float32: _lib.F32}
GemmArgs, SoftmaxArgs = _lib.GemmArgs, _lib.SoftmaxArgs


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    return _lib.lib()


def _call(lib, name: str, args) -> tuple[int, int, str]:
    """(status, family code that ran, last error message)."""
    used = ctypes.c_int32(-1)
    status = getattr(lib, name)(ctypes.byref(args), ctypes.byref(used))
    message = _lib.last_error() if status != _lib.OK else ""
    family = _lib.FAMILY_NAMES.get(args.family)
    if status == _lib.UNSUPPORTED and family and family not in COMPLETE_FAMILIES:
        pytest.skip(f"{family}: {message}")
    return status, used.value, message


def _family_code(family: str) -> int:
    return _lib.FAMILY_CODES[family]


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


class GuardedOutput:
    """A strided view inside a NaN-filled buffer with `guard` spare elements each side."""

    def __init__(self, size, stride, dtype, guard: int):
        span = 1 + sum((s - 1) * st for s, st in zip(size, stride))
        self.buffer = torch.full((guard + span + guard,), float("nan"), dtype=dtype, device=DEVICE)
        self.view = self.buffer.as_strided(size, stride, guard)
        self.owned = torch.zeros(self.buffer.shape, dtype=torch.bool, device=DEVICE)
        self.owned.as_strided(size, stride, guard).fill_(True)

    def assert_no_stray_writes(self, what: str) -> None:
        stray = ~self.owned & ~self.buffer.isnan()
        assert not stray.any(), f"{what}: {int(stray.sum())} elements written outside the output"


def _set_matrix(args: GemmArgs, name: str, x: torch.Tensor | None) -> None:
    if x is None:
        return
    batch_stride = x.stride(0) if x.dim() == 3 else 0
    setattr(args, name, x.data_ptr())
    setattr(args, f"{name}_batch_stride", batch_stride)
    setattr(args, f"{name}_row_stride", x.stride(-2))
    setattr(args, f"{name}_col_stride", x.stride(-1))


def _gemm_args(family, dtype, tf32, a, b, c, d, alpha, beta) -> GemmArgs:
    args = GemmArgs(
        dtype=DTYPE_CODES[dtype],
        family=_family_code(family),
        device=torch.cuda.current_device(),
        allow_tf32=int(tf32),
        batch=d.shape[0],
        m=d.shape[1],
        n=d.shape[2],
        k=a.shape[-1],
        alpha=alpha,
        beta=beta,
        stream=_stream(),
    )
    for name, x in zip("abcd", (a, b, c, d)):
        _set_matrix(args, name, x)
    return args


# D layouts as (batch, row, col) strides for a (batch, m, n) output. Padding by 3 or 5
# elements leaves rows unaligned (no TMA: sm90 hands those to sm80); by 8, 16-byte aligned.
D_LAYOUTS = {
    "row_major_padded": lambda m, n: ((n + 3) * m + 5, n + 3, 1),
    "column_major_padded": lambda m, n: ((m + 5) * n + 2, 1, m + 5),
    "row_major_padded_8": lambda m, n: ((n + 8) * m + 16, n + 8, 1),
    "column_major_padded_8": lambda m, n: ((m + 8) * n + 8, 1, m + 8),
}


def _with_workspace(lib, args: GemmArgs) -> torch.Tensor | None:
    """Give args the device workspace samattn_gemm_workspace_size asks for (kept alive by
    the returned tensor)."""
    needed = ctypes.c_int64(-1)
    if lib.samattn_gemm_workspace_size(ctypes.byref(args), ctypes.byref(needed)) != _lib.OK:
        return None  # samattn_gemm reports the same error (or the test skips)
    assert needed.value >= 0
    if needed.value == 0:
        return None
    workspace = torch.empty(needed.value, dtype=torch.uint8, device=DEVICE)
    args.workspace, args.workspace_bytes = workspace.data_ptr(), needed.value
    return workspace


def _expected_family(args: GemmArgs) -> int:
    """The family samattn_gemm must report: the forced one, or sm80 where sm90 hands over."""
    props = _lib.device_properties(args.device)
    family, _ = _lib.gemm_plan(args, props["compute_capability"], props["sm_count"])
    return _family_code(family)


@pytest.mark.parametrize("mode", GEMM_MODES)
@pytest.mark.parametrize("d_layout", D_LAYOUTS)
@pytest.mark.parametrize("c_kind", ["none", "full", "row_broadcast"])
@pytest.mark.parametrize(
    "shape", [(1, 127, 65, 129), (3, 7, 1000, 33), (2, 64, 128, 256), (2, 200, 392, 64)]
)
def test_capi_gemm_writes_exactly_d(lib, family, mode, d_layout, c_kind, shape):
    batch, m, n, k = shape
    dtype, precision = GEMM_MODES[mode]
    torch.set_float32_matmul_precision(precision)
    tf32 = mode == "tf32"
    a = randn(batch, m, k, dtype=dtype)
    b = randn(k, n, dtype=dtype).expand(batch, k, n)  # batch stride 0: B shared
    c, alpha, beta = None, 1.0, 0.0
    if c_kind == "full":
        c, alpha, beta = randn(batch, m, n, dtype=dtype), 0.5, 2.0
    elif c_kind == "row_broadcast":  # one row, stride 0 over rows and batches
        c, alpha, beta = randn(n, dtype=dtype).expand(batch, m, n), 1.0, -1.0
    out = GuardedOutput((batch, m, n), D_LAYOUTS[d_layout](m, n), dtype, guard=97)

    args = _gemm_args(family, dtype, tf32, a, b, c, out.view, alpha, beta)
    workspace = _with_workspace(lib, args)
    status, used, message = _call(lib, "samattn_gemm", args)
    assert status == _lib.OK, f"status {status}: {message}"
    assert used == _expected_family(args)
    del workspace
    torch.cuda.synchronize()

    ref = alpha * (a.double() @ b.double())
    baseline = alpha * (tf32_matmul(a, b) if tf32 else torch.matmul(a, b).float())
    if c is not None:
        ref = ref + beta * c.double()
        baseline = baseline + beta * c.float()
    what = f"{family} {mode} D {d_layout} C {c_kind}"
    floor = gemm_floor(dtype, k, tf32)
    assert_close_to_reference(out.view, ref, baseline.to(dtype), floor, what)
    out.assert_no_stray_writes(what)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("guard", [256, 129], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("shape", [(3, 1000, 1), (2, 4097, 1), (4, 129, 33), (65536, 7, 1)])
def test_capi_softmax_writes_exactly_out(lib, family, dtype, guard, shape):
    if "softmax" not in _lib.built_ops():
        pytest.skip("this build has no softmax ops (SAMATTN_OPS)")
    outer, dim, inner = shape
    x = randn(outer, dim, inner, dtype=dtype, scale=3.0)
    grad_y = randn(outer, dim, inner, dtype=dtype)
    y_ref = torch.softmax(x.double(), dim=1)

    # Forward: y = softmax(x) over the middle mode.
    out = GuardedOutput(x.shape, x.stride(), dtype, guard)
    args = SoftmaxArgs(
        dtype=DTYPE_CODES[dtype],
        family=_family_code(family),
        device=torch.cuda.current_device(),
        outer=outer,
        dim=dim,
        inner=inner,
        x=x.data_ptr(),
        out=out.view.data_ptr(),
        stream=_stream(),
    )
    status, used, message = _call(lib, "samattn_softmax_forward", args)
    assert status == _lib.OK and used == _family_code(family), message
    torch.cuda.synchronize()
    what = f"{family} {dtype} forward {shape} guard {guard}"
    assert_softmax_close(out.view, y_ref, torch.softmax(x, dim=1), what)
    out.assert_no_stray_writes(what)

    # Backward from torch's y: dx = y * (dy - sum(dy * y)).
    y = torch.softmax(x, dim=1)
    y64 = y.double()
    dx_ref = y64 * (grad_y.double() - (grad_y.double() * y64).sum(1, keepdim=True))
    baseline = torch._softmax_backward_data(grad_y, y, 1, dtype)
    dx = GuardedOutput(x.shape, x.stride(), dtype, guard)
    args.x, args.dy, args.out = y.data_ptr(), grad_y.data_ptr(), dx.view.data_ptr()
    status, used, message = _call(lib, "samattn_softmax_backward", args)
    assert status == _lib.OK and used == _family_code(family), message
    torch.cuda.synchronize()
    what = f"{family} {dtype} backward {shape} guard {guard}"
    floor = 1e-5 if dtype == torch.float32 else 0.5 * UNIT_ROUNDOFF[dtype]
    assert_close_to_reference(dx.view, dx_ref, baseline, floor, what)
    dx.assert_no_stray_writes(what)


def test_capi_device_out_of_range(lib, family):
    """A device ordinal past the last GPU is an error status, not a CUDA fault.
    (tests/cpu/test_capi.py covers the other invalid arguments, on any machine.)"""
    a, b = randn(1, 16, 8, dtype=torch.float16), randn(8, 16, dtype=torch.float16)
    d = torch.empty(1, 16, 16, dtype=torch.float16, device=DEVICE)
    args = _gemm_args(family, torch.float16, False, a, b, None, d, 1.0, 0.0)
    args.device = torch.cuda.device_count() + 3
    status, _, message = _call(lib, "samattn_gemm", args)
    assert status != _lib.OK and message
    assert_cuda_healthy()


def test_capi_gemm_without_the_workspace_it_needs(lib, family):
    """A stream-K sm90 GEMM given no workspace is refused with the size it needs."""
    if family != "sm90":
        pytest.skip("only the sm90 family uses a workspace")
    if "gemm" not in _lib.built_ops():  # the size query's status carries no message to skip on
        pytest.skip("this build has no gemm ops (SAMATTN_OPS)")
    a, b = randn(1, 16, 1024, dtype=torch.bfloat16), randn(1, 1024, 1024, dtype=torch.bfloat16)
    d = torch.full((1, 16, 1024), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    args = _gemm_args(family, torch.bfloat16, False, a, b, None, d, 1.0, 0.0)
    needed = ctypes.c_int64(0)
    assert lib.samattn_gemm_workspace_size(ctypes.byref(args), ctypes.byref(needed)) == _lib.OK
    assert needed.value > 0
    args.workspace_bytes = needed.value - 1
    args.workspace = d.data_ptr()
    status, _, message = _call(lib, "samattn_gemm", args)
    assert status == _lib.NEEDS_WORKSPACE
    assert f"needs {needed.value} bytes of workspace" in message
    torch.cuda.synchronize()
    assert d.isnan().all()
