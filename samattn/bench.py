"""Benchmarks of samattn against torch, measured in the same run.

    python -m samattn.bench [--ops gemm,softmax,attention] [--families sm80,sm75] [--quick]
                            [--json PATH] [--plot PATH]

GEMM is reported in TFLOPS (2 * batch * M * N * K flops) against torch.matmul
(cuBLAS) in the same dtype and fp32 precision; softmax in GB/s of the minimum
traffic (forward reads x and writes y: 2 * numel * element size; backward
reads y and dy and writes dx: 3x) against torch.softmax and
torch._softmax_backward_data, and the forward also against a device-to-device
copy of the same bytes (y.copy_(x)), the bandwidth a softmax could reach.
Attention is reported in TFLOPS (forward 4 * batch * heads * seqlen^2 * headdim,
halved when causal; backward 2.5x the forward) against
torch.nn.functional.scaled_dot_product_attention forced to its FLASH_ATTENTION
backend (FlashAttention-2; `baseline`, `ratio`) and to CUDNN_ATTENTION (`cudnn`,
`ratio_to_cudnn`). samattn.flash_attn_func reads (batch, seqlen, heads, headdim)
tensors; SDPA gets the (batch, heads, seqlen, headdim) transposed views of the
same tensors, as FlashAttention's own benchmark does. The backward is timed
alone: one forward with requires_grad, then torch.autograd.grad(out, (q, k, v),
dout, retain_graph=True) repeatedly. A baseline that refuses a case (e.g.
cuDNN's head dim 256 backward) is left out of that record with the reason
(`baseline_skipped`, `cudnn_skipped`); a samattn case that the family or the
library cannot run (UnsupportedError, NotImplementedError) goes to the JSON's
`skipped` list with the library's message.
`ratio` is samattn / torch: above 1 is faster.

Overhead (--ops overhead): what an eager call costs the CPU, as a user meets it. For
each call (small GEMMs, a small softmax, a prefill-sized and a decode-sized attention,
and forward + backward through autograd) against torch's own op on the same tensors:
the host time per call of a tight loop of asynchronous calls (`samattn`, `baseline`
in microseconds, `ratio` = torch's time / samattn's, so >= 0.8 meets the design's
"at most 1.25x torch"), the GPU time per call with the calls queued back to back (no
sleep kernel hides the host time) and inside a captured CUDA graph (`*_queued_us`,
`*_graph_us`).

Timing: CUDA events around every call, median of 20-200 calls (about 0.2 s
of GPU time per measurement, less with --quick) after a warm-up. Before the
timed calls the GPU is kept busy (torch.cuda._sleep) for as long as the CPU
needs to queue them all, so Python overhead between calls does not count:
the numbers are GPU time. Inputs are fresh random normal data; when one set
of inputs fits in twice the L2 cache, several sets are rotated so that every
call reads from memory, not from L2.

Results go to benchmarks/results/<gpu>.json (relative to the current folder;
--json DIR/ picks the folder), with the GPU, torch, CUDA and samattn versions
and this command line; --plot writes a PNG of the ratios (needs matplotlib).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import re
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

import samattn

from . import _cuda, _lib

OPS = ("gemm", "softmax", "attention", "overhead")
FAMILIES = ("auto", *_lib.FAMILY_CODES)  # "auto": the library's own choice for the GPU

# dtype name -> (torch dtype, torch fp32 matmul precision): "f32" is exact fp32
# ("highest"), "tf32" lets fp32 GEMMs use tf32 tensor cores ("high").
DTYPES = {
    "f16": (torch.float16, "highest"),
    "bf16": (torch.bfloat16, "highest"),
    "f32": (torch.float32, "highest"),
    "tf32": (torch.float32, "high"),
}

Shape = tuple[int, ...]

# (dtype, (batch, M, N, K)): squares, LLM projections (M tokens against (N, K) weights of a
# Llama-3-8B layer), decode-like small M, and a batch of small products.
_SQUARES = [(1, s, s, s) for s in (1024, 2048, 4096, 8192)]
_LLM_WEIGHTS = [(4096, 4096), (14336, 4096), (4096, 14336)]  # (N, K)
_LLM = [(1, m, n, k) for m in (4096, 16384) for n, k in _LLM_WEIGHTS]
_SMALL_M = [(1, m, 8192, 8192) for m in (16, 64, 128)]
_BATCHED = [(64, 512, 512, 512)]
GEMM_CASES = {
    "full": [
        *[
            (dt, s)
            for dt in ("bf16", "f16")
            for s in dict.fromkeys(_SQUARES + _LLM + _SMALL_M + _BATCHED)  # 4096^3 is in two
        ],
        ("f32", (1, 4096, 4096, 4096)),
        ("f32", (1, 8192, 8192, 8192)),
        ("tf32", (1, 4096, 4096, 4096)),
        ("tf32", (1, 8192, 8192, 8192)),
    ],
    "quick": [
        ("f16", (1, 2048, 2048, 2048)),
        ("f16", (1, 4096, 4096, 4096)),
        ("f16", (64, 512, 512, 512)),
        ("bf16", (1, 4096, 4096, 4096)),
        ("bf16", (1, 16, 8192, 8192)),
        ("f32", (1, 4096, 4096, 4096)),
        ("tf32", (1, 4096, 4096, 4096)),
    ],
}

# (dtype, (rows, cols)), softmax over the last dim; every shape is 64M elements.
_SOFTMAX_SHAPES = [(65536, 1024), (16384, 4096), (8192, 8192), (4096, 16384), (2048, 32768)]
SOFTMAX_CASES = {
    "full": [
        *[("f16", s) for s in _SOFTMAX_SHAPES],
        *[("f32", s) for s in _SOFTMAX_SHAPES],
        ("bf16", (65536, 1024)),
        ("bf16", (8192, 8192)),
    ],
    "quick": [
        ("f16", (16384, 4096)),
        ("f16", (2048, 32768)),
        ("f32", (16384, 4096)),
    ],
}


class AttentionCase(NamedTuple):
    """One attention problem: q, k, v of (batch, seqlen, heads, d), seqlen_q == seqlen_k."""

    batch: int
    heads: int
    seqlen: int
    d: int
    causal: bool


# FlashAttention's benchmark grid: batch * seqlen = 16k tokens, heads * d = 2048 (the model
# width), so every case does the same work per token.
ATTENTION_TOKENS = 16384
ATTENTION_WIDTH = 2048
ATTENTION_SEQLENS = (1024, 2048, 4096, 8192, 16384)
ATTENTION_HEAD_DIMS = (64, 128, 256)


def attention_case(seqlen: int, d: int, causal: bool) -> AttentionCase:
    return AttentionCase(ATTENTION_TOKENS // seqlen, ATTENTION_WIDTH // d, seqlen, d, causal)


ATTENTION_CASES = {
    "full": [
        (dt, attention_case(seqlen, d, causal))
        for dt in ("bf16", "f16")
        for d in ATTENTION_HEAD_DIMS
        for seqlen in ATTENTION_SEQLENS
        for causal in (False, True)
    ],
    "quick": [
        ("bf16", attention_case(2048, 128, False)),
        ("bf16", attention_case(8192, 128, True)),
        ("f16", attention_case(4096, 64, True)),
        ("f16", attention_case(4096, 256, False)),
    ],
}

SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


def attention_tflop(case: AttentionCase, direction: str) -> float:
    """Tera-FLOPs of one call: forward 4 * batch * heads * seqlen^2 * d (two GEMMs of
    2 * seqlen^2 * d each), halved when causal; backward (five GEMMs) 2.5x the forward."""
    flop = 4 * case.batch * case.heads * case.seqlen * case.seqlen * case.d
    if case.causal:
        flop /= 2
    return flop * (2.5 if direction == "bwd" else 1.0) / 1e12


def try_call(fn: Callable[..., object], *args: object) -> str | None:
    """Runs fn(*args) once; returns None if it worked, else why not (torch's SDPA raises
    RuntimeError when a forced backend refuses a case, with the reasons in warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn(*args)
            return None
        except (RuntimeError, NotImplementedError, ValueError) as error:
            reasons = [str(w.message).splitlines()[0] for w in caught]
            first_line = (str(error).splitlines() or [type(error).__name__])[0]
            return "; ".join(dict.fromkeys([first_line, *reasons]))


# samattn's output may differ from torch's by rounding, not by more.
AGREEMENT_LIMIT = 2e-2


# --------------------------------------------------------------- timing ----


class Timer:
    """Median GPU time of a call, with inputs rotated through several sets."""

    def __init__(self, quick: bool) -> None:
        self.target_s = 0.05 if quick else 0.2
        self.min_reps, self.max_reps = (10, 50) if quick else (20, 200)
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.l2_bytes = getattr(props, "L2_cache_size", 0) or 50 * 2**20
        # torch.cuda._sleep counts GPU clock cycles; clock_rate is in kHz = cycles per ms.
        self.cycles_per_ms = getattr(props, "clock_rate", 0) or 2_000_000

    def input_set_count(self, set_bytes: int) -> int:
        """How many input sets to rotate so that their total is well past the L2 cache."""
        if set_bytes >= 2 * self.l2_bytes:
            return 1
        return min(64, math.ceil(3 * self.l2_bytes / max(set_bytes, 1)))

    def _sleep(self, ms: float) -> None:
        torch.cuda._sleep(int(min(ms, 2000.0) * self.cycles_per_ms))

    def median_ms(self, fn: Callable[..., object], input_sets: Sequence[tuple]) -> float:
        sets = len(input_sets)
        # Warm-up, also measuring how long the CPU takes to queue one call.
        warmup = max(3, min(sets, 10))
        torch.cuda.synchronize()
        started = time.perf_counter()
        for i in range(warmup):
            fn(*input_sets[i % sets])
        cpu_ms = (time.perf_counter() - started) * 1e3 / warmup
        torch.cuda.synchronize()

        # A first estimate of the GPU time per call picks the repetitions.
        estimate_calls = max(3, min(sets, 10))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._sleep(estimate_calls * cpu_ms * 1.5 + 1)
        start.record()
        for i in range(estimate_calls):
            fn(*input_sets[i % sets])
        end.record()
        torch.cuda.synchronize()
        gpu_ms = max(start.elapsed_time(end) / estimate_calls, 1e-3)
        reps = int(min(self.max_reps, max(self.min_reps, self.target_s * 1e3 / gpu_ms)))

        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(reps)
        ]
        self._sleep(reps * cpu_ms * 1.3 + 1)
        for i, (start, end) in enumerate(events):
            start.record()
            fn(*input_sets[i % sets])
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events)


