"""Question: Which part of attention dropout costs the time: the terms kernel, drawing the
mask, or dropping?

Where attention dropout's cost goes, per family: the forward without score terms
(plain), with the kernel that carries them but no dropout (sinks, all zero), with dropout
that keeps everything (dropout_p = 1e-3, below 1/512: masks drawn and applied, nothing
dropped) and with dropout_p = 0.1. bf16, batch x seqlen = 16k tokens, heads x d = 2048;
GPU ms per call, median of 20 (CUDA events). Writes JSON:

    SAMATTN_LIBRARY=... PYTHONPATH=. python benchmarks/profiling/attention_dropout_probe.py out.json
"""

import json
import sys

import torch

import samattn
from samattn.bench.timing import gpu_ms


def calls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> dict:
    sinks = torch.zeros(q.shape[2], device=q.device)
    return {
        "plain": lambda: samattn.flash_attn_func(q, k, v, causal=causal),
        "sinks": lambda: samattn.flash_attn_func(q, k, v, causal=causal, sinks=sinks),
        "p_tiny": lambda: samattn.flash_attn_func(q, k, v, 1e-3, causal=causal),
        "p0.1": lambda: samattn.flash_attn_func(q, k, v, 0.1, causal=causal),
    }


def main() -> None:
    rows = []
    for d, seqlen, causal in ((128, 4096, False), (128, 1024, False), (64, 4096, False),
                              (128, 4096, True)):  # fmt: skip
        batch, heads = 16384 // seqlen, 2048 // d
        q, k, v = (
            torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16)
            for _ in range(3)
        )
        variants = calls(q, k, v, causal)
        for family in ("sm90", "sm80"):
            with samattn.use_family(family):
                row = {"d": d, "seqlen": seqlen, "causal": causal, "family": family}
                row.update({name: gpu_ms(fn) for name, fn in variants.items()})
            rows.append(row)
            print(row, {n: round(row[n] / row["plain"], 2) for n in ("sinks", "p_tiny", "p0.1")})
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
