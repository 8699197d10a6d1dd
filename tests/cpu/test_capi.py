"""The C ABI called directly with bad arguments: a status and a message, never a crash.

Pointers here are fake addresses: every case fails validation before anything touches
them. Cases that get past validation need "no GPU here" and are skipped on a GPU machine
(the GPU tier covers them with real memory).
"""

from __future__ import annotations

import ctypes
import math
import threading

import pytest
from cpu_helpers import FAKE, gemm_args, softmax_args

from samattn import _lib


def _has_gpu() -> bool:
    try:
        _lib.device_properties(0)
    except (RuntimeError, ValueError):
        return False
    return True


needs_no_gpu = pytest.mark.skipif(_has_gpu(), reason="checks the no-GPU path")


def call(function: str, args) -> tuple[int, int, str]:
    """(status, family_used, message) of samattn_gemm / samattn_softmax_*."""
    used = ctypes.c_int32(-1)
    pointer = ctypes.byref(args) if args is not None else None
    status = getattr(_lib.lib(), function)(pointer, ctypes.byref(used))
    return status, used.value, _lib.last_error() if status != _lib.OK else ""


BAD_GEMM = {
    "negative m": (dict(m=-1), "sizes must be >= 0"),
    "negative k": (dict(k=-3), "k=-3"),
    "negative batch": (dict(batch=-2), "batch=-2"),
    "unknown dtype": (dict(dtype=7), "unknown dtype code 7"),
    "unknown family": (dict(family=42), "unknown family code 42"),
    "negative device": (dict(device=-1), "device must be"),
    "alpha nan": (dict(alpha=math.nan), "alpha must be finite, got nan"),
    "beta inf": (dict(beta=math.inf, c=FAKE), "beta must be finite, got inf"),
    "negative stride": (dict(b_row_stride=-16), "b strides must be >= 0"),
    "beta without c": (dict(beta=0.5), "c is NULL but beta is 0.5"),
    "beta without c, empty": (dict(beta=0.5, m=0), "c is NULL"),
    "null a": (dict(a=None), "a is NULL"),
    "null b": (dict(b=None), "b is NULL"),
    "null d": (dict(d=None), "d is NULL"),
    "d overlaps": (dict(d_row_stride=0), "overlap"),
    "d batch overlaps": (dict(batch=2, d_batch_stride=0), "overlap"),
    "byte offsets overflow": (dict(a_row_stride=2**62), "overflow"),
    "elements overflow": (dict(batch=2**40, m=2**20, n=2**20, d_batch_stride=2**40), "overflow"),
}


@pytest.mark.parametrize("case", BAD_GEMM)
def test_gemm_invalid_arguments(case):
    changes, fragment = BAD_GEMM[case]
    status, used, message = call("samattn_gemm", gemm_args(**changes))
    assert status == _lib.INVALID_ARGUMENT, message
    assert fragment in message, message
    assert used == _lib.FAMILY_AUTO  # nothing ran


def test_gemm_null_args_and_null_family_used():
    status, _, message = call("samattn_gemm", None)
    assert status == _lib.INVALID_ARGUMENT and "args is NULL" in message
    assert _lib.lib().samattn_gemm(ctypes.byref(gemm_args(m=-1)), None) == _lib.INVALID_ARGUMENT


@pytest.mark.parametrize("empty", [dict(m=0), dict(n=0), dict(batch=0)])
def test_gemm_empty_output_is_ok_without_touching_anything(empty):
    args = gemm_args(a=None, b=None, d=None, **empty)
    assert call("samattn_gemm", args)[:2] == (_lib.OK, _lib.FAMILY_AUTO)


@needs_no_gpu
@pytest.mark.parametrize("changes", [dict(), dict(k=0, a=None, b=None), dict(family=80)])
def test_gemm_without_gpu_is_a_cuda_error(changes):
    status, used, message = call("samattn_gemm", gemm_args(**changes))
    assert status == _lib.CUDA_ERROR and "no CUDA device" in message, message
    assert "samattn gemm (float16)" in message and used == _lib.FAMILY_AUTO