# ------------------------------------------------------------- overhead ----


class OverheadCase(NamedTuple):
    """One eager call and torch's equivalent, as thunks over fixed inputs."""

    name: str  # the record's op is "overhead_" + name
    what: str
    samattn: Callable[[], object]
    torch: Callable[[], object]


def overhead_cases() -> list[OverheadCase]:
    import torch.nn.functional as F

    def attention(batch: int, seqlen_q: int, seqlen_k: int, heads: int, d: int, grad: bool):
        q = _randn((batch, seqlen_q, heads, d), torch.bfloat16).requires_grad_(grad)
        k = _randn((batch, seqlen_k, heads, d), torch.bfloat16).requires_grad_(grad)
        v = _randn((batch, seqlen_k, heads, d), torch.bfloat16).requires_grad_(grad)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA's (batch, heads, seq, d)
        if not grad:
            return (
                lambda: samattn.flash_attn_func(q, k, v),
                lambda: F.scaled_dot_product_attention(qt, kt, vt),
            )
        dout = _randn((batch, seqlen_q, heads, d), torch.bfloat16)
        doutt = dout.transpose(1, 2)
        return (
            lambda: torch.autograd.grad(samattn.flash_attn_func(q, k, v), (q, k, v), dout),
            lambda: torch.autograd.grad(
                F.scaled_dot_product_attention(qt, kt, vt), (q, k, v), doutt
            ),
        )

    a, b = _randn((1024, 1024), torch.bfloat16), _randn((1024, 1024), torch.bfloat16)
    a64, b64 = _randn((64, 64), torch.bfloat16), _randn((64, 64), torch.bfloat16)
    x = _randn((64, 1024), torch.float32)
    ag, bg = a64.clone().requires_grad_(), b64.clone().requires_grad_()
    xg, dy = x.clone().requires_grad_(), _randn((64, 1024), torch.float32)
    dd = _randn((64, 64), torch.bfloat16)
    return [
        OverheadCase("gemm", "gemm bf16 1024^3", lambda: samattn.gemm(a, b), lambda: a @ b),
        OverheadCase(
            "gemm_small", "gemm bf16 64^3", lambda: samattn.gemm(a64, b64), lambda: a64 @ b64
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


def host_us(fn: Callable[[], object], calls: int = 100, rounds: int = 15) -> float:
    """Median host time per call of `calls` asynchronous calls in a row (the GPU drained
    between rounds, so its queue never throttles the loop)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - started) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def queued_gpu_us(fn: Callable[[], object], calls: int = 100, rounds: int = 10) -> float:
    """GPU time per call of calls issued back to back, as an eager loop meets it: when the
    host is slower than the kernels, this is the host's time."""
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def graph_gpu_us(fn: Callable[[], object], calls: int = 20, rounds: int = 10) -> float:
    """GPU time per call replayed from a captured CUDA graph of `calls` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


# ---------------------------------------------------------------- cases ----


def _randn(shape: Shape, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _relative_difference(x: torch.Tensor, y: torch.Tensor) -> float:
    y = y.double()
    return ((x.double() - y).norm() / y.norm().clamp_min(1e-30)).item()


class Bench:
    """Runs the cases, prints one line per record and keeps the records."""

    def __init__(self, timer: Timer, families: list[str | None]) -> None:
        self.timer = timer
        self.families = families
        self.records: list[dict[str, Any]] = []
        # {"case": label, "reason": message, **the case's fields}: also written to the JSON.
        self.skipped: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._baselines: dict[tuple, float] = {}  # torch's times, measured once per case
        # Baselines that may refuse a case: (ms, None) or (None, why), measured once per case.
        self._optional_baselines: dict[tuple, tuple[float | None, str | None]] = {}

    def _samattn_ms(self, family: str | None, fn, input_sets) -> tuple[float, str]:
        """Median time of fn under `family` (None: automatic), and the family that ran."""
        with samattn.use_family(family):
            _lib.set_last_family(_lib.FAMILY_AUTO)
            fn(*input_sets[0])
            ran = _lib.last_family() or "?"
            return self.timer.median_ms(fn, input_sets), ran

    def _baseline_ms(self, key: tuple, fn, input_sets) -> float:
        if key not in self._baselines:
            self._baselines[key] = self.timer.median_ms(fn, input_sets)
        return self._baselines[key]

    def _optional_baseline_ms(
        self, key: tuple, make: Callable[[], tuple[Callable[..., object], Sequence[tuple]]]
    ) -> tuple[float | None, str | None]:
        """(median ms, None) of fn over input_sets, with (fn, input_sets) = make(); or
        (None, the reason) when make() or fn refuses the case. Measured once per key."""
        if key not in self._optional_baselines:
            made: list = []
            reason = try_call(lambda: made.extend(make()))
            if reason is None:
                fn, input_sets = made
                reason = try_call(fn, *input_sets[0])
            if reason is None:
                self._optional_baselines[key] = (self.timer.median_ms(fn, input_sets), None)
            else:
                self._optional_baselines[key] = (None, reason)
        return self._optional_baselines[key]

    def _run_case(
        self,
        label: str,
        body: Callable[[str | None], None],
        fields: dict[str, Any] | None = None,
    ) -> None:
        """body(family) for every family; a family or build that cannot run the case
        (UnsupportedError) or a feature not implemented yet (NotImplementedError) is recorded
        as skipped, with `fields` describing the case in the JSON."""
        for family in self.families:
            what = f"{label} [{family or 'auto'}]"
            try:
                body(family)
            except (samattn.UnsupportedError, NotImplementedError) as error:
                self.skipped.append(
                    {
                        "case": what,
                        "family": family or "auto",
                        **(fields or {}),
                        "reason": str(error),
                    }
                )
                print(f"  skipped {what}: {str(error).splitlines()[0]}", flush=True)
            except Exception as error:  # keep benchmarking the other cases
                self.errors.append(f"{what}: {type(error).__name__}: {error}")
                print(f"  ERROR {what}: {type(error).__name__}: {error}", flush=True)
                torch.cuda.synchronize()  # a sticky CUDA error ends the run here

    def _record(self, **fields: Any) -> None:
        baseline = fields["baseline"]
        fields["ratio"] = fields["samattn"] / baseline if baseline else None
        self.records.append(fields)
        print(format_record(fields), flush=True)

    # -- GEMM
    def gemm(self, dtype_name: str, shape: Shape) -> None:
        batch, m, n, k = shape
        dtype, precision = DTYPES[dtype_name]
        a_shape = (batch, m, k) if batch > 1 else (m, k)
        b_shape = (batch, k, n) if batch > 1 else (k, n)
        set_bytes = (batch * m * k + batch * k * n) * torch.empty((), dtype=dtype).element_size()
        count = self.timer.input_set_count(set_bytes)
        sets = [(_randn(a_shape, dtype), _randn(b_shape, dtype)) for _ in range(count)]
        tflop = 2 * batch * m * n * k / 1e12

        def body(family: str | None) -> None:
            saved = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision(precision)
            try:
                ms, ran = self._samattn_ms(family, lambda a, b: samattn.gemm(a, b), sets)
                base_ms = self._baseline_ms(("gemm", dtype_name, shape), torch.matmul, sets)
                with samattn.use_family(family):
                    agreement = _relative_difference(samattn.gemm(*sets[0]), torch.matmul(*sets[0]))
                    config = _cuda.gemm_plan(*sets[0])[1]
            finally:
                torch.set_float32_matmul_precision(saved)
            self._record(
                op="gemm",
                family=ran,
                forced=family is not None,
                dtype=dtype_name,
                shape=list(shape),
                unit="TFLOPS",
                samattn=tflop / (ms / 1e3),
                baseline=tflop / (base_ms / 1e3),
                baseline_name="torch.matmul (cuBLAS)",
                config=config,
                samattn_ms=ms,
                baseline_ms=base_ms,
                difference_to_baseline=agreement,
            )

        self._run_case(f"gemm {dtype_name} {_shape_text(shape)}", body)

    # -- eager overhead
    def overhead(self, case: OverheadCase) -> None:
        def body(family: str | None) -> None:
            with samattn.use_family(family):
                _lib.set_last_family(_lib.FAMILY_AUTO)
                case.samattn()
                ran = _lib.last_family() or "?"
                ours = host_us(case.samattn)
                theirs = host_us(case.torch)
                fields: dict[str, Any] = {}
                for name, measure in (("queued", queued_gpu_us), ("graph", graph_gpu_us)):
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
            self.records.append({**record, "ratio": theirs / ours})
            print(format_record(self.records[-1]), flush=True)

        self._run_case(f"overhead {case.what}", body)

    # -- softmax
    def softmax(self, dtype_name: str, shape: Shape) -> None:
        dtype = DTYPES[dtype_name][0]
        x = _randn(shape, dtype)
        count = self.timer.input_set_count(_nbytes(x))
        xs = [(x,)] + [(_randn(shape, dtype),) for _ in range(count - 1)]
        forward_gb = 2 * _nbytes(x) / 1e9
        backward_gb = 3 * _nbytes(x) / 1e9
        # Backward inputs: a valid y = softmax(x) and a random dy.
        backward_sets = [(torch.softmax(x, -1), _randn(shape, dtype)) for (x,) in xs]

        def forward(family: str | None) -> None:
            ms, ran = self._samattn_ms(family, lambda x: samattn.softmax(x, -1), xs)
            key = ("softmax_forward", dtype_name, shape)
            base_ms = self._baseline_ms(key, lambda x: torch.softmax(x, -1), xs)
            copy_sets = [(x, torch.empty_like(x)) for (x,) in xs]
            copy_ms = self._baseline_ms(("copy", *key), lambda x, y: y.copy_(x), copy_sets)
            del copy_sets
            with samattn.use_family(family):
                agreement = _relative_difference(samattn.softmax(x, -1), torch.softmax(x, -1))
            self._record(
                op="softmax_forward",
                family=ran,
                forced=family is not None,
                dtype=dtype_name,
                shape=list(shape),
                unit="GB/s",
                samattn=forward_gb / (ms / 1e3),
                baseline=forward_gb / (base_ms / 1e3),
                baseline_name="torch.softmax",
                samattn_ms=ms,
                baseline_ms=base_ms,
                copy=forward_gb / (copy_ms / 1e3),
                ratio_to_copy=copy_ms / ms,
                difference_to_baseline=agreement,
            )

        def backward(family: str | None) -> None:
            def samattn_backward(y, dy):
                return torch.ops.samattn.softmax_backward(y, dy, -1)

            def torch_backward(y, dy):
                return torch._softmax_backward_data(dy, y, -1, dtype)

            ms, ran = self._samattn_ms(family, samattn_backward, backward_sets)
            key = ("softmax_backward", dtype_name, shape)
            base_ms = self._baseline_ms(key, torch_backward, backward_sets)
            with samattn.use_family(family):
                agreement = _relative_difference(
                    samattn_backward(*backward_sets[0]), torch_backward(*backward_sets[0])
                )
            self._record(
                op="softmax_backward",
                family=ran,
                forced=family is not None,
                dtype=dtype_name,
                shape=list(shape),
                unit="GB/s",
                samattn=backward_gb / (ms / 1e3),
                baseline=backward_gb / (base_ms / 1e3),
                baseline_name="torch._softmax_backward_data",
                samattn_ms=ms,
                baseline_ms=base_ms,
                difference_to_baseline=agreement,
            )

        self._run_case(f"softmax_forward {dtype_name} {_shape_text(shape)}", forward)
        self._run_case(f"softmax_backward {dtype_name} {_shape_text(shape)}", backward)

    # -- attention
    def attention(self, dtype_name: str, case: AttentionCase) -> None:
        """Forward and backward of samattn.flash_attn_func against SDPA's flash and cuDNN
        backends, on the same (batch, seqlen, heads, d) tensors (SDPA: transposed views)."""
        from torch.nn.attention import SDPBackend

        dtype = DTYPES[dtype_name][0]
        shape = (case.batch, case.seqlen, case.heads, case.d)
        set_bytes = 3 * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        count = self.timer.input_set_count(set_bytes)
        sets = [tuple(_randn(shape, dtype) for _ in range(3)) for _ in range(count)]
        dout = _randn(shape, dtype)
        causal = case.causal

        def samattn_forward(q, k, v):
            return samattn.flash_attn_func(q, k, v, causal=causal)

        def sdpa_forward(backend_name: str) -> Callable[..., torch.Tensor]:
            backend = getattr(SDPBackend, SDPA_BACKENDS[backend_name], None)

            def forward(q, k, v):
                if backend is None:
                    raise RuntimeError(
                        f"torch {torch.__version__} has no SDPBackend.{SDPA_BACKENDS[backend_name]}"
                    )
                with torch.nn.attention.sdpa_kernel(backend):
                    out = torch.nn.functional.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
                    )
                return out.transpose(1, 2)

            return forward

        implementations = {"samattn": samattn_forward}
        implementations.update((name, sdpa_forward(name)) for name in SDPA_BACKENDS)
        what = f"{dtype_name} {_shape_text(case[:4])}{' causal' if causal else ''}"
        fields = {"dtype": dtype_name, **case._asdict()}

        def record(direction: str, family: str | None, ms: float, ran: str, reference, output):
            tflop = attention_tflop(case, direction)
            timings = {
                name: self._optional_baseline_ms(
                    (f"attention_{direction}", dtype_name, case, name),
                    functools.partial(reference, name),
                )
                for name in SDPA_BACKENDS
            }
            flash_ms, flash_skipped = timings["flash"]
            cudnn_ms, cudnn_skipped = timings["cudnn"]
            compared = next((name for name in SDPA_BACKENDS if timings[name][0]), None)
            extra: dict[str, Any] = {}
            if flash_skipped:
                extra["baseline_skipped"] = flash_skipped
            if cudnn_skipped:
                extra["cudnn_skipped"] = cudnn_skipped
            cudnn = tflop / (cudnn_ms / 1e3) if cudnn_ms else None
            samattn_tflops = tflop / (ms / 1e3)
            with samattn.use_family(family):
                difference = output(compared) if compared else None
            self._record(
                op=f"attention_{'forward' if direction == 'fwd' else 'backward'}",
                family=ran,
                forced=family is not None,
                dtype=dtype_name,
                shape=list(case[:4]),
                **case._asdict(),
                direction=direction,
                unit="TFLOPS",
                samattn=samattn_tflops,
                baseline=tflop / (flash_ms / 1e3) if flash_ms else None,
                baseline_name="sdpa FLASH_ATTENTION (FlashAttention-2)",
                cudnn=cudnn,
                ratio_to_cudnn=samattn_tflops / cudnn if cudnn else None,
                samattn_ms=ms,
                baseline_ms=flash_ms,
                cudnn_ms=cudnn_ms,
                difference_to_baseline=difference,
                compared_with=compared,
                **extra,
            )

        def forward(family: str | None) -> None:
            ms, ran = self._samattn_ms(family, samattn_forward, sets)

            def output_difference(name: str) -> float:
                return _relative_difference(
                    samattn_forward(*sets[0]), implementations[name](*sets[0])
                )

            def reference(name: str):
                return implementations[name], sets

            record("fwd", family, ms, ran, reference, output_difference)

        def backward_sets(name: str, family: str | None) -> list[tuple]:
            """(out, q, k, v, dout) per input set, out from one forward with requires_grad."""
            graphs = []
            with samattn.use_family(family):
                for inputs in sets:
                    q, k, v = (t.detach().requires_grad_() for t in inputs)
                    graphs.append((implementations[name](q, k, v), q, k, v, dout))
            return graphs

        def gradients(out, q, k, v, dout):
            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        def backward(family: str | None) -> None:
            _lib.set_last_family(_lib.FAMILY_AUTO)
            samattn_graphs = backward_sets("samattn", family)
            forward_ran = _lib.last_family() or "?"
            ms, ran = self._samattn_ms(family, gradients, samattn_graphs)
            if ran == "?":
                # Autograd runs the backward on its own thread, out of sight of the
                # last-family record; it dispatches like the forward.
                ran = forward_ran

            def reference(name: str):
                return gradients, backward_sets(name, None)

            def gradient_difference(name: str) -> float:
                ours = gradients(*samattn_graphs[0])
                theirs = gradients(*backward_sets(name, None)[0])
                return max(_relative_difference(a, b) for a, b in zip(ours, theirs))

            record("bwd", family, ms, ran, reference, gradient_difference)

        self._run_case(f"attention_forward {what}", forward, {"op": "attention_forward", **fields})
        self._run_case(
            f"attention_backward {what}", backward, {"op": "attention_backward", **fields}
        )


# ------------------------------------------------------------ reporting ----


def _shape_text(shape: Sequence[int]) -> str:
    return "x".join(str(s) for s in shape)


def _family_text(r: dict[str, Any]) -> str:
    return r["family"] + ("" if r["forced"] else "*")


TABLE_HEADER = (
    f"{'op':<17} {'family':<6} {'dtype':<5} {'shape':<22} "
    f"{'samattn':>9} {'torch':>9} {'ratio':>6}  unit   "
    "(* automatic family; gemm shape: batch x M x N x K)"
)


def _number(value: float | None, width: int, digits: int) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def _case_text(r: dict[str, Any]) -> str:
    if "what" in r:
        return r["what"]
    return _shape_text(r["shape"]) + (" causal" if r.get("causal") else "")


def _mismatch(r: dict[str, Any]) -> bool:
    difference = r.get("difference_to_baseline")
    return difference is not None and difference > AGREEMENT_LIMIT


def format_record(r: dict[str, Any]) -> str:
    line = (
        f"{r['op']:<17} {_family_text(r):<6} {r['dtype']:<5} {_case_text(r):<22} "
        f"{r['samattn']:>9.1f} {_number(r['baseline'], 9, 1)} {_number(r['ratio'], 6, 2)}  "
        f"{r['unit']}"
    )
    if "ratio_to_copy" in r:
        line += f"  ({r['ratio_to_copy']:.2f} of copy at {r['copy']:.0f} GB/s)"
    if "cudnn" in r:
        line += f"  cudnn {_number(r['cudnn'], 0, 1)} ratio {_number(r['ratio_to_cudnn'], 0, 2)}"
    for key in ("baseline_skipped", "cudnn_skipped"):
        if key in r:
            line += f"  ({key.split('_')[0]} refused: {r[key].splitlines()[0][:80]})"
    if _mismatch(r):
        line += f"  MISMATCH: differs from torch by {r['difference_to_baseline']:.2g}"
    return line


# The targets for the sm80 family's attention: samattn / SDPA flash backend.
ATTENTION_TARGETS = {"attention_forward": 1.0, "attention_backward": 0.9}


def summarize(bench: Bench) -> str:
    """Geometric mean, min and max of the ratios per op x dtype x family."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in bench.records:
        if r["ratio"] is not None:
            groups.setdefault((r["op"], r["dtype"], r["family"]), []).append(r["ratio"])
    lines = ["", "summary: samattn / torch (above 1: samattn is faster)"]
    for (op, dtype, family), ratios in sorted(groups.items()):
        geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines.append(
            f"  {op:<17} {dtype:<5} {family:<6} geomean {geomean:5.2f}  "
            f"min {min(ratios):5.2f}  max {max(ratios):5.2f}  ({len(ratios)} shapes)"
        )
    copies = [r["ratio_to_copy"] for r in bench.records if "ratio_to_copy" in r]
    if copies:
        lines.append(f"  softmax forward vs copy bandwidth: {min(copies):.2f} .. {max(copies):.2f}")
    cudnn: dict[tuple[str, str, str], list[float]] = {}
    for r in bench.records:
        if r.get("ratio_to_cudnn") is not None:
            cudnn.setdefault((r["op"], r["dtype"], r["family"]), []).append(r["ratio_to_cudnn"])
    if cudnn:
        lines.append("summary: samattn / sdpa CUDNN_ATTENTION")
    for (op, dtype, family), ratios in sorted(cudnn.items()):
        geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines.append(
            f"  {op:<17} {dtype:<5} {family:<6} geomean {geomean:5.2f}  "
            f"min {min(ratios):5.2f}  max {max(ratios):5.2f}  ({len(ratios)} shapes)"
        )
    for op, target in ATTENTION_TARGETS.items():
        rows = [r for r in bench.records if r["op"] == op and r["family"] == "sm80"]
        below = [r for r in rows if r["ratio"] is not None and r["ratio"] < target]
        if rows:
            lines.append(
                f"  {op} sm80 target {target:.1f}x flash: {len(rows) - len(below)} of "
                f"{len(rows)} cases meet it"
                + "".join(
                    f"\n    below: {r['dtype']} {_case_text(r)} {r['ratio']:.2f}" for r in below
                )
            )
    for r in bench.records:
        if _mismatch(r):
            lines.append(f"  MISMATCH {r['op']} {r['dtype']} {_case_text(r)} {r['family']}")
    lines += [f"  skipped {s['case']}: {s['reason'].splitlines()[0]}" for s in bench.skipped]
    lines += [f"  ERROR {e}" for e in bench.errors]
    return "\n".join(lines)


def gpu_slug(name: str) -> str:
    """ "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def environment(command: str) -> dict[str, Any]:
    device = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(device)
    runtime, driver = _lib.cuda_versions()
    return {
        "gpu": torch.cuda.get_device_name(device),
        "cc": f"{major}.{minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "samattn": samattn.__version__,
        "samattn_cuda_runtime": f"{runtime // 1000}.{runtime % 1000 // 10}",
        "driver_cuda": f"{driver // 1000}.{driver % 1000 // 10}",
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_plot(records: list[dict[str, Any]], gpu: str, path: Path) -> None:
    """A horizontal bar per record: samattn / torch, with the line at 1."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"note: matplotlib is not installed; no plot written to {path}")
        return
    records = [r for r in records if r["ratio"] is not None]
    labels = [f"{r['op']} {r['dtype']} {_case_text(r)} [{r['family']}]" for r in records]
    colors = {
        "gemm": "tab:blue",
        "softmax_forward": "tab:green",
        "softmax_backward": "tab:olive",
        "attention_forward": "tab:red",
        "attention_backward": "tab:purple",
    }
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.25 * len(records)))
    ax.barh(
        range(len(records)),
        [r["ratio"] for r in records],
        color=[colors.get(r["op"], "tab:gray") for r in records],
    )
    ax.set_xscale("log", base=2)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(records)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("samattn / torch (higher is better; * automatic family)")
    ax.set_title(f"samattn vs torch on {gpu}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot: {path}")


