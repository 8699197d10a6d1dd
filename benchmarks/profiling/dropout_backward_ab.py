"""Question: What does dropout cost the attention backward on the sm90 and sm80 families?

GPU time of the attention backward with dropout on the sm90 and sm80 families, and of
the sm90 backward without dropout, in one run: the backward op alone (the forward's
outputs computed once), median of 20 calls after 3 warm-ups, CUDA events. One JSON line.

    python benchmarks/profiling/dropout_backward_ab.py
"""

from __future__ import annotations

import json

import torch

import samattn
from samattn import _cuda, _dropout
from samattn._checks import AttentionParams
from samattn.bench.timing import gpu_ms

SHAPES = [  # batch, seqlen, heads, head dim, causal
    (16, 1024, 32, 64, False),
    (4, 4096, 16, 128, False),
    (4, 4096, 16, 128, True),
    (4, 4096, 8, 256, False),
]


def backward_ms(family: str, p: float, shape: tuple) -> float:
    b, s, h, d, causal = shape
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    seed = _dropout.new_seed(q.device) if p else None
    params = AttentionParams(d**-0.5, causal, -1, -1, 0.0, dropout_p=p, dropout_seed=seed)
    out, lse = _cuda.flash_attn_forward(q, k, v, params)

    def call():
        return _cuda.flash_attn_backward(dout, q, k, v, out, lse, params)

    with samattn.use_family(family):
        ms = gpu_ms(call)
        ran = samattn._lib.last_family()
    assert ran == family, f"{family} forced, {ran} ran"
    return ms


def main() -> None:
    rows = []
    for shape in SHAPES:
        plain = backward_ms("sm90", 0.0, shape)
        sm90 = backward_ms("sm90", 0.1, shape)
        sm80 = backward_ms("sm80", 0.1, shape)
        rows.append(
            {"shape": shape, "sm90_plain_ms": plain, "sm90_dropout_ms": sm90,
             "sm80_dropout_ms": sm80, "sm90_over_sm80": sm80 / sm90, "cost": plain / sm90}
        )  # fmt: skip
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}))


if __name__ == "__main__":
    main()
