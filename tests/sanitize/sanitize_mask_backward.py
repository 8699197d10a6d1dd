"""Masked attention forwards and backwards with the sm90 family forced, for
compute-sanitizer: bool and additive masks (the additive one with its gradient) in the
broadcast shapes a user passes, at head dims 64, 128 and 256, with causal, ALiBi, GQA,
several key and query tiles, and lengths that end inside a tile; masks of whole tiles (key
padding with a batch entry that keeps nothing, a causal float mask), which the kernels
skip or run unread, with the deterministic backward. Prints one line per call
with the family that ran each direction and whether every output is finite.

    compute-sanitizer --tool memcheck --error-exitcode 9 \\
        python tests/sanitize/sanitize_mask_backward.py
"""

from __future__ import annotations

import torch

import samattn
from samattn import _lib


def main() -> None:
    torch.manual_seed(0)
    cuda = dict(device="cuda")
    for d in (64, 128, 256):
        for sq, sk, causal in [(113, 203, False), (203, 113, True), (300, 700, False)]:
            q = torch.randn(2, sq, 4, d, dtype=torch.bfloat16, **cuda)
            k = torch.randn(2, sk, 2, d, dtype=torch.bfloat16, **cuda)
            v = torch.randn_like(k)
            dout = torch.randn_like(q)
            keys = torch.arange(sk, **cuda)
            lengths = torch.tensor([sk // 2 + 3, 0], **cuda)
            padding = (keys < lengths[:, None])[:, None, None, :].expand(2, 1, sq, sk)
            below = keys[None, :] <= torch.arange(sq, **cuda)[:, None] + sk - sq
            masks = (
                torch.rand(2, 1, sq, sk, **cuda) > 0.3,
                torch.randn(1, 4, sq, sk, **cuda),
                (torch.rand(sk, **cuda) > 0.5).expand(2, 1, 1, sk),
                padding.contiguous(),
                torch.zeros(sq, sk, **cuda).masked_fill(~below, float("-inf")),
            )
            for i, mask in enumerate(masks):
                leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
                leaf = mask.detach().clone().requires_grad_(mask.is_floating_point())
                with samattn.use_family("sm90"):
                    out = samattn.flash_attn_func(
                        *leaves, causal=causal, attn_mask=leaf,
                        alibi_slopes=torch.rand(4, **cuda), deterministic=i >= 3,
                    )  # fmt: skip
                    forward = _lib.last_family()
                    inputs = leaves + ([leaf] if leaf.requires_grad else [])
                    grads = torch.autograd.grad(out, inputs, dout)
                torch.cuda.synchronize()
                finite = all(bool(torch.isfinite(t).all()) for t in (out, *grads))
                print(d, sq, sk, causal, mask.dtype, tuple(mask.shape), forward, finite)
    # The backward's family, from this thread: the op called directly.
    q = torch.randn(1, 256, 2, 64, dtype=torch.float16, **cuda)
    k, v = torch.randn_like(q), torch.randn_like(q)
    mask = torch.randn(1, 1, 256, 256, **cuda)
    out, lse, _ = samattn.flash_attn_func(q, k, v, attn_mask=mask, return_attn_probs=True)
    args = (torch.randn_like(out), q, k, v, out, lse, mask, 64**-0.5, False, -1, -1, 0.0, False)
    with samattn.use_family("sm90"):
        torch.ops.samattn.flash_attn_masked_backward(*args)
    torch.cuda.synchronize()
    print("backward family", _lib.last_family())


if __name__ == "__main__":
    main()
