"""Linear with a fused epilogue (--ops linear): samattn.linear(x, w, b, activation="gelu"),
bf16, LLM shapes (tokens 4096/16384 x (4096 -> 14336) and (14336 -> 4096)), against
F.gelu(F.linear(x, w, b)) in eager torch and compiled with torch.compile (default mode, one
compilation per shape before timing): op "linear_epilogue", one record per baseline
(`versus`, `baseline_name`), in TFLOPS of the GEMM (2 * tokens * in * out)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import samattn

from .. import cases as bench_cases
from ..common import DTYPES, randn, relative_difference
from ..runner import Bench

OP = "linear"
HEADER = None
FREES_MEMORY = True


def cases(size: str) -> list[tuple[str, tuple[int, int, int]]]:
    return bench_cases.LINEAR_CASES[size]


def run(bench: Bench, case: tuple[str, tuple[int, int, int]]) -> None:
    dtype_name, shape = case
    tokens, n_in, n_out = shape
    dtype, _ = DTYPES[dtype_name]
    sets = [
        (randn((tokens, n_in), dtype), randn((n_out, n_in), dtype) * 0.02, randn((n_out,), dtype))
    ]
    tflop = 2 * tokens * n_in * n_out / 1e12

    def eager(x, w, b):
        return F.gelu(F.linear(x, w, b))

    compiled = torch.compile(eager, fullgraph=True)
    try:
        compiled(*sets[0])  # compile before timing
        baselines = (("eager", eager), ("compiled", compiled))
    except Exception as error:  # no working inductor here: eager torch only
        print(f"  torch.compile refused linear: {str(error).splitlines()[0]}", flush=True)
        baselines = (("eager", eager),)

    def body(family: str | None) -> None:
        ms, ran = bench.samattn_ms(
            family, lambda x, w, b: samattn.linear(x, w, b, activation="gelu"), sets
        )
        with samattn.use_family(family):
            out = samattn.linear(*sets[0], activation="gelu")
        agreement = relative_difference(out, eager(*sets[0]))
        for name, fn in baselines:
            base_ms = bench.baseline_ms(("linear", name, dtype_name, shape), fn, sets)
            bench.record_rate(
                "linear_epilogue", family, ran, dtype_name, shape, "TFLOPS", tflop, ms, base_ms,
                f"F.gelu(F.linear(x, w, b)), torch {name}", versus=name,
                difference_to_baseline=agreement,
            )  # fmt: skip

    bench.run_case(f"linear {dtype_name} {'x'.join(map(str, shape))}", body)