BAD_SOFTMAX = {
    "unknown dtype": ("samattn_softmax_forward", dict(dtype=3), "unknown dtype code 3"),
    "unknown family": ("samattn_softmax_forward", dict(family=70), "unknown family code 70"),
    "negative outer": ("samattn_softmax_forward", dict(outer=-1), "outer=-1"),
    "negative dim": ("samattn_softmax_backward", dict(dim=-5), "dim=-5"),
    "null x": ("samattn_softmax_forward", dict(x=None), "x is NULL"),
    "null y": ("samattn_softmax_backward", dict(x=None), "y is NULL"),
    "null dy": ("samattn_softmax_backward", dict(dy=None), "dy is NULL"),
    "null out": ("samattn_softmax_forward", dict(out=None), "y is NULL"),
    "null dx": ("samattn_softmax_backward", dict(out=None), "dx is NULL"),
    "overflow": ("samattn_softmax_forward", dict(outer=2**40, dim=2**30), "overflows"),
}


@pytest.mark.parametrize("case", BAD_SOFTMAX)
def test_softmax_invalid_arguments(case):
    function, changes, fragment = BAD_SOFTMAX[case]
    status, used, message = call(function, softmax_args(**changes))
    assert status == _lib.INVALID_ARGUMENT, message
    assert fragment in message and used == _lib.FAMILY_AUTO, message


@pytest.mark.parametrize("function", ["samattn_softmax_forward", "samattn_softmax_backward"])
def test_softmax_null_args_and_empty(function):
    status, _, message = call(function, None)
    assert status == _lib.INVALID_ARGUMENT and "args is NULL" in message
    for empty in (dict(outer=0), dict(dim=0), dict(inner=0)):
        args = softmax_args(x=None, dy=None, out=None, **empty)
        assert call(function, args)[:2] == (_lib.OK, _lib.FAMILY_AUTO)


@needs_no_gpu
def test_softmax_without_gpu_is_a_cuda_error():
    status, _, message = call("samattn_softmax_forward", softmax_args())
    assert status == _lib.CUDA_ERROR and "no CUDA device" in message, message


# The *_with_pointers calls: an earlier call's struct with the pointers replaced. Each
# case sets a pointer argument to NULL where the struct holds a valid one (or the other
# way round), so the message shows which of the two the call checked.
WITH_POINTERS = {
    "gemm a": ("samattn_gemm_with_pointers", dict(a=None), "a is NULL"),
    "gemm b": ("samattn_gemm_with_pointers", dict(b=None), "b is NULL"),
    "gemm d": ("samattn_gemm_with_pointers", dict(d=None), "d is NULL"),
    "softmax x": ("samattn_softmax_forward_with_pointers", dict(x=None), "x is NULL"),
    "softmax out": ("samattn_softmax_forward_with_pointers", dict(out=None), "y is NULL"),
    "softmax_backward y": ("samattn_softmax_backward_with_pointers", dict(x=None), "y is NULL"),
    "softmax_backward dy": ("samattn_softmax_backward_with_pointers", dict(dy=None), "dy is NULL"),
    "softmax_backward dx": ("samattn_softmax_backward_with_pointers", dict(out=None), "dx is NULL"),
}


def call_with_pointers(function: str, prepared, **pointers) -> tuple[int, int, str]:
    """(status, family_used, message) of a *_with_pointers call on `prepared`, every
    pointer FAKE unless given."""
    used = ctypes.c_int32(-1)
    address = None if prepared is None else ctypes.addressof(prepared)
    if function == "samattn_gemm_with_pointers":
        given = dict(a=FAKE, b=FAKE, d=FAKE, bias=None) | pointers
        arguments = (given["a"], given["b"], given["d"], given["bias"], None, None, 0)
    else:
        given = dict(x=FAKE, dy=FAKE, out=FAKE) | pointers
        arguments = (given["x"], given["dy"], given["out"], None)
    status = getattr(_lib.lib(), function)(address, *arguments, ctypes.byref(used))
    return status, used.value, _lib.last_error() if status != _lib.OK else ""


@pytest.mark.parametrize("case", WITH_POINTERS)
def test_with_pointers_checks_the_pointers_it_is_given(case):
    function, pointers, fragment = WITH_POINTERS[case]
    prepared = gemm_args() if "gemm" in function else softmax_args()
    status, used, message = call_with_pointers(function, prepared, **pointers)
    assert status == _lib.INVALID_ARGUMENT and fragment in message, message
    assert used == _lib.FAMILY_AUTO
    # The struct's own pointers are not read: NULL there, FAKE given, the call gets past
    # the NULL checks to a later one (a refusal still: FAKE is never dereferenced).
    if "gemm" in function:
        stale, later = gemm_args(a=None, b=None, d=None, d_row_stride=0), "overlap"
    else:
        stale, later = softmax_args(x=None, dy=None, out=None, outer=2**40, dim=2**30), "overflow"
    status, _, message = call_with_pointers(function, stale)
    assert status == _lib.INVALID_ARGUMENT and later in message, message


