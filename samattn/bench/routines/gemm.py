"""GEMM (--ops gemm): samattn.gemm in TFLOPS (2 * batch * M * N * K flops) against
torch.matmul (cuBLAS) in the same dtype and fp32 precision ("f32": exact, "tf32": tf32
tensor cores for both). Records op "gemm", shape [batch, M, N, K], `config` the plan's
kernel configuration."""

from __future__ import annotations

import torch

import samattn

from ... import _cuda
from .. import cases as bench_cases
from ..common import DTYPES, element_size, randn, relative_difference, shape_text
from ..runner import Bench

OP = "gemm"
HEADER = None
FREES_MEMORY = False


def cases(size: str) -> list[tuple[str, tuple[int, ...]]]:
    return bench_cases.GEMM_CASES[size]


def run(bench: Bench, case: tuple[str, tuple[int, ...]]) -> None:
    dtype_name, shape = case
    batch, m, n, k = shape
    dtype, precision = DTYPES[dtype_name]
    a_shape = (batch, m, k) if batch > 1 else (m, k)
    b_shape = (batch, k, n) if batch > 1 else (k, n)
    count = bench.timer.input_set_count((batch * m * k + batch * k * n) * element_size(dtype_name))
    sets = [(randn(a_shape, dtype), randn(b_shape, dtype)) for _ in range(count)]
    tflop = 2 * batch * m * n * k / 1e12

    def body(family: str | None) -> None:
        saved = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(precision)
        try:
            ms, ran = bench.samattn_ms(family, lambda a, b: samattn.gemm(a, b), sets)
            base_ms = bench.baseline_ms(("gemm", dtype_name, shape), torch.matmul, sets)
            with samattn.use_family(family):
                agreement = relative_difference(samattn.gemm(*sets[0]), torch.matmul(*sets[0]))
                config = _cuda.gemm_plan(*sets[0])[1]
        finally:
            torch.set_float32_matmul_precision(saved)
        bench.record_rate(
            "gemm", family, ran, dtype_name, shape, "TFLOPS", tflop, ms, base_ms,
            "torch.matmul (cuBLAS)", config=config, difference_to_baseline=agreement,
        )  # fmt: skip

    bench.run_case(f"gemm {dtype_name} {shape_text(shape)}", body)
