"""Question: Where does a masked sm90 forward's time go: the tile-map pass or the attention kernel?

Where a masked sm90 forward's time goes: the kernel times (samattn.bench.timing.kernel_means:
torch.profiler, mean of 20 calls after 5 warm-ups) of the plain call and of calls with a
mask, split into the mask's tile-map pass (classify_mask_tiles) and the attention kernel.
Masks: the key padding of samattn.bench (bool, and the same as an additive 0 / -inf
float32 mask), an all-True bool mask (every tile kept whole: the masked kernel's cost with
nothing to skip or read), an all-zero float mask (the same for an additive mask, whose
scale the softmax takes on such tiles) and a random bool mask keeping 90% (every tile cut:
read element by element). PROFILE_DIMS (default 64,128,256) picks the head dims of the
shapes run; PROFILE_BACKWARD=1 times forward + backward calls (the backward's kernels are
listed beside the forward's); OUT the folder of mask_profile.json.

    PROFILE_DIMS=64 python benchmarks/profiling/mask_tile_profile.py
"""

from __future__ import annotations

import functools
import json
import math
import os

import torch

import samattn
from samattn.bench.common import padding_mask
from samattn.bench.timing import kernel_means

SHAPES = [(16, 32, 1024, 64), (1, 32, 16384, 64), (16, 16, 1024, 128), (4, 8, 4096, 256)]


def _forward_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> None:
    out = samattn.flash_attn_func(q, k, v, **kwargs)
    torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


def main() -> None:
    dims = [int(x) for x in os.environ.get("PROFILE_DIMS", "64,128,256").split(",")]
    backward = os.environ.get("PROFILE_BACKWARD") == "1"
    rows = []
    for b, h, s, d in SHAPES:
        if d not in dims:
            continue
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        keep = padding_mask(b, s, "cuda")
        masks = {
            "bool": keep,
            "float": torch.zeros(keep.shape, device="cuda").masked_fill_(~keep, -math.inf),
            "ones_bool": torch.ones_like(keep),
            "zeros_float": torch.zeros(keep.shape, device="cuda"),
            "dense_bool": torch.rand(keep.shape, device="cuda") > 0.1,
        }
        if backward:
            for t in (q, k, v):
                t.requires_grad_()
        for causal in (False, True):
            row: dict = dict(shape=[b, h, s, d], causal=causal, backward=backward)
            call = functools.partial(
                _forward_backward if backward else samattn.flash_attn_func, q, k, v, causal=causal
            )
            row["plain"] = kernel_means(call)
            for name, mask in masks.items():
                row[name] = kernel_means(functools.partial(call, attn_mask=mask))
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(os.path.join(os.environ.get("OUT", "."), "mask_profile.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
