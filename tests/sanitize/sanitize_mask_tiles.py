"""Masked attention forwards and backwards with the sm80 family forced, for
compute-sanitizer: masks of whole tiles, which the kernels skip (left out), run unread
(kept whole) or read (cut): key padding with a batch entry that keeps nothing (bool), and
four documents along the queries and keys (additive, with its gradient); head dims 64 and
128, GQA, causal and not, the default and the deterministic backward. Prints one line per
call: head dim, causal, deterministic, the mask's dtype, and whether the output and the
gradients are finite.

    compute-sanitizer --tool memcheck python tests/sanitize/sanitize_mask_tiles.py
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

import samattn

DEVICE = "cuda"


def masks(b: int, sq: int, sk: int) -> Iterator[torch.Tensor]:
    keys, queries = torch.arange(sk, device=DEVICE), torch.arange(sq, device=DEVICE)
    lengths = torch.tensor([sk, sk // 2 + 5, 0][:b], device=DEVICE)
    padding = (keys[None, :] < lengths[:, None])[:, None, None, :].expand(b, 1, sq, sk)
    yield padding.contiguous()
    documents = ((queries * 4 // sq)[:, None] == (keys * 4 // sk)[None, :])[None, None]
    bias = torch.zeros(documents.shape, device=DEVICE).masked_fill(~documents, -math.inf)
    yield bias.requires_grad_()


def main() -> None:
    torch.manual_seed(0)
    b, sq, sk, h, hk = 3, 300, 1000, 4, 2
    for d in (64, 128):
        for causal in (False, True):
            for deterministic in (False, True):
                q = torch.randn(b, sq, h, d, device=DEVICE, dtype=torch.bfloat16)
                k = torch.randn(b, sk, hk, d, device=DEVICE, dtype=torch.bfloat16)
                v = torch.randn_like(k)
                q, k, v = (t.requires_grad_() for t in (q, k, v))
                for mask in masks(b, sq, sk):
                    with samattn.use_family("sm80"):
                        out = samattn.flash_attn_func(
                            q, k, v, causal=causal, attn_mask=mask, deterministic=deterministic
                        )
                        grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
                    torch.cuda.synchronize()
                    finite = all(bool(torch.isfinite(t).all()) for t in (out, *grads))
                    print(d, causal, deterministic, mask.dtype, finite, flush=True)


if __name__ == "__main__":
    main()
