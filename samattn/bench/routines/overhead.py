"""Overhead (--ops overhead): what an eager call costs the CPU, as a user meets it. For
each call (small GEMMs, a small softmax, a prefill-sized and a decode-sized attention,
and forward + backward through autograd) against torch's own op on the same tensors:
the host time per call of a tight loop of asynchronous calls, in rounds that alternate
with torch's so that a drift of the shared host's speed reaches both (`samattn`, `baseline`
in microseconds, `ratio` = torch's time / samattn's, so >= 0.8 meets the design's
"at most 1.25x torch"), the GPU time per call with the calls queued back to back (no
sleep kernel hides the host time) and inside a captured CUDA graph (`*_queued_us`,
`*_graph_us`). Ops "overhead_<name>". The cases, overhead_cases(), are also what
benchmarks/profiling/overhead_ab.py and host_breakdown.py time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

import samattn

from ... import _lib
from .. import timing
from ..common import randn, try_call
from ..report import format_record
from ..runner import Bench

OP = "overhead"
HEADER = "eager overhead: host us per call (samattn, torch), ratio = torch / samattn"
FREES_MEMORY = False


class OverheadCase(NamedTuple):
    """One eager call and torch's equivalent, as thunks over fixed inputs."""

    name: str  # the record's op is "overhead_" + name
    what: str
    samattn: Callable[[], object]
    torch: Callable[[], object]


def cases(size: str) -> list[OverheadCase]:
    return overhead_cases()


def overhead_cases() -> list[OverheadCase]:
    """The calls of the overhead section, on tensors made now (on the GPU)."""
    import torch.nn.functional as F

    def attention(batch: int, seqlen_q: int, seqlen_k: int, heads: int, d: int, grad: bool):
        q = randn((batch, seqlen_q, heads, d), torch.bfloat16).requires_grad_(grad)
        k = randn((batch, seqlen_k, heads, d), torch.bfloat16).requires_grad_(grad)
        v = randn((batch, seqlen_k, heads, d), torch.bfloat16).requires_grad_(grad)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA's (batch, heads, seq, d)
        if not grad:
            return (
                lambda: samattn.flash_attn_func(q, k, v),
                lambda: F.scaled_dot_product_attention(qt, kt, vt),
            )
        dout = randn((batch, seqlen_q, heads, d), torch.bfloat16)
        doutt = dout.transpose(1, 2)
        return (
            lambda: torch.autograd.grad(samattn.flash_attn_func(q, k, v), (q, k, v), dout),
            lambda: torch.autograd.grad(
                F.scaled_dot_product_attention(qt, kt, vt), (q, k, v), doutt
            ),
        )

    a, b = randn((1024, 1024), torch.bfloat16), randn((1024, 1024), torch.bfloat16)
    a64, b64 = randn((64, 64), torch.bfloat16), randn((64, 64), torch.bfloat16)
    x = randn((64, 1024), torch.float32)
    xl, bl = randn((64, 1024), torch.bfloat16), randn((1024,), torch.bfloat16)
    ag, bg = a64.clone().requires_grad_(), b64.clone().requires_grad_()
    xg, dy = x.clone().requires_grad_(), randn((64, 1024), torch.float32)
    dd = randn((64, 64), torch.bfloat16)
    return [
        OverheadCase("gemm", "gemm bf16 1024^3", lambda: samattn.gemm(a, b), lambda: a @ b),
        OverheadCase(
            "gemm_small", "gemm bf16 64^3", lambda: samattn.gemm(a64, b64), lambda: a64 @ b64
        ),
        OverheadCase(
            "linear_gelu", "linear + bias + gelu bf16 64x1024 -> 1024",
            lambda: samattn.linear(xl, a, bl, activation="gelu"),
            lambda: F.gelu(F.linear(xl, a, bl)),
        ),
        OverheadCase(
            "softmax", "softmax f32 64x1024", lambda: samattn.softmax(x, -1),
            lambda: torch.softmax(x, -1),
        ),
        OverheadCase(
            "attention", "flash_attn_func bf16 b1 sq128 sk512 h8 d64",
            *attention(1, 128, 512, 8, 64, grad=False),
        ),
        OverheadCase(
            "attention_decode", "flash_attn_func bf16 decode sq1 sk512 h32 d128",
            *attention(1, 1, 512, 32, 128, grad=False),
        ),
        OverheadCase(
            "gemm_backward", "gemm bf16 64^3 forward + backward",
            lambda: torch.autograd.grad(samattn.gemm(ag, bg), (ag, bg), dd),
            lambda: torch.autograd.grad(ag @ bg, (ag, bg), dd),
        ),
        OverheadCase(
            "softmax_backward", "softmax f32 64x1024 forward + backward",
            lambda: torch.autograd.grad(samattn.softmax(xg, -1), (xg,), dy),
            lambda: torch.autograd.grad(torch.softmax(xg, -1), (xg,), dy),
        ),
        OverheadCase(
            "attention_backward", "flash_attn_func bf16 b1 sq128 sk512 h8 d64 forward + backward",
            *attention(1, 128, 512, 8, 64, grad=True),
        ),
    ]  # fmt: skip


def run(bench: Bench, case: OverheadCase) -> None:
    def body(family: str | None) -> None:
        with samattn.use_family(family):
            _lib.set_last_family(_lib.FAMILY_AUTO)
            case.samattn()
            ran = _lib.last_family() or "?"
            ours, theirs = timing.host_us_pair(case.samattn, case.torch)
            fields: dict[str, Any] = {}
            for name, measure in (("queued", timing.queued_gpu_us), ("graph", timing.graph_gpu_us)):
                for who, fn in (("samattn", case.samattn), ("baseline", case.torch)):
                    reason = try_call(measure, fn)  # a graph may refuse a call
                    key = f"{who}_{name}_us"
                    fields[key] = measure(fn) if reason is None else None
                    if reason is not None:
                        fields[f"{key}_skipped"] = reason
        record = dict(
            op="overhead_" + case.name,
            family=ran,
            forced=family is not None,
            dtype="-",
            shape=[],
            what=case.what,
            unit="us",
            samattn=ours,
            baseline=theirs,
            baseline_name="torch eager (same tensors)",
            **fields,
        )
        bench.records.append({**record, "ratio": theirs / ours})
        print(format_record(bench.records[-1]), flush=True)

    bench.run_case(f"overhead {case.what}", body)