@pytest.mark.parametrize("function", sorted({f for f, _, _ in WITH_POINTERS.values()}))
def test_with_pointers_checks_the_struct(function):
    status, _, message = call_with_pointers(function, None)
    assert status == _lib.INVALID_ARGUMENT and "args is NULL" in message, message
    prepared = gemm_args() if "gemm" in function else softmax_args()
    prepared.struct_size -= 8
    status, _, message = call_with_pointers(function, prepared)
    assert status == _lib.INVALID_ARGUMENT and "struct_size" in message, message
    # A size-checked copy: invalid fields of the struct are still refused.
    prepared = gemm_args(m=-1) if "gemm" in function else softmax_args(outer=-1)
    status, _, message = call_with_pointers(function, prepared)
    assert status == _lib.INVALID_ARGUMENT, message


def test_select_family_invalid_arguments():
    lib, family = _lib.lib(), ctypes.c_int32()
    cases = {
        "family output is NULL": (0, 0, 8, 0, 0, 1, None),
        "unknown op code 5": (5, 0, 8, 0, 0, 1, ctypes.byref(family)),
        "unknown dtype code -1": (0, -1, 8, 0, 0, 1, ctypes.byref(family)),
        "unknown family code 81": (1, 0, 8, 0, 81, 1, ctypes.byref(family)),
        "invalid compute capability -1.0": (1, 0, -1, 0, 0, 1, ctypes.byref(family)),
    }
    for fragment, args in cases.items():
        assert lib.samattn_select_family(*args) == _lib.INVALID_ARGUMENT
        assert fragment in _lib.last_error()


def test_device_properties_invalid_arguments():
    lib = _lib.lib()
    name = ctypes.create_string_buffer(64)
    ints = [ctypes.c_int32() for _ in range(3)]
    refs = [ctypes.byref(i) for i in ints]
    assert lib.samattn_device_properties(0, None, 0, *refs) == _lib.INVALID_ARGUMENT
    assert lib.samattn_device_properties(0, name, 0, *refs) == _lib.INVALID_ARGUMENT
    assert lib.samattn_device_properties(0, name, 64, None, *refs[1:]) == _lib.INVALID_ARGUMENT
    assert lib.samattn_device_properties(-1, name, 64, *refs) == _lib.INVALID_ARGUMENT
    assert "device must be >= 0" in _lib.last_error()


@needs_no_gpu
def test_device_properties_without_gpu():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        _lib.device_properties(0)


def test_cuda_versions():
    runtime, driver = _lib.cuda_versions()
    assert runtime >= 11000 and driver >= 0
    assert _lib.lib().samattn_cuda_versions(None, None) == _lib.INVALID_ARGUMENT


def test_last_error_is_per_thread():
    call("samattn_gemm", gemm_args(m=-7))
    mine = _lib.last_error()
    other: list[str] = []

    def fail_elsewhere() -> None:
        call("samattn_gemm", gemm_args(dtype=99))
        other.append(_lib.last_error())

    thread = threading.Thread(target=fail_elsewhere)
    thread.start()
    thread.join()
    assert "m=-7" in mine and _lib.last_error() == mine
    assert "unknown dtype code 99" in other[0]


def test_status_mapping():
    lib = _lib.lib()
    family = ctypes.c_int32()
    lib.samattn_select_family(0, 0, 8, 0, 81, 1, ctypes.byref(family))
    with pytest.raises(ValueError, match="unknown family code 81"):
        _lib.check(_lib.INVALID_ARGUMENT)
    lib.samattn_select_family(0, 0, 6, 0, 0, 1, ctypes.byref(family))
    with pytest.raises(_lib.UnsupportedError):
        _lib.check(_lib.UNSUPPORTED)
    with pytest.raises(RuntimeError):
        _lib.check(_lib.CUDA_ERROR)
    assert issubclass(_lib.UnsupportedError, RuntimeError)
