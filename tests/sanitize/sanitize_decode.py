"""Decode calls on the sm90 cluster path, to run under compute-sanitizer (memcheck, racecheck,
synccheck): empty and short sequences, GQA, sinks and ALiBi, forced split counts 2-16, d
64/128/256, and the MHA decode step whose chosen split count is lowered.

    compute-sanitizer --tool racecheck python tests/sanitize/sanitize_decode.py
"""

import torch

import samattn

torch.manual_seed(0)
bf16 = dict(device="cuda", dtype=torch.bfloat16)
for d, splits, h, hk in [
    (64, 12, 8, 2),
    (128, 16, 8, 2),
    (128, 0, 32, 32),
    (256, 8, 4, 4),
    (128, 3, 16, 2),
]:
    for terms in (False, True):
        b, cap = 3, 1500
        q = torch.randn(b, 2, h, d, **bf16)
        kc = torch.randn(b, cap, hk, d, **bf16)
        vc = torch.randn_like(kc)
        lens = torch.tensor([0, 5, cap], dtype=torch.int32, device="cuda")
        extra = (
            dict(alibi_slopes=torch.rand(h, device="cuda"), sinks=torch.randn(h, device="cuda"))
            if terms
            else {}
        )
        with samattn.use_family("sm90"):
            out, lse = samattn.flash_attn_with_kvcache(
                q,
                kc,
                vc,
                cache_seqlens=lens,
                causal=True,
                num_splits=splits,
                return_softmax_lse=True,
                **extra,
            )
        torch.cuda.synchronize()
        print(
            d,
            splits,
            h,
            hk,
            terms,
            samattn._lib.last_family(),
            float(out.float().abs().sum()),
            float(lse[1:].sum()),
        )
qd, kd = torch.randn(1, 1, 32, 128, **bf16), torch.randn(1, 512, 32, 128, **bf16)
out = samattn.flash_attn_func(qd, kd, torch.randn_like(kd))
torch.cuda.synchronize()
print("mha decode", samattn._lib.last_family(), float(out.float().abs().sum()))
