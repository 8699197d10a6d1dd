"""Times torch's scaled_dot_product_attention forward on the standalone checkers' grid
(bf16, batch x seqlen = 16k, heads x headdim = 2048, headdim 64/128/256, seqlen 1k/4k/16k,
causal and not) under its FLASH_ATTENTION and CUDNN_ATTENTION backends, so that a checker's
TFLOPS (attn_check, built for either family) can be set against them from the same machine:

    python benchmarks/attention_check/sdpa_times.py out.json

Median of 30 calls timed with CUDA events after a warm-up; (batch, heads, seqlen, d) tensors.
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
    records = []
    print(f"{'d':>4} {'seqlen':>6} {'causal':>6} {'flash':>8} {'cudnn':>8}  TFLOPS")
    for d in (64, 128, 256):
        for seqlen in (1024, 4096, 16384):
            batch, heads = 16384 // seqlen, 2048 // d
            q, k, v = (
                torch.randn(batch, heads, seqlen, d, device="cuda", dtype=torch.bfloat16)
                for _ in range(3)
            )
            for causal in (False, True):
                flops = 4.0 * batch * heads * seqlen * seqlen * d * (0.5 if causal else 1.0)
                row = {"d": d, "seqlen": seqlen, "causal": causal}
                for name, backend in (
                    ("flash", SDPBackend.FLASH_ATTENTION),
                    ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ):
                    with sdpa_kernel(backend):
                        ms = median_ms(lambda q=q, k=k, v=v, c=causal: sdpa(q, k, v, is_causal=c))
                    row[name] = flops / (ms * 1e-3) / 1e12
                records.append(row)
                print(
                    f"{d:4d} {seqlen:6d} {causal!s:>6} {row['flash']:8.1f} {row['cudnn']:8.1f}",
                    flush=True,
                )
    with open(sys.argv[1], "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
