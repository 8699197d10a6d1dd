"""Question: Which sm90 GEMM tile and raster swizzle is fastest per shape (for the plan's
heuristic)?

Tile and swizzle sweep of the sm90 GEMM against torch.matmul, for tuning the plan's
heuristic (cpp/src/gemm/sm90/gemm_sm90_plan.cpp). Needs a Hopper GPU.

    python benchmarks/profiling/tune_sm90_gemm.py [--json out.json]

Each (shape, dtype) is timed with every tile forced (SAMATTN_SM90_GEMM_TILE) and, for the
persistent tiles, raster swizzles 1, 2, 4, 8 (SAMATTN_SM90_GEMM_SWIZZLE); "auto" is the
plan's own choice. Timing: samattn.bench's Timer (device events, median, inputs rotated
past L2).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

import samattn
from samattn import _cuda
from samattn.bench.common import DTYPES
from samattn.bench.timing import Timer

SHAPES = [
    ("bf16", (1024, 1024, 1024)),
    ("bf16", (2048, 2048, 2048)),
    ("bf16", (4096, 4096, 4096)),
    ("bf16", (8192, 8192, 8192)),
    ("bf16", (4096, 4096, 14336)),
    ("bf16", (16384, 14336, 4096)),
    ("f16", (8192, 8192, 8192)),
    ("bf16", (64, 512, 512)),  # x64 batch in the benchmark: here one matrix
    ("tf32", (4096, 4096, 4096)),
]
PERSISTENT = ["128x256_c2x1", "128x128_c1x2"]
STREAM_K = ["128x64_streamk", "128x64_swap_ab"]


def variants(m: int) -> list[tuple[str | None, str | None]]:
    out: list[tuple[str | None, str | None]] = [(None, None)]
    out += [(tile, str(s)) for tile in PERSISTENT for s in (1, 4)]
    if m <= 1024:
        out += [(tile, None) for tile in STREAM_K]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    timer = Timer(quick=True)
    rows = []
    for dtype_name, (m, n, k) in SHAPES:
        dtype, precision = DTYPES[dtype_name]
        torch.set_float32_matmul_precision(precision)
        size = (m * k + k * n) * torch.empty((), dtype=dtype).element_size()
        sets = [
            (torch.randn(m, k, device="cuda").to(dtype), torch.randn(k, n, device="cuda").to(dtype))
            for _ in range(timer.input_set_count(size))
        ]
        tflop = 2 * m * n * k / 1e12
        torch_tflops = tflop / (timer.median_ms(torch.matmul, sets) / 1e3)
        for tile, swizzle in variants(m):
            for name, value in (
                ("SAMATTN_SM90_GEMM_TILE", tile),
                ("SAMATTN_SM90_GEMM_SWIZZLE", swizzle),
            ):
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            config = _cuda.gemm_plan(*sets[0])[1]
            ms = timer.median_ms(samattn.gemm, sets)
            row = {
                "dtype": dtype_name,
                "shape": [m, n, k],
                "forced": tile is not None,
                "config": config,
                "tflops": tflop / (ms / 1e3),
                "torch_tflops": torch_tflops,
            }
            row["ratio"] = row["tflops"] / torch_tflops
            rows.append(row)
            print(
                f"{dtype_name:5} {m}x{n}x{k:<6} {config:45} {row['tflops']:7.1f} "
                f"{torch_tflops:7.1f} {row['ratio']:5.2f}",
                flush=True,
            )
        for name in ("SAMATTN_SM90_GEMM_TILE", "SAMATTN_SM90_GEMM_SWIZZLE"):
            os.environ.pop(name, None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
