"""Question: Where does a linear layer's time go: the GEMM, the bias, the activation?

Where a linear layer's time goes: the plain GEMM, + bias, + each activation, against
torch's matmul, F.linear and F.gelu(F.linear), bf16, issue 17's MLP shapes.

    python benchmarks/profiling/linear_probe.py OUT.json

GPU time per call from samattn.bench's Timer (median, GPU kept busy while calls queue),
reported in TFLOPS of the GEMM (2 * tokens * in * out). Results on the H100:
benchmarks/results/h100_linear_probe.json.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

import samattn
from samattn.bench.timing import Timer

SHAPES = ((16384, 4096, 14336), (4096, 4096, 14336), (16384, 14336, 4096))


def main(path: str) -> None:
    timer = Timer(False)
    rows = []
    for tokens, n_in, n_out in SHAPES:
        x = torch.randn(tokens, n_in, device="cuda").bfloat16()
        w = (torch.randn(n_out, n_in, device="cuda") * 0.02).bfloat16()
        b = torch.randn(n_out, device="cuda").bfloat16()
        sets = [(x, w, w.mT.contiguous(), b)]  # w.mT.contiguous(): (in, out), the NN layout
        cases = {
            "samattn gemm x@w.mT": lambda x, w, w_t, b: samattn.gemm(x, w.mT),
            "samattn gemm NN": lambda x, w, w_t, b: samattn.gemm(x, w_t),
            "samattn linear bias": lambda x, w, w_t, b: samattn.linear(x, w, b),
            **{
                f"samattn linear {act}": (
                    lambda x, w, w_t, b, act=act: samattn.linear(x, w, b, activation=act)
                )
                for act in ("relu", "gelu", "gelu_tanh", "silu")
            },
            "torch matmul x@w.mT": lambda x, w, w_t, b: torch.matmul(x, w.mT),
            "torch matmul NN": lambda x, w, w_t, b: torch.matmul(x, w_t),
            "torch F.linear bias": lambda x, w, w_t, b: F.linear(x, w, b),
            "torch gelu(F.linear)": lambda x, w, w_t, b: F.gelu(F.linear(x, w, b)),
        }
        row: dict[str, object] = {"shape": [tokens, n_in, n_out]}
        tflop = 2 * tokens * n_in * n_out / 1e12
        for name, fn in cases.items():
            timer.median_ms(fn, sets)  # warm-up round
            row[name] = round(tflop / (timer.median_ms(fn, sets) / 1e3), 1)
            print(f"{tokens}x{n_in}x{n_out} {name:<28} {row[name]:7.1f} TFLOPS", flush=True)
        rows.append(row)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