# ------------------------------------------------------------------ CLI ----


def _list_argument(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in allowed]
        if unknown or not items:
            raise argparse.ArgumentTypeError(
                f"{text!r}: choose from {', '.join(allowed)} (comma-separated)"
            )
        return items

    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m samattn.bench",
        description="Benchmark samattn against torch (cuBLAS, torch.softmax, SDPA's flash and "
        "cuDNN attention) on this GPU.",
    )
    parser.add_argument(
        "--ops",
        type=_list_argument(OPS),
        default=list(OPS),
        help="gemm,softmax,attention (default: all)",
    )
    parser.add_argument(
        "--families",
        type=_list_argument(FAMILIES),
        default=["auto"],
        help="kernel families to measure, e.g. sm80,sm75 or auto,sm75 (default: auto, the "
        "family samattn picks for this GPU)",
    )
    parser.add_argument(
        "--json",
        default="benchmarks/results/",
        help="results file, or a folder (ending in /) for <gpu>.json "
        "(default: benchmarks/results/<gpu>.json)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of the ratios here")
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("samattn.bench: torch sees no CUDA GPU; nothing to measure", file=sys.stderr)
        return 2
    command = "python -m samattn.bench" + ("" if not argv else " " + shlex.join(argv))
    env = environment(command)
    json_path = Path(args.json)
    if args.json.endswith("/") or json_path.is_dir():
        json_path = json_path / f"{gpu_slug(env['gpu'])}.json"
    print(
        f"samattn {env['samattn']} on {env['gpu']} (cc {env['cc']}), torch {env['torch']}, "
        f"CUDA {env['cuda']}; families built: {', '.join(samattn.built_families())}"
    )
    print(f"command: {command}\n")

    size = "quick" if args.quick else "full"
    families = [None if name == "auto" else name for name in dict.fromkeys(args.families)]
    bench = Bench(Timer(args.quick), families)
    started = time.perf_counter()
    print(TABLE_HEADER, flush=True)
    if "gemm" in args.ops:
        for dtype_name, shape in GEMM_CASES[size]:
            bench.gemm(dtype_name, shape)
    if "softmax" in args.ops:
        for dtype_name, shape in SOFTMAX_CASES[size]:
            bench.softmax(dtype_name, shape)
            torch.cuda.empty_cache()  # the 64M-element inputs of the next shape need room
    if "attention" in args.ops:
        for dtype_name, case in ATTENTION_CASES[size]:
            bench.attention(dtype_name, case)
            torch.cuda.empty_cache()
    if "overhead" in args.ops:
        print("\neager overhead: host us per call (samattn, torch), ratio = torch / samattn")
        for case in overhead_cases():
            bench.overhead(case)
    print(summarize(bench))
    print(f"\n{len(bench.records)} records in {time.perf_counter() - started:.0f} s")

    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(
        json.dumps({**env, "records": bench.records, "skipped": bench.skipped}, indent=1) + "\n"
    )
    print(f"results: {json_path}")
    if args.plot is not None and bench.records:
        write_plot(bench.records, env["gpu"], args.plot)
    return 1 if bench.errors else 0


if __name__ == "__main__":
    sys.exit(main())
