"""Question: How do samattn's and cuBLAS's split-K kernels (partial GEMM, reduction) compare?

GPU time per kernel (us, mean over 20 calls, torch.profiler) of samattn.gemm and
torch.matmul at issue 17's split-K shapes (bf16, M = N = 256 and 512, K = 65536): the
partial-sum GEMM and the reduction of each. Writes JSON:

    SAMATTN_LIBRARY=... PYTHONPATH=. python benchmarks/profiling/split_k_kernels.py out.json
"""

import json
import sys

import torch

import samattn
from samattn.bench.timing import kernel_means


def main() -> None:
    result: dict = {"gpu": torch.cuda.get_device_name()}
    for mn in (256, 512):
        a = torch.randn(mn, 65536, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(65536, mn, device="cuda", dtype=torch.bfloat16)
        result[f"{mn}_samattn"] = kernel_means(lambda a=a, b=b: samattn.gemm(a, b))
        result[f"{mn}_torch"] = kernel_means(lambda a=a, b=b: torch.matmul(a, b))
    print(json.dumps(result, indent=1))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
