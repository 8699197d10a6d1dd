"""Split-K (--ops split_k): samattn.gemm on a small output with a long K (M = N = 256 and
512, K = 65536, and three other long-K shapes, bf16; --quick: 256 only), automatic and
with each forced split of SPLIT_K_CHOICES, against torch.matmul (cuBLAS, which splits K
itself): op "gemm_split_k", one record per choice (fields `split_k`, `split_k_mode`,
`config` from the plan); a choice the family cannot run goes to `skipped`."""

from __future__ import annotations

import torch

import samattn

from ... import _cuda
from .. import cases as bench_cases
from ..common import DTYPES, element_size, randn, relative_difference, shape_text, try_call
from ..runner import Bench

OP = "split_k"
HEADER = None
FREES_MEMORY = False


def cases(size: str) -> list[tuple[str, tuple[int, int, int]]]:
    return bench_cases.SPLIT_K_CASES[size]


def run(bench: Bench, case: tuple[str, tuple[int, int, int]]) -> None:
    dtype_name, shape = case
    m, n, k = shape
    dtype, _ = DTYPES[dtype_name]
    count = bench.timer.input_set_count((m * k + k * n) * element_size(dtype_name))
    sets = [(randn((m, k), dtype), randn((k, n), dtype)) for _ in range(count)]
    tflop = 2 * m * n * k / 1e12

    def body(family: str | None) -> None:
        base_ms = bench.baseline_ms(("gemm_split_k", dtype_name, shape), torch.matmul, sets)
        for split_k, mode in bench_cases.SPLIT_K_CHOICES:

            def call(a, b, split_k=split_k, mode=mode):
                return samattn.gemm(a, b, split_k=split_k, split_k_mode=mode)

            with samattn.use_family(family):
                refused = try_call(call, *sets[0])
            if refused is not None:
                bench.skipped.append(
                    {
                        "case": f"split_k {shape_text(shape)} [{family or 'auto'}]",
                        "family": family or "auto",
                        "split_k": split_k,
                        "split_k_mode": mode,
                        "reason": refused,
                    }
                )
                print(f"  skipped split_k={split_k} {mode}: {refused}", flush=True)
                continue
            ms, ran = bench.samattn_ms(family, call, sets)
            with samattn.use_family(family):
                agreement = relative_difference(call(*sets[0]), torch.matmul(*sets[0]))
                config = _cuda.gemm_plan(*sets[0], split_k=split_k, split_k_mode=mode)[1]
            bench.record_rate(
                "gemm_split_k", family, ran, dtype_name, shape, "TFLOPS", tflop, ms, base_ms,
                "torch.matmul (cuBLAS)", split_k=split_k, split_k_mode=mode, config=config,
                difference_to_baseline=agreement,
            )  # fmt: skip

    bench.run_case(f"split_k {dtype_name} {shape_text(shape)}", body)
