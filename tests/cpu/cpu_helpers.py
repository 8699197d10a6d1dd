"""Helpers the CPU tests share (imported as `cpu_helpers`; tests/cpu is on sys.path), so
that no test module imports another: meta tensors of attention inputs, the C argument
structs of the C ABI tests with fake pointers, and the benchmark tests' timer and table
loader. The float references both tiers share are in tests/reference.py.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import torch

from samattn import _lib

F16, BF16 = torch.float16, torch.bfloat16

ROOT = Path(__file__).resolve().parents[2]


class OneCallTimer:
    """Calls fn once and reports 1 ms (or ms_by_fn[fn]); counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def input_set_count(self, set_bytes: int) -> int:
        return 1

    def median_ms(self, fn, input_sets) -> float:
        self.calls += 1
        fn(*input_sets[0])
        return 1.0


def ascii_lines(text: str) -> list[str]:
    """The table's lines with its multiplication signs and dashes as x and -."""
    return text.replace("\N{MULTIPLICATION SIGN}", "x").replace("\N{EN DASH}", "-").splitlines()


def load_readme_table():
    spec = importlib.util.spec_from_file_location(
        "readme_table", ROOT / "benchmarks" / "readme_table.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------- attention inputs, C arguments ----
def meta(*shape: int, dtype: torch.dtype = F16, grad: bool = False) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)


def qkv(b=2, sq=17, sk=33, h=4, hk=2, d=64, dtype=F16, grad=False):
    return (
        meta(b, sq, h, d, dtype=dtype, grad=grad),
        meta(b, sk, hk, d, dtype=dtype, grad=grad),
        meta(b, sk, hk, d, dtype=dtype, grad=grad),
    )


FAKE = 0x10000  # never dereferenced; 16-byte aligned


def attention_args(**changes) -> _lib.AttentionArgs:
    """A valid fp16 problem: batch 2, 4 query heads, 2 kv heads, sq 16, sk 32, d 64,
    contiguous (batch, seq, head, dim) tensors and a (batch, head, seq) lse."""
    b, h, hk, sq, sk, d = 2, 4, 2, 16, 32, 64
    args = _lib.AttentionArgs(
        dtype=_lib.F16,
        family=_lib.FAMILY_AUTO,
        device=0,
        batch=b,
        nheads=h,
        nheads_k=hk,
        seqlen_q=sq,
        seqlen_k=sk,
        headdim=d,
        q=FAKE,
        q_batch_stride=sq * h * d,
        q_seq_stride=h * d,
        q_head_stride=d,
        k=FAKE,
        k_batch_stride=sk * hk * d,
        k_seq_stride=hk * d,
        k_head_stride=d,
        v=FAKE,
        v_batch_stride=sk * hk * d,
        v_seq_stride=hk * d,
        v_head_stride=d,
        o=FAKE,
        o_batch_stride=sq * h * d,
        o_seq_stride=h * d,
        o_head_stride=d,
        lse=FAKE,
        lse_batch_stride=h * sq,
        lse_head_stride=sq,
        lse_seq_stride=1,
        softmax_scale=0.125,
        window_left=-1,
        window_right=-1,
    )
    for field, value in changes.items():
        setattr(args, field, value)
    return args


VARLEN = dict(cu_seqlens_q=FAKE, cu_seqlens_k=FAKE, max_seqlen_q=8, max_seqlen_k=16, batch=3)


def call_forward(args) -> tuple[int, int, str]:
    used = ctypes.c_int32(-1)
    pointer = ctypes.byref(args) if args is not None else None
    status = _lib.lib().samattn_attention_forward(pointer, ctypes.byref(used))
    return status, used.value, _lib.last_error() if status != _lib.OK else ""


def has_gpu() -> bool:
    try:
        _lib.device_properties(0)
    except (RuntimeError, ValueError):
        return False
    return True


FAKE2, FAKE3, FAKE4, FAKE5 = 0x20000, 0x30000, 0x40000, 0x50000  # dout, dq, dk, dv


def backward_args(**changes) -> _lib.AttentionArgs:
    """attention_args plus dout, dq (like q), dk, dv (like k), each at its own address,
    and a large enough workspace."""
    args = attention_args()
    args.dout, args.dq, args.dk, args.dv = FAKE2, FAKE3, FAKE4, FAKE5
    for name, like in (("dout", "q"), ("dq", "q"), ("dk", "k"), ("dv", "k")):
        for mode in ("batch", "seq", "head"):
            setattr(args, f"{name}_{mode}_stride", getattr(args, f"{like}_{mode}_stride"))
    args.workspace, args.workspace_bytes = FAKE, 2**30
    for field, value in changes.items():
        setattr(args, field, value)
    return args


def call_backward(args) -> tuple[int, int, str]:
    used = ctypes.c_int32(-1)
    pointer = ctypes.byref(args) if args is not None else None
    status = _lib.lib().samattn_attention_backward(pointer, ctypes.byref(used))
    return status, used.value, _lib.last_error() if status != _lib.OK else ""


def gemm_args(**changes) -> _lib.GemmArgs:
    """A valid (1 x 16 x 16 x 8) fp16 problem on device 0, then `changes`."""
    args = _lib.GemmArgs(
        dtype=_lib.F16,
        family=_lib.FAMILY_AUTO,
        device=0,
        allow_tf32=1,
        batch=1,
        m=16,
        n=16,
        k=8,
        a=FAKE,
        a_batch_stride=0,
        a_row_stride=8,
        a_col_stride=1,
        b=FAKE,
        b_batch_stride=0,
        b_row_stride=16,
        b_col_stride=1,
        c=None,
        d=FAKE,
        d_batch_stride=256,
        d_row_stride=16,
        d_col_stride=1,
        alpha=1.0,
        beta=0.0,
        stream=None,
    )
    for field, value in changes.items():
        setattr(args, field, value)
    return args


def softmax_args(**changes) -> _lib.SoftmaxArgs:
    args = _lib.SoftmaxArgs(
        dtype=_lib.BF16, family=0, device=0, outer=4, dim=100, inner=1, x=FAKE, dy=FAKE, out=FAKE
    )
    for field, value in changes.items():
        setattr(args, field, value)
    return args
