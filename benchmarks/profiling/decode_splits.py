"""Decode's key splits: the GPU time of one decode step at every forced split count against
the automatic choice (num_splits = 0), to see where the split heuristic (kvcache_plan.h:
kvcache_grid, cluster_kvcache_grid) leaves time. bf16 queries, d128, 32 query heads over 8
KV heads, seqlen_q 1, contiguous caches full to their length; bf16 caches, and e4m3 caches
(per-KV-head scales) with --fp8. Each time is the median of --repeats calls, each on the
next of enough cache copies to exceed the L2 (so that every call reads its cache from
memory), timed with CUDA events; value checks off, as in a serving loop. The family is the
automatic one (sm90 on Hopper: its cluster combine takes 2-16 splits within one CTA per SM,
other counts run sm80's kernel and combine). Prints one JSON object and writes it to --out.

    python benchmarks/profiling/decode_splits.py --out decode_splits.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import samattn

HEADS, HEADS_K, D = 32, 8, 128
SPLITS = (0, 1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
SHAPES = ((1, 1024), (1, 8192), (1, 32768), (1, 131072), (8, 8192), (8, 32768), (64, 8192))
L2_BYTES = 50 * 2**20


def cache_sets(batch: int, length: int, fp8: bool) -> list[tuple]:
    """(q, k_cache, v_cache, k_scale, v_scale) sets: at least two, and enough to exceed
    four times the L2."""
    element = 1 if fp8 else 2
    bytes_per_set = 2 * batch * length * HEADS_K * D * element
    count = max(2, min(16, -(-4 * L2_BYTES // bytes_per_set)))
    sets = []
    for _ in range(count):
        q = torch.randn(batch, 1, HEADS, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, length, HEADS_K, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        if fp8:
            k_scale = k.float().abs().amax(dim=(0, 1, 3)) / 448
            v_scale = v.float().abs().amax(dim=(0, 1, 3)) / 448
            k = (k.float() / k_scale[:, None]).to(torch.float8_e4m3fn)
            v = (v.float() / v_scale[:, None]).to(torch.float8_e4m3fn)
            sets.append((q, k, v, k_scale, v_scale))
        else:
            sets.append((q, k, v, None, None))
    return sets


def time_us(sets: list[tuple], splits: int, repeats: int) -> float:
    def call(i: int) -> None:
        q, k, v, k_scale, v_scale = sets[i % len(sets)]
        scales = {} if k_scale is None else {"k_scale": k_scale, "v_scale": v_scale}
        samattn.flash_attn_with_kvcache(q, k, v, num_splits=splits, **scales)

    for i in range(3):
        call(i)
    times = []
    for i in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fp8", action="store_true", help="also e4m3 caches")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out")
    args = parser.parse_args()
    samattn.set_value_checks(False)
    result = {"gpu": torch.cuda.get_device_name(), "shapes": []}
    for batch, length in SHAPES:
        for fp8 in (False, True) if args.fp8 else (False,):
            sets = cache_sets(batch, length, fp8)
            kv_bytes = 2 * batch * length * HEADS_K * D * (1 if fp8 else 2)
            row = {"batch": batch, "seqlen_k": length, "cache": "e4m3" if fp8 else "bf16",
                   "kv_bytes": kv_bytes, "us": {}, "gb_s": {}}  # fmt: skip
            for splits in SPLITS:
                try:
                    us = time_us(sets, splits, args.repeats)
                except (RuntimeError, ValueError) as error:
                    row["us"][str(splits)] = repr(error)[:120]
                    continue
                row["us"][str(splits)] = round(us, 2)
                row["gb_s"][str(splits)] = round(kv_bytes / us / 1e3, 1)
            timed = {s: t for s, t in row["us"].items() if isinstance(t, float) and s != "0"}
            if timed and isinstance(row["us"]["0"], float):
                best = min(timed, key=timed.get)
                row["best_splits"] = int(best)
                row["auto_over_best"] = round(row["us"]["0"] / timed[best], 3)
            result["shapes"].append(row)
            print(json.dumps(row), flush=True)
            del sets
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
