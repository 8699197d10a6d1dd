"""Question: How does one samattn GEMM compare with cuBLAS's in Nsight Compute?

One samattn.gemm and one torch.matmul call on the same inputs, for a profiler:

    ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \\
        --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \\
        --launch-skip 4 python benchmarks/profiling/profile_gemm.py bf16 4096 4096 4096

Both are warmed up twice first (4 launches to skip when each GEMM is one kernel).
"""

from __future__ import annotations

import sys

import torch

import samattn

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}


def main() -> None:
    dtype_name, m, n, k = sys.argv[1], *map(int, sys.argv[2:5])
    if dtype_name == "tf32":
        torch.set_float32_matmul_precision("high")
    a = torch.randn(m, k, device="cuda").to(DTYPES[dtype_name])
    b = torch.randn(k, n, device="cuda").to(DTYPES[dtype_name])
    for _ in range(2):
        samattn.gemm(a, b)
        torch.matmul(a, b)
    torch.cuda.synchronize()
    samattn.gemm(a, b)
    torch.matmul(a, b)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
