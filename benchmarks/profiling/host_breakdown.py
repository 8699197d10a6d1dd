"""Question: Where does an eager samattn call spend its host time, function by function?

Where an eager samattn call spends its host time: a per-function breakdown.

For each call of `samattn.bench --ops overhead`, runs the call in a tight loop twice: once
plain (the total, next to torch's op), once with the Python functions on its way (and the
library's entry points) wrapped by a timer, which gives each one's inclusive microseconds per
call. Then times the primitives a call is made of in isolation (a ctypes call, an output
allocation, a tensor attribute, a trivial autograd.Function round trip), so that the rest
can be attributed. Writes JSON.

    python benchmarks/profiling/host_breakdown.py out.json [--calls 200] [--rounds 15]
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import functools
import json
import sys
import time
from collections.abc import Callable

import torch

from samattn import _checks, _cuda, _eager, _lib, _prepared, attention, ops
from samattn.bench.routines.overhead import overhead_cases
from samattn.bench.timing import host_us

# (module, attribute) pairs wrapped by the timer: the Python on the way from the user to
# the library, and back through autograd.
WRAPPED = [
    (_eager, "route"),
    (_checks, "gemm_quick"),
    (_checks, "softmax_quick"),
    (_checks, "attention_sizes"),
    (_checks, "attention_params"),
    (_checks, "flash_attn_backward"),
    (_cuda, "gemm"),
    (_cuda, "_gemm_args"),
    (_cuda, "softmax"),
    (_cuda, "softmax_backward"),
    (_cuda, "_run_softmax"),
    (_cuda, "flash_attn_forward"),
    (_cuda, "flash_attn_backward"),
    (_cuda, "_attention_args"),
    (_prepared, "run_with_workspace"),
    (_cuda, "_stream"),
    (_prepared.Calls, "run"),
    (_prepared.Calls, "args"),
    (_lib, "check"),
    (_lib, "set_last_family"),
    (attention, "_attention"),
    (attention, "_forward_grad"),
    (attention, "_forward_setup_context"),
    (ops, "_gemm_backward"),
    (ops, "_softmax_grad"),
]
ENTRY_POINTS = [
    "samattn_gemm",
    "samattn_gemm_workspace_size",
    "samattn_softmax_forward",
    "samattn_softmax_backward",
    "samattn_attention_forward",
    "samattn_attention_forward_workspace_size",
    "samattn_attention_backward",
    "samattn_attention_backward_workspace_size",
]


def instrumented_us(fn: Callable[[], object], calls: int) -> dict[str, float]:
    """Inclusive host microseconds per call of `fn` spent in each wrapped function."""
    spent: dict[str, int] = collections.defaultdict(int)
    originals = []

    def wrap(name: str, target: Callable) -> Callable:
        clock = time.perf_counter_ns

        @functools.wraps(target)
        def timed(*args, **kwargs):
            start = clock()
            try:
                return target(*args, **kwargs)
            finally:
                spent[name] += clock() - start

        return timed

    for module, attribute in WRAPPED:
        if hasattr(module, attribute):
            original = getattr(module, attribute)
            originals.append((module, attribute, original))
            setattr(module, attribute, wrap(f"{module.__name__}.{attribute}", original))
    library = _lib.lib()
    for entry in ENTRY_POINTS:
        original = getattr(library, entry)
        originals.append((library, entry, original))
        setattr(library, entry, wrap(entry, original))
    # Modules that imported a wrapped function by name keep the original: patch them too.
    try:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        spent.clear()
        started = time.perf_counter_ns()
        done = 0
        for _ in range(10):
            for _ in range(calls):
                fn()
            done += calls
            torch.cuda.synchronize()
        total = time.perf_counter_ns() - started
    finally:
        for owner, attribute, original in reversed(originals):
            setattr(owner, attribute, original)
    result = {name: ns / done / 1e3 for name, ns in sorted(spent.items(), key=lambda kv: -kv[1])}
    result["(whole call, instrumented, sync included)"] = total / done / 1e3
    return result


def primitives(calls: int, rounds: int) -> dict[str, float]:
    """Host microseconds of the pieces a call is made of."""
    dev = torch.device("cuda")
    q = torch.randn(1, 128, 8, 64, device=dev, dtype=torch.bfloat16)
    x = torch.randn(64, 1024, device=dev)
    library = _lib.lib()
    version = library.samattn_abi_version
    size_query = library.samattn_attention_forward_workspace_size
    args = _lib.blank(_lib.AttentionArgs) if hasattr(_lib, "AttentionArgs") else None
    needed = ctypes.c_int64()

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, g):
            return g

    xg = x.clone().requires_grad_()
    g = torch.randn_like(x)
    out = {
        "ctypes call, no arguments (samattn_abi_version)": host_us(version, calls, rounds),
        "ctypes.byref x2 + c_int64()": host_us(
            lambda: (ctypes.byref(needed), ctypes.byref(needed), ctypes.c_int64()), calls, rounds
        ),
        "torch.empty_like(q)": host_us(lambda: torch.empty_like(q), calls, rounds),
        "q.new_empty(shape, dtype=float32)": host_us(
            lambda: q.new_empty((1, 8, 128), dtype=torch.float32), calls, rounds
        ),
        "q.data_ptr()": host_us(q.data_ptr, calls, rounds),
        "q.stride()": host_us(q.stride, calls, rounds),
        "q.shape": host_us(lambda: q.shape, calls, rounds),
        "q.is_cuda": host_us(lambda: q.is_cuda, calls, rounds),
        "q.get_device()": host_us(q.get_device, calls, rounds),
        "q.is_contiguous()": host_us(q.is_contiguous, calls, rounds),
        "_cuda._stream(q)": host_us(lambda: _cuda._stream(q), calls, rounds),
        "_eager.route(q, q, q)": host_us(lambda: _eager.route(q, q, q), calls, rounds),
        "torch.cuda._sleep(0) (a bare launch from Python)": host_us(
            lambda: torch.cuda._sleep(0), calls, rounds
        ),
        "torch.Tensor.add_(x, 0) (a torch op with a launch)": host_us(
            lambda: x.add_(0), calls, rounds
        ),
        "autograd.grad(Identity.apply(x)) (a Python Function round trip)": host_us(
            lambda: torch.autograd.grad(Identity.apply(xg), (xg,), g), calls, rounds
        ),
        "autograd.grad(x.view_as(x)) (torch's own node)": host_us(
            lambda: torch.autograd.grad(xg.view_as(xg), (xg,), g), calls, rounds
        ),
    }
    if args is not None:
        ref = ctypes.byref(args)
        out["ctypes call, 2 byref args (workspace query, fails fast)"] = host_us(
            lambda: size_query(ref, ctypes.byref(needed)), calls, rounds
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args()
    report: dict[str, object] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "command": "python benchmarks/profiling/host_breakdown.py " + " ".join(sys.argv[1:]),
        "cases": {},
    }
    for case in overhead_cases():
        total = host_us(case.samattn, options.calls, options.rounds)
        baseline = host_us(case.torch, options.calls, options.rounds)
        parts = instrumented_us(case.samattn, options.calls)
        report["cases"][case.what] = {
            "samattn_us": total,
            "torch_us": baseline,
            "ratio": baseline / total,
            "inclusive_us": parts,
            "family": _lib.last_family(),
        }
        print(f"\n{case.what}: samattn {total:.1f} us, torch {baseline:.1f} us")
        for name, us in parts.items():
            print(f"    {us:8.2f}  {name}")
    report["primitives_us"] = primitives(options.calls, options.rounds)
    print("\nprimitives")
    for name, us in report["primitives_us"].items():
        print(f"    {us:8.2f}  {name}")
    with open(options.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
