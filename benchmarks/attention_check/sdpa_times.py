"""Times torch's scaled_dot_product_attention on the standalone checkers' grid (bf16,
batch x seqlen = 16k, heads x headdim = 2048, headdim 64/128/256, seqlen 1k/4k/16k, causal
and not) under its FLASH_ATTENTION and CUDNN_ATTENTION backends, forward and backward, so
that a checker's TFLOPS (attn_check / attn_bwd_check, built for either family) can be set
against them from the same machine:

    python benchmarks/attention_check/sdpa_times.py out.json [--dims 64,128]

Median of 30 calls timed with CUDA events after a warm-up; (batch, heads, seqlen, d)
tensors. The backward is torch.autograd.grad of one forward's output (FLOPs 2.5 x the
forward's, as the checkers count).
"""

from __future__ import annotations

import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa


def median_ms(fn, reps: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    dims = (64, 128, 256)
    if "--dims" in sys.argv:
        dims = tuple(int(d) for d in sys.argv[sys.argv.index("--dims") + 1].split(","))
    records = []
    print(
        f"{'d':>4} {'seqlen':>6} {'causal':>6} {'flash':>8} {'cudnn':>8} {'flash_bwd':>9} "
        f"{'cudnn_bwd':>9}  TFLOPS"
    )
    for d in dims:
        for seqlen in (1024, 4096, 16384):
            batch, heads = 16384 // seqlen, 2048 // d
            q, k, v = (
                torch.randn(
                    batch, heads, seqlen, d, device="cuda", dtype=torch.bfloat16, requires_grad=True
                )
                for _ in range(3)
            )
            grad = torch.randn(batch, heads, seqlen, d, device="cuda", dtype=torch.bfloat16)
            for causal in (False, True):
                flops = 4.0 * batch * heads * seqlen * seqlen * d * (0.5 if causal else 1.0)
                row = {"d": d, "seqlen": seqlen, "causal": causal}
                for name, backend in (
                    ("flash", SDPBackend.FLASH_ATTENTION),
                    ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ):
                    with sdpa_kernel(backend), torch.no_grad():
                        ms = median_ms(lambda q=q, k=k, v=v, c=causal: sdpa(q, k, v, is_causal=c))
                    row[name] = flops / (ms * 1e-3) / 1e12
                    with sdpa_kernel(backend):
                        out = sdpa(q, k, v, is_causal=causal)
                        ms = median_ms(
                            lambda out=out, inputs=(q, k, v), grad=grad: torch.autograd.grad(
                                out, inputs, grad, retain_graph=True
                            )
                        )
                    row[name + "_bwd"] = 2.5 * flops / (ms * 1e-3) / 1e12
                    del out
                records.append(row)
                print(
                    f"{d:4d} {seqlen:6d} {causal!s:>6} {row['flash']:8.1f} {row['cudnn']:8.1f} "
                    f"{row['flash_bwd']:9.1f} {row['cudnn_bwd']:9.1f}",
                    flush=True,
                )
    with open(sys.argv[1], "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
