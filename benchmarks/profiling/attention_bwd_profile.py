"""Question: Where does an attention backward's GPU time go, kernel by kernel, next to
SDPA's flash and cuDNN backwards?

GPU time per kernel of one attention backward: samattn next to SDPA's flash and cuDNN
backends (torch.profiler), bf16, on a few shapes of the issue's grid (batch x seqlen =
16k tokens, heads x head dim = 2048). Shows how much of the difference is the main
kernel and how much the small kernels around it.

    python benchmarks/profiling/attention_bwd_profile.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import samattn

SHAPES = [  # head dim, seqlen, causal
    (64, 1024, False),
    (64, 4096, True),
    (128, 1024, False),
    (128, 1024, True),
    (128, 16384, False),
    (256, 1024, True),
    (256, 4096, False),
]
REPS = 10


def backward_kernel_ms(
    out: torch.Tensor, inputs: tuple[torch.Tensor, ...], dout: torch.Tensor
) -> dict[str, float]:
    """Milliseconds per call of each GPU kernel (and memset) of out's backward."""

    def backward() -> None:
        torch.autograd.grad(out, inputs, dout, retain_graph=True)

    for _ in range(3):
        backward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            backward()
        torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        total_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if total_us:
            times[event.key[:160]] = total_us / REPS / 1e3
    return times


def main(out_path: str) -> None:
    records = []
    for d, seqlen, causal in SHAPES:
        batch, heads = 16384 // seqlen, 2048 // d
        shape = (batch, seqlen, heads, d)
        q, k, v = (
            torch.randn(shape, device="cuda", dtype=torch.bfloat16).requires_grad_()
            for _ in range(3)
        )
        dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        out = samattn.flash_attn_func(q, k, v, causal=causal)
        record = {"d": d, "seqlen": seqlen, "batch": batch, "heads": heads, "causal": causal}
        record["samattn"] = backward_kernel_ms(out, (q, k, v), dout)
        # SDPA's layout: (batch, heads, seqlen, d) views of the same tensors.
        qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
        for name, backend in (
            ("flash", SDPBackend.FLASH_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ):
            with sdpa_kernel(backend):
                out_t = torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=causal
                )
                record[name] = backward_kernel_ms(out_t, (qt, kt, vt), dout.transpose(1, 2))
        records.append(record)
        print(f"d={d} seqlen={seqlen} causal={causal}")
        for name in ("samattn", "flash", "cudnn"):
            times = record[name]
            total, main_ms = sum(times.values()), max(times.values())
            print(
                f"  {name:8s} total {total:7.3f} ms  main kernel {main_ms:7.3f}"
                f"  others {total - main_ms:6.3f}"
            )
    info = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
    }
    with open(out_path, "w") as f:
        json.dump({**info, "unit": "ms per backward call", "records": records}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "attention_bwd_profile.json")
