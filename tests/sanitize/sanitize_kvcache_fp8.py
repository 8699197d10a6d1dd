"""fp8 KV caches under compute-sanitizer (memcheck, racecheck, synccheck): the in-place
widening of each K and V tile in shared memory (two barriers per tile), the append's
quantized writes, on the sm90 cluster path and sm80's kernel and combine; e4m3 and e5m2,
d 64 and 128, contiguous and paged caches, empty and short sequences, GQA, forced splits.

    compute-sanitizer --tool racecheck python tests/sanitize/sanitize_kvcache_fp8.py
"""

import torch

import samattn

torch.manual_seed(0)
bf16 = dict(device="cuda", dtype=torch.bfloat16)
for family in ("sm90", "sm80"):
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
        for d, splits, h, hk, page in [(64, 4, 8, 2, 0), (128, 0, 8, 8, 0), (128, 3, 16, 2, 16)]:
            b, cap = 3, 704
            q = torch.randn(b, 1, h, d, **bf16)
            lens = torch.tensor([0, 5, cap - 1], dtype=torch.int32, device="cuda")
            k_scale = torch.rand(hk, device="cuda") + 0.5
            if page:
                pages = b * cap // page
                kc = torch.randn(pages, page, hk, d, **bf16).to(fp8)
                table = torch.randperm(pages, device="cuda", dtype=torch.int32).view(b, -1)
            else:
                kc = torch.randn(b, cap, hk, d, **bf16).to(fp8)
                table = None
            vc = torch.randn(kc.shape, **bf16).to(fp8)
            k_new = torch.randn(b, 1, hk, d, **bf16)
            with samattn.use_family(family):
                out = samattn.flash_attn_with_kvcache(
                    q, kc, vc, k=k_new, v=torch.randn_like(k_new), cache_seqlens=lens,
                    block_table=table, causal=True, num_splits=splits, k_scale=k_scale,
                    v_scale=0.75,
                )  # fmt: skip
            torch.cuda.synchronize()
            print(family, fp8, d, splits, h, hk, page, samattn._lib.last_family(),
                  float(out.float().abs().sum()))  # fmt: skip
