"""Question: At which shapes is the forward under a key-padding mask slow, against the
plain, all-True-mask and causal calls?

Forward time of attention under a key-padding mask over a few shapes (GPU time, median
of 20 calls after 3 warm-ups, CUDA events: samattn.bench.timing.gpu_ms), beside the
same call without a mask, with an all-True mask, and causal with the mask
(flash_attn_func(causal=True, attn_mask=...)).

    python benchmarks/profiling/attention_mask_sweep.py out.json

Written to find which shapes made the masked forward slow (the sm80 row for short key
loops, which masked calls no longer take); benchmarks/results/h100_attention_mask_sweep.json
holds its H100 runs before and after that change.
"""

from __future__ import annotations

import json
import sys

import torch

import samattn
from samattn.bench.common import padding_mask
from samattn.bench.timing import gpu_ms

SHAPES = [  # (batch, heads, seqlen, head dim)
    (16, 32, 1024, 64),
    (4, 32, 1024, 64),
    (1, 32, 1024, 64),
    (16, 32, 1024, 128),
    (16, 16, 1024, 128),
    (4, 32, 4096, 64),
    (4, 16, 4096, 128),
    (16, 32, 512, 64),
    (16, 32, 2048, 64),
]


def measure(b: int, h: int, s: int, d: int) -> dict[str, object]:
    """One shape's row: the times of the four calls and the family of the masked one."""
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    keep = padding_mask(b, s, q.device)
    every_key = torch.ones(b, 1, s, s, device="cuda", dtype=torch.bool)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    sdpa = samattn.scaled_dot_product_attention
    return {
        "shape": [b, h, s, d],
        "plain_ms": gpu_ms(lambda: sdpa(q, k, v)),
        "padding_mask_ms": gpu_ms(lambda: sdpa(q, k, v, attn_mask=keep)),
        "all_true_mask_ms": gpu_ms(lambda: sdpa(q, k, v, attn_mask=every_key)),
        "causal_padding_mask_ms": gpu_ms(
            lambda: samattn.flash_attn_func(qt, kt, vt, causal=True, attn_mask=keep)
        ),
        "masked_family": samattn._lib.last_family(),
    }


def main(path: str) -> None:
    rows = []
    for shape in SHAPES:
        rows.append(measure(*shape))
        print(rows[-1], flush=True)
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "python benchmarks/profiling/attention_mask_sweep.py out.json",
        "rows": rows,
    }
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
