"""Attention backwards with the sm90 family forced, for compute-sanitizer: every head dim
row of its table (d = 64 on 128-row query tiles, and on 64-row ones with dropout; 128;
256 on split roles), odd head dims that pad up to them, lengths that end inside a tile,
causal and sliding windows, softcap, ALiBi, dropout, GQA, the deterministic order, and
varlen batches with sequences of 0 and 1 rows. Prints one line per call with the family
that ran the backward and whether every gradient is finite; exits 1 if one is not.

    compute-sanitizer --tool memcheck --error-exitcode 9 \
        python tests/sanitize/sanitize_sm90_backward.py
    compute-sanitizer --tool racecheck --error-exitcode 9 \
        python tests/sanitize/sanitize_sm90_backward.py --quick

--quick: head dims 64, 128 and 256 and one shape (racecheck is slow).
"""

from __future__ import annotations

import sys

import torch

import samattn
from samattn import _lib


def backward(q, k, v, **kwargs) -> tuple[str, bool]:
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    with samattn.use_family("sm90"):
        out = samattn.flash_attn_func(*leaves, **kwargs)
        grads = torch.autograd.grad(out, leaves, torch.randn_like(out))
        family = _lib.last_family()
    torch.cuda.synchronize()
    return family, all(bool(torch.isfinite(g).all()) for g in grads)


def varlen_backward(d: int, deterministic: bool) -> tuple[str, bool]:
    lengths_q, lengths_k = [0, 1, 129, 300], [3, 0, 200, 300]
    cu = lambda lengths: torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()],  # noqa: E731
                                      dtype=torch.int32, device="cuda")  # fmt: skip
    q = torch.randn(sum(lengths_q), 4, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(sum(lengths_k), 2, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    with samattn.use_family("sm90"):
        out = samattn.flash_attn_varlen_func(
            q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k),
            causal=True, deterministic=deterministic,
        )  # fmt: skip
        grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        family = _lib.last_family()
    torch.cuda.synchronize()
    return family, all(bool(torch.isfinite(g).all()) for g in grads)


def main() -> int:
    torch.manual_seed(0)
    ok = True
    cases = [
        dict(),
        dict(causal=True),
        dict(window_size=(50, 20)),
        dict(softcap=20.0, causal=True),
        dict(alibi_slopes=True),
        dict(dropout_p=0.17),
        dict(dropout_p=0.17, causal=True),
        dict(deterministic=True),
        dict(deterministic=True, causal=True),
    ]
    quick = "--quick" in sys.argv
    dims = (64, 128, 256) if quick else (56, 64, 120, 128, 200, 256)
    shapes = [(113, 203)] if quick else [(113, 203), (203, 113), (257, 257)]
    for d in dims:
        for sq, sk in shapes:
            for case in cases:
                kwargs = dict(case)
                if kwargs.get("alibi_slopes") is True:
                    kwargs["alibi_slopes"] = torch.rand(4, device="cuda")
                q = torch.randn(2, sq, 4, d, dtype=torch.float16, device="cuda")
                k = torch.randn(2, sk, 2, d, dtype=torch.float16, device="cuda")
                v = torch.randn_like(k)
                family, finite = backward(q, k, v, **kwargs)
                ok &= finite
                print(d, sq, sk, sorted(case), family, finite, flush=True)
    for d in (64, 128, 256):
        for deterministic in (False, True):
            family, finite = varlen_backward(d, deterministic)
            ok &= finite
            print("varlen", d, deterministic, family, finite, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
