"""Question: Is one version of the Python layer's KV-cache call cheaper on the host than another?

Host time per eager flash_attn_with_kvcache call against torch's
scaled_dot_product_attention on the same decode step, as one JSON line: to compare two
versions of the Python layer on one library, run it with each on PYTHONPATH in
alternating processes.

    PYTHONPATH=/path/to/old python benchmarks/profiling/kvcache_host.py >> ab.jsonl
    PYTHONPATH=/path/to/new python benchmarks/profiling/kvcache_host.py >> ab.jsonl

Decode steps of batch 1, 32 query heads over 8 KV heads, head dim 128, bf16, 1000 of
1024 cache rows in use: attend only (cache_seqlens a tensor, or an int), append one new
row (causal), a paged cache (pages of 16). Value checks off (as a serving loop runs), and
on with the same cache_seqlens tensor every call (its values read once).
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

import samattn
from samattn.bench.timing import host_us_pair


def main() -> None:
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, 1, 32, 128, **bf16)
    k_cache, v_cache = (torch.randn(1, 1024, 8, 128, **bf16) for _ in "kv")
    k_new, v_new = (torch.randn(1, 1, 8, 128, **bf16) for _ in "kv")
    lens = torch.tensor([1000], dtype=torch.int32, device="cuda")
    pages = 1024 // 16
    k_paged, v_paged = (t.reshape(pages, 16, 8, 128) for t in (k_cache, v_cache))
    table = torch.randperm(pages, device="cuda").to(torch.int32).reshape(1, pages)
    # SDPA on the same step: q (1, 32, 1, 128), the caches' first 1000 rows as views.
    qt = q.transpose(1, 2)
    kt, vt = (t[:, :1000].transpose(1, 2) for t in (k_cache, v_cache))

    def sdpa():
        return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    kvcache = samattn.flash_attn_with_kvcache
    cases = {
        "decode": lambda: kvcache(q, k_cache, v_cache, cache_seqlens=lens),
        "decode_int_seqlens": lambda: kvcache(q, k_cache, v_cache, cache_seqlens=1000),
        "decode_append": lambda: kvcache(
            q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True
        ),
        "decode_paged": lambda: kvcache(q, k_paged, v_paged, cache_seqlens=lens, block_table=table),
    }
    out: dict[str, object] = {"samattn": samattn.__file__}
    for checks in (False, True):
        samattn.set_value_checks(checks)
        for name, ours in cases.items():
            a, b = host_us_pair(ours, sdpa, calls=200, rounds=21)
            label = name + ("_value_checks" if checks else "")
            out[label] = {"samattn_us": a, "torch_us": b, "ratio": b / a}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
