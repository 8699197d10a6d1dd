"""Softmax (--ops softmax): samattn.softmax over the last dim in GB/s of the minimum
traffic (forward reads x and writes y: 2 * numel * element size; backward reads y and dy
and writes dx: 3x) against torch.softmax and torch._softmax_backward_data; the forward also
against a device-to-device copy of the same bytes (y.copy_(x): `copy`, `ratio_to_copy`),
the bandwidth a softmax could reach. Ops "softmax_forward", "softmax_backward"."""

from __future__ import annotations

import torch

import samattn

from .. import cases as bench_cases
from ..common import DTYPES, nbytes, randn, relative_difference, shape_text
from ..runner import Bench

OP = "softmax"
HEADER = None
FREES_MEMORY = True  # the 64M-element inputs of the next shape need room


def cases(size: str) -> list[tuple[str, tuple[int, ...]]]:
    return bench_cases.SOFTMAX_CASES[size]


def run(bench: Bench, case: tuple[str, tuple[int, ...]]) -> None:
    dtype_name, shape = case
    dtype = DTYPES[dtype_name][0]
    x = randn(shape, dtype)
    count = bench.timer.input_set_count(nbytes(x))
    xs = [(x,)] + [(randn(shape, dtype),) for _ in range(count - 1)]
    forward_gb = 2 * nbytes(x) / 1e9
    backward_gb = 3 * nbytes(x) / 1e9
    # Backward inputs: a valid y = softmax(x) and a random dy.
    backward_sets = [(torch.softmax(x, -1), randn(shape, dtype)) for (x,) in xs]

    def forward(family: str | None) -> None:
        ms, ran = bench.samattn_ms(family, lambda x: samattn.softmax(x, -1), xs)
        key = ("softmax_forward", dtype_name, shape)
        base_ms = bench.baseline_ms(key, lambda x: torch.softmax(x, -1), xs)
        copy_sets = [(x, torch.empty_like(x)) for (x,) in xs]
        copy_ms = bench.baseline_ms(("copy", *key), lambda x, y: y.copy_(x), copy_sets)
        del copy_sets
        with samattn.use_family(family):
            agreement = relative_difference(samattn.softmax(x, -1), torch.softmax(x, -1))
        bench.record_rate(
            "softmax_forward", family, ran, dtype_name, shape, "GB/s", forward_gb, ms, base_ms,
            "torch.softmax", copy=forward_gb / (copy_ms / 1e3), ratio_to_copy=copy_ms / ms,
            difference_to_baseline=agreement,
        )  # fmt: skip

    def backward(family: str | None) -> None:
        def samattn_backward(y, dy):
            return torch.ops.samattn.softmax_backward(y, dy, -1)

        def torch_backward(y, dy):
            return torch._softmax_backward_data(dy, y, -1, dtype)

        ms, ran = bench.samattn_ms(family, samattn_backward, backward_sets)
        key = ("softmax_backward", dtype_name, shape)
        base_ms = bench.baseline_ms(key, torch_backward, backward_sets)
        with samattn.use_family(family):
            agreement = relative_difference(
                samattn_backward(*backward_sets[0]), torch_backward(*backward_sets[0])
            )
        bench.record_rate(
            "softmax_backward", family, ran, dtype_name, shape, "GB/s", backward_gb, ms, base_ms,
            "torch._softmax_backward_data", difference_to_baseline=agreement,
        )  # fmt: skip

    bench.run_case(f"softmax_forward {dtype_name} {shape_text(shape)}", forward)
    bench.run_case(f"softmax_backward {dtype_name} {shape_text(shape)}", backward)
