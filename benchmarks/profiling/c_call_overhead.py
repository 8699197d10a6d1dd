"""Question: What does one libsamattn C call cost on the host without the Python layer?

Host time of one libsamattn C call, without the Python layer: what the C side costs.

Runs samattn's op once per case with the library's entry points wrapped, keeps the ctypes
arguments of that call, then calls the entry point directly with them in a tight loop
(synchronizing every `--sync-every` calls, outside the timed region, so that the launch queue
never fills). Prints the median host microseconds per call next to torch's equivalent op.

    python benchmarks/profiling/c_call_overhead.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import samattn
from samattn import _lib


def captured_call(name: str, run: Callable[[], object]) -> tuple[Callable, tuple, object]:
    """(entry point, its arguments from the last call `run` made, run's result)."""
    library = _lib.lib()
    original = getattr(library, name)
    seen: list[tuple] = []

    def spy(*args: object) -> object:
        seen.append(args)
        return original(*args)

    setattr(library, name, spy)
    try:
        result = run()  # kept alive: the captured pointers refer to its tensors
    finally:
        setattr(library, name, original)
    if not seen:
        raise RuntimeError(f"{name} was not called")
    return original, seen[-1], result


def median_us(call: Callable[[], object], calls: int, sync_every: int) -> float:
    for _ in range(50):
        call()
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        start = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - start)
        if (i + 1) % sync_every == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--sync-every", type=int, default=100)
    options = parser.parse_args()
    dev = torch.device("cuda")
    bf16 = torch.bfloat16
    a = torch.randn(1024, 1024, device=dev, dtype=bf16)
    b = torch.randn(1024, 1024, device=dev, dtype=bf16)
    a64 = torch.randn(64, 64, device=dev, dtype=bf16)
    x = torch.randn(64, 1024, device=dev, dtype=bf16)
    q = torch.randn(1, 128, 8, 64, device=dev, dtype=bf16)
    k = torch.randn(1, 512, 8, 64, device=dev, dtype=bf16)
    v = torch.randn(1, 512, 8, 64, device=dev, dtype=bf16)
    q_t, k_t, v_t = (t.transpose(1, 2) for t in (q, k, v))

    cases = [
        ("gemm bf16 1024^3", "samattn_gemm", lambda: samattn.gemm(a, b), lambda: a @ b),
        ("gemm bf16 64^3", "samattn_gemm", lambda: samattn.gemm(a64, a64), lambda: a64 @ a64),
        (
            "softmax 64x1024",
            "samattn_softmax_forward",
            lambda: samattn.softmax(x, -1),
            lambda: torch.softmax(x, -1),
        ),
        (
            "attention fwd b1 sq128 sk512 h8 d64",
            "samattn_attention_forward",
            lambda: samattn.flash_attn_func(q, k, v),
            lambda: F.scaled_dot_product_attention(q_t, k_t, v_t),
        ),
    ]
    print(f"{torch.cuda.get_device_name()}, families built: {_lib.built_families()}")
    print(f"{'call':40s} {'C call us':>10s} {'torch op us':>12s}")
    for label, entry, run, baseline in cases:
        function, args, keep = captured_call(entry, run)
        c_us = median_us(functools.partial(function, *args), options.calls, options.sync_every)
        torch_us = median_us(baseline, options.calls, options.sync_every)
        print(f"{label:40s} {c_us:10.2f} {torch_us:12.2f}  (last family: {_lib.last_family()})")
        del keep


if __name__ == "__main__":
    main()
