"""Question: does a change to samattn's Python layer make an eager call cost more host time?

Answer it on any CPU, without a GPU or a built library: two checkouts' samattn packages
(OLD and NEW, e.g. a worktree of the commit before the change) are copied side by side
into a temporary folder as samattn_old and samattn_new (their torch.library namespace
renamed to match), the library is stubbed (every C entry point returns OK at once), CPU
tensors take the route CUDA tensors take, and the two copies time the same eager calls in
alternating rounds: what is measured is the Python path between the user and the ctypes
call, which is all a Python change can make dearer. Thread CPU time
(time.thread_time_ns), so that a loaded machine's preemption does not count.

    git worktree add /tmp/old HEAD~1
    python benchmarks/profiling/python_layer_ab.py /tmp/old . [--calls 200] [--rounds 41]

Prints per call the minimum and median thread-CPU microseconds of each copy and their
ratios (NEW / OLD). A GPU's own numbers come from samattn.bench --ops overhead.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


class _StubLibrary:
    """Every libsamattn function: returns OK (0) at once and writes nothing."""

    def __getattr__(self, name):
        def function(*args):
            return 0

        return function


def copy_package(tree: Path, name: str, into: Path) -> None:
    """tree/samattn as into/name, its op namespace and torch.ops references renamed."""
    target = into / name
    shutil.copytree(tree / "samattn", target, ignore=shutil.ignore_patterns("lib", "bench*"))
    for path in target.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"samattn::", f"{name}::", text)
        text = re.sub(r"torch\.ops\.samattn\.", f"torch.ops.{name}.", text)
        path.write_text(text)


def stubbed(name: str):
    """The package `name` with its library stubbed and CPU tensors routed as CUDA ones."""
    lib, prepared, cuda, checks, eager = (
        importlib.import_module(f"{name}.{module}")
        for module in ("_lib", "_prepared", "_cuda", "_checks", "_eager")
    )
    lib._library = _StubLibrary()
    prepared._BOUND.clear()
    cuda._stream = lambda t: 0
    checks._check_devices = lambda op, tensors: None
    checks.set_value_checks(False)
    grad_enabled = torch.is_grad_enabled

    def route(*tensors):
        needs_grad = False
        for t in tensors:
            if t is None:
                continue
            if type(t) is not torch.Tensor:
                return eager.DISPATCH
            needs_grad = needs_grad or t.requires_grad
        return eager.AUTOGRAD if needs_grad and grad_enabled() else eager.DIRECT

    eager.route = route
    return importlib.import_module(name)


def cases(s) -> dict:
    """The eager calls timed: the prepared paths, and full paths (score terms, varlen)."""
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    q, k, v = (torch.randn(1, n, 8, 64, dtype=bf16) for n in (16, 64, 64))
    qd, kd, vd = (torch.randn(1, n, 32, 128, dtype=bf16) for n in (1, 64, 64))
    kc, vc = (torch.randn(1, 128, 8, 128, dtype=bf16) for _ in "kv")
    seqlens = torch.full((1,), 100, dtype=torch.int32)
    slopes = torch.rand(8)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    a, b = torch.randn(64, 64, dtype=bf16), torch.randn(64, 64, dtype=bf16)
    packed = torch.randn(80, 8, 64, dtype=bf16)
    cu = torch.tensor([0, 16, 80], dtype=torch.int32)
    return {
        "gemm 64^3 (control)": lambda: s.gemm(a, b),
        "flash_attn_func": lambda: s.flash_attn_func(q, k, v),
        "flash_attn_func causal": lambda: s.flash_attn_func(q, k, v, causal=True),
        "flash_attn_func window softcap": lambda: s.flash_attn_func(
            q, k, v, causal=True, window_size=(64, 0), softcap=30.0
        ),
        "flash_attn_func decode": lambda: s.flash_attn_func(qd, kd, vd),
        "flash_attn_func alibi (full path)": lambda: s.flash_attn_func(
            q, k, v, alibi_slopes=slopes
        ),
        "flash_attn_varlen_func (full path)": lambda: s.flash_attn_varlen_func(
            packed, packed, packed, cu, cu, 64, 64
        ),
        "flash_attn_with_kvcache": lambda: s.flash_attn_with_kvcache(
            qd, kc, vc, cache_seqlens=seqlens
        ),
        "flash_attn_with_kvcache int": lambda: s.flash_attn_with_kvcache(
            qd, kc, vc, cache_seqlens=100
        ),
        "forward + backward": lambda: torch.autograd.grad(
            s.flash_attn_func(qg, kg, vg), (qg, kg, vg), dout
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="a checkout before the change")
    parser.add_argument("new", type=Path, help="a checkout with it")
    parser.add_argument("--calls", type=int, default=200, help="calls per round (200)")
    parser.add_argument("--rounds", type=int, default=41, help="rounds per copy (41)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        for name, tree in (("samattn_old", args.old), ("samattn_new", args.new)):
            copy_package(tree.resolve(), name, Path(folder))
        sys.path.insert(0, folder)
        trees = {name: cases(stubbed(name)) for name in ("samattn_old", "samattn_new")}
        for calls in trees.values():
            for fn in calls.values():
                for _ in range(30):
                    fn()
        samples = {(tree, case): [] for tree in trees for case in trees[tree]}
        for _ in range(args.rounds):
            for case in trees["samattn_old"]:
                for tree in trees:
                    fn = trees[tree][case]
                    started = time.thread_time_ns()
                    for _ in range(args.calls):
                        fn()
                    elapsed = time.thread_time_ns() - started
                    samples[(tree, case)].append(elapsed / args.calls / 1e3)
    print(f"{'thread CPU us per call':<36} {'old min':>8} {'new min':>8} {'ratio':>6}"
          f" {'old med':>8} {'new med':>8} {'ratio':>6}")  # fmt: skip
    for case in trees["samattn_old"]:
        old, new = samples[("samattn_old", case)], samples[("samattn_new", case)]
        om, nm = min(old), min(new)
        od, nd = statistics.median(old), statistics.median(new)
        print(f"{case:<36} {om:8.2f} {nm:8.2f} {nm / om:6.3f} {od:8.2f} {nd:8.2f} {nd / od:6.3f}")


if __name__ == "__main__":
    main()
