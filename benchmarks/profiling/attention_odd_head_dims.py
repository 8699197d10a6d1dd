"""Question: What do head dims that are not multiples of 8 cost against the multiples of 8
around them?

Forward and backward TFLOPS of head dims that are not multiples of 8 (rows moved
element by element) next to the multiples of 8 around them (16-byte vectors).

    python benchmarks/profiling/attention_odd_head_dims.py OUT.json

bf16, batch 4 x 4096 tokens x 16 heads, causal, the automatic family; CUDA events,
median of 20 runs (FLOPs as samattn.bench counts them).
"""

from __future__ import annotations

import json
import sys

import torch

import samattn
from samattn.bench.timing import gpu_ms

HEAD_DIMS = (96, 100, 120, 128)
BATCH, SEQLEN, HEADS = 4, 4096, 16


def time_head_dim(d: int) -> dict:
    shape = (BATCH, SEQLEN, HEADS, d)
    q, k, v = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    dout = torch.randn_like(q)
    fwd = gpu_ms(lambda: samattn.flash_attn_func(q, k, v, causal=True))
    out = samattn.flash_attn_func(q, k, v, causal=True)
    bwd = gpu_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    flop = 4 * BATCH * HEADS * SEQLEN * SEQLEN * d / 2
    tflops = {"fwd_tflops": flop / fwd / 1e9, "bwd_tflops": 2.5 * flop / bwd / 1e9}
    sizes = {"d": d, "batch": BATCH, "seqlen": SEQLEN, "heads": HEADS, "causal": True}
    return {**sizes, "fwd_ms": fwd, "bwd_ms": bwd, **tflops}


def main(path: str) -> None:
    rows = []
    for d in HEAD_DIMS:
        rows.append(time_head_dim(d))
        print(rows[-1], flush=True)
    result = dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        command="python benchmarks/profiling/attention_odd_head_dims.py OUT.json",
        rows=rows,
    )
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
