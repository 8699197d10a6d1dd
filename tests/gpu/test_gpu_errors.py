"""Errors on a GPU: clear Python exceptions, never a crash or a CUDA error.

After every failing call the device must still be usable
(gpu_checks.assert_cuda_healthy): an out-of-bounds access or a failed launch
would surface there as a sticky CUDA error.
"""

from __future__ import annotations

import pytest
import torch
from gpu_checks import DEVICE, assert_cuda_healthy, randn, runnable_families

import samattn

ALL_FAMILIES = ["sm75", "sm80", "sm90"]
# UnsupportedError is a RuntimeError; a dim out of range is an IndexError, as in torch.
ERRORS = (ValueError, TypeError, IndexError, RuntimeError)


def _names_this_gpu(message: str) -> bool:
    major, minor = torch.cuda.get_device_capability()
    names = (torch.cuda.get_device_name(), f"{major}.{minor}", f"sm_{major}{minor}")
    return any(name in message for name in names)


OPS = {
    "gemm": lambda dtype: samattn.gemm(randn(64, 32, dtype=dtype), randn(32, 16, dtype=dtype)),
    "softmax": lambda dtype: samattn.softmax(randn(8, 100, dtype=dtype)),
}
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("forced", ALL_FAMILIES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forced_family_runs_or_says_why(forced, op, dtype):
    """A forced family either runs the op (and is the one that ran) or raises
    UnsupportedError naming the GPU; one it cannot run must raise."""
    runnable = forced in runnable_families()
    try:
        with samattn.use_family(forced):
            OPS[op](dtype)
    except samattn.UnsupportedError as error:
        message = str(error)
        assert forced in message, f"message does not name the family: {message}"
        assert _names_this_gpu(message), f"message does not name the GPU: {message}"
        if forced in ("sm75", "sm80"):
            assert not runnable, f"{forced} is built and runnable here but refused {op}: {message}"
    else:
        assert runnable, f"{forced} is not built or cannot run here, yet {op} ran"
        assert samattn._lib.last_family() == forced
    assert_cuda_healthy()


BAD_CALLS = {
    "gemm inner sizes differ": lambda: samattn.gemm(
        randn(4, 5, dtype=torch.float16), randn(6, 7, dtype=torch.float16)
    ),
    "gemm dtypes differ": lambda: samattn.gemm(
        randn(4, 5, dtype=torch.float16), randn(5, 7, dtype=torch.float32)
    ),
    "gemm float64": lambda: samattn.gemm(
        randn(4, 5, dtype=torch.float64), randn(5, 7, dtype=torch.float64)
    ),
    "gemm int32": lambda: samattn.gemm(
        torch.ones(4, 5, dtype=torch.int32, device=DEVICE),
        torch.ones(5, 7, dtype=torch.int32, device=DEVICE),
    ),
    "gemm cpu and cuda": lambda: samattn.gemm(
        torch.randn(4, 5, dtype=torch.float16), randn(5, 7, dtype=torch.float16)
    ),
    "gemm 1-d operand": lambda: samattn.gemm(
        randn(5, dtype=torch.float16), randn(5, 7, dtype=torch.float16)
    ),
    "gemm batch sizes differ": lambda: samattn.gemm(
        randn(3, 4, 5, dtype=torch.float16), randn(2, 5, 7, dtype=torch.float16)
    ),
    "gemm c not broadcastable": lambda: samattn.gemm(
        randn(4, 5, dtype=torch.float16),
        randn(5, 7, dtype=torch.float16),
        randn(3, 7, dtype=torch.float16),
        beta=1.0,
    ),
    "gemm c other dtype": lambda: samattn.gemm(
        randn(4, 5, dtype=torch.float16),
        randn(5, 7, dtype=torch.float16),
        randn(4, 7, dtype=torch.float32),
        beta=1.0,
    ),
    "softmax dim out of range": lambda: samattn.softmax(randn(4, 5, dtype=torch.float16), dim=2),
    "softmax int": lambda: samattn.softmax(torch.ones(4, 5, dtype=torch.int64, device=DEVICE)),
    "softmax float64": lambda: samattn.softmax(randn(4, 5, dtype=torch.float64)),
}


@pytest.mark.parametrize("call", BAD_CALLS)
def test_bad_input_raises_cleanly(call):
    with pytest.raises(ERRORS) as error:
        BAD_CALLS[call]()
    assert str(error.value), f"{call}: empty message"
    assert_cuda_healthy()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_mixed_devices_raise():
    a = torch.randn(64, 32, device="cuda:0", dtype=torch.float16)
    b = torch.randn(32, 16, device="cuda:1", dtype=torch.float16)
    with pytest.raises(ERRORS):
        samattn.gemm(a, b)
    assert_cuda_healthy()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device_while_first_is_current():
    """Tensors on cuda:1 run there (device guard) while cuda:0 is current."""
    with torch.cuda.device(0):
        a = torch.randn(127, 65, device="cuda:1", dtype=torch.float32)
        b = torch.randn(65, 33, device="cuda:1", dtype=torch.float32)
        x = torch.randn(9, 1000, device="cuda:1", dtype=torch.float32)
        out, y = samattn.gemm(a, b), samattn.softmax(x)
    assert out.device == a.device and y.device == x.device
    torch.testing.assert_close(out.double(), a.double() @ b.double(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(y.double(), torch.softmax(x.double(), -1), rtol=1e-5, atol=1e-6)
    assert_cuda_healthy()
