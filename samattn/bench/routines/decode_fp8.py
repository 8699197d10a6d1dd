"""Decode on fp8 K/V caches (--ops decode_fp8): samattn.flash_attn_with_kvcache on full fp8
caches (float8_e4m3fn or float8_e5m2: the case's `fp8`) against the same call on the bf16
caches they were quantized from, both timed in the same run (issue 48). bf16 queries, d128,
32 query heads over 8 KV heads, seqlen_q 1, batch 1/8/64, cache length 8k/32k/128k,
contiguous caches and paged ones (pages of 256 tokens, shuffled in the block table),
non-causal. The fp8 caches are the bf16 caches quantized per KV head: scale = amax / 448
(e4m3) or amax / 57344 (e5m2) over that head's keys (values), element = the fp8 value
nearest x / scale; the scales go to the call as float32 (heads_k,) tensors (k_scale,
v_scale).

Per case and family: `ms` and `bf16_ms` the GPU times of the fp8 and the bf16 call,
`ratio_to_bf16` = bf16_ms / ms (issue 48's target: >= 1.8 on every case reading >= 256 MiB
of bf16 cache), `kv_bytes` the bytes of K and V the fp8 call reads (2 * batch * seqlen_k *
heads_k * d * 1), `bf16_kv_bytes` the bf16 call's (twice that), `copy_fraction` = kv_bytes /
ms against the device-to-device copy bandwidth of the run (`copy`, GB/s; as --ops decode),
`bf16_copy_fraction` likewise for the bf16 call. `samattn` and `baseline` are both in GB/s of
the bf16 cache's bytes (unit "GB/s bf16-equiv": bf16_kv_bytes / ms and / bf16_ms), so that
`ratio` = `ratio_to_bf16`. `difference_to_reference`: the fp8 output against fp32 attention
on the dequantized cache (cache.float() * scale) for the first and last sequence;
`bf16_difference_to_reference`: the bf16 output against fp32 attention on the bf16 cache.
As --ops decode: the value checks off while timing, input sets rotated past the L2 cache, a
case whose caches (bf16 and fp8, all the sets) would take more than 60% of the free GPU
memory skipped and listed. A family that cannot run fp8 caches (sm75) skips the case."""

from __future__ import annotations

import inspect
from typing import Any

import torch

import samattn

from .. import cases as bench_cases
from .. import common
from ..cases import DECODE_HEAD_DIM, DECODE_HEADS, DECODE_HEADS_K, DecodeCase
from ..common import DTYPES, relative_difference, value_checks
from ..runner import Bench
from . import decode

OP = "decode_fp8"
HEADER = (
    f"decode_fp8: flash_attn_with_kvcache on fp8 caches against the bf16 caches they were "
    f"quantized from, {DECODE_HEADS} query heads over {DECODE_HEADS_K} KV heads, "
    f"d{DECODE_HEAD_DIM}; GB/s of bf16 cache, ratio = bf16 time / fp8 time"
)
FREES_MEMORY = True
MEMORY_FRACTION = decode.MEMORY_FRACTION
UNIT = "GB/s bf16-equiv"
# fp8 format -> (torch dtype, largest finite value): scale = amax / that.
FP8 = {
    "e4m3": (torch.float8_e4m3fn, 448.0),
    "e5m2": (torch.float8_e5m2, 57344.0),
}
# Quantize at most this many elements at a time (a float32 slice of 256 MiB): a 16 GiB
# bf16 cache needs no float32 copy.
CHUNK_ELEMENTS = 1 << 26


def cases(size: str) -> list[tuple[str, str, DecodeCase]]:
    return bench_cases.DECODE_FP8_CASES[size]


def kv_head_scales(cache: torch.Tensor, fp8_max: float) -> torch.Tensor:
    """float32 (heads_k,): each KV head's amax over the whole cache / fp8_max (a head of
    zeros gets the scale of amax 1e-12), computed a slice of tokens at a time."""
    heads_k, d = cache.shape[-2:]
    amax = torch.zeros(heads_k, device=cache.device, dtype=torch.float32)
    for part in cache.reshape(-1, heads_k, d).split(max(1, CHUNK_ELEMENTS // (heads_k * d))):
        amax = torch.maximum(amax, part.abs().amax(dim=(0, 2)).float())
    return (amax.clamp_min(1e-12) / fp8_max).contiguous()


def quantize(
    cache: torch.Tensor, fp8: str, scales: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 cache, float32 (heads_k,) scales): each element x of KV head h stored as the fp8
    value nearest x / scales[h] (saturated to the format's largest finite value), with
    scales = kv_head_scales(cache) unless given; a slice of tokens at a time."""
    dtype, fp8_max = FP8[fp8]
    if scales is None:
        scales = kv_head_scales(cache, fp8_max)
    heads_k, d = cache.shape[-2:]
    out = torch.empty(cache.shape, device=cache.device, dtype=dtype)
    rows = max(1, CHUNK_ELEMENTS // (heads_k * d))
    inverse = scales.reciprocal().view(1, heads_k, 1)
    for source, target in zip(
        cache.reshape(-1, heads_k, d).split(rows), out.view(-1, heads_k, d).split(rows)
    ):
        target.copy_((source.float() * inverse).clamp_(-fp8_max, fp8_max))
    return out, scales


def dequantized_sequence_kv(k_cache, v_cache, block_table, row, seqlen_k, k_scale, v_scale):
    """Sequence `row`'s keys and values of fp8 caches, dequantized to float32 (seqlen_k,
    heads_k, d): element * its KV head's scale (pages gathered as bytes)."""
    dtype = k_cache.dtype
    k, v = decode.sequence_kv(
        k_cache.view(torch.uint8), v_cache.view(torch.uint8), block_table, row, seqlen_k
    )
    return (
        k.view(dtype).float() * k_scale.view(1, -1, 1),
        v.view(dtype).float() * v_scale.view(1, -1, 1),
    )


def _kvcache():
    """samattn.flash_attn_with_kvcache, if it takes fp8 caches (k_scale, v_scale)."""
    kvcache = getattr(samattn, "flash_attn_with_kvcache", None)
    if kvcache is None:
        raise NotImplementedError(f"samattn {samattn.__version__} has no flash_attn_with_kvcache")
    try:
        parameters = inspect.signature(kvcache).parameters
    except (TypeError, ValueError):  # no signature to read: let the call tell
        return kvcache
    takes_keywords = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    if "k_scale" not in parameters and not takes_keywords:
        raise NotImplementedError(
            f"samattn {samattn.__version__}: flash_attn_with_kvcache takes no k_scale "
            "(no fp8 KV caches)"
        )
    return kvcache


def run(bench: Bench, case: tuple[str, str, DecodeCase]) -> None:
    """flash_attn_with_kvcache on the fp8 caches and on the bf16 caches they were quantized
    from (contiguous or paged), each family timing both."""
    dtype_name, fp8, case = case
    dtype = DTYPES[dtype_name][0]
    kv_bytes = bench_cases.decode_kv_bytes(case, 1)
    bf16_kv_bytes = bench_cases.decode_kv_bytes(case, torch.empty((), dtype=dtype).element_size())
    what = bench_cases.decode_fp8_what(fp8, case)
    label = f"decode_fp8 {what}"
    fields: dict[str, Any] = {"op": OP, "dtype": dtype_name, "fp8": fp8, **case._asdict()}
    count = bench.timer.input_set_count(kv_bytes)
    copy_gbps = bench.copy_gbps()
    free = common.free_memory_bytes()
    if count * (kv_bytes + bf16_kv_bytes) > MEMORY_FRACTION * free:
        bench.skip(
            label,
            f"its bf16 and fp8 K/V caches ({count} x {(kv_bytes + bf16_kv_bytes) / 2**30:.1f} "
            f"GiB) would take more than {MEMORY_FRACTION:.0%} of the {free / 2**30:.1f} GiB of "
            "free GPU memory",
            {**fields, "kv_bytes": kv_bytes, "bf16_kv_bytes": bf16_kv_bytes},
        )
        return
    # (q, k, v, cache_seqlens, block_table) in bf16, and the same with fp8 caches + scales.
    bf16_sets = [decode.inputs(case, dtype) for _ in range(count)]
    fp8_sets = []
    for q, k_cache, v_cache, cache_seqlens, block_table in bf16_sets:
        k8, k_scale = quantize(k_cache, fp8)
        v8, v_scale = quantize(v_cache, fp8)
        fp8_sets.append((q, k8, v8, cache_seqlens, block_table, k_scale, v_scale))

    kvcache: list = []  # samattn.flash_attn_with_kvcache, looked up once per family

    def samattn_decode_fp8(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale):
        return kvcache[0](
            q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table,
            k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip

    def samattn_decode_bf16(q, k_cache, v_cache, cache_seqlens, block_table):
        return kvcache[0](q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table)

    def reference_difference(out: torch.Tensor, fp8_cache: bool) -> float:
        """Against fp32 attention on the first and the last sequence: of the dequantized
        fp8 cache, or of the bf16 cache."""
        q, k_cache, v_cache, _, block_table = bf16_sets[0]
        _, k8, v8, _, _, k_scale, v_scale = fp8_sets[0]
        differences = []
        for row in dict.fromkeys((0, case.batch - 1)):
            if fp8_cache:
                k, v = dequantized_sequence_kv(
                    k8, v8, block_table, row, case.seqlen_k, k_scale, v_scale
                )
            else:
                k, v = decode.sequence_kv(k_cache, v_cache, block_table, row, case.seqlen_k)
            reference = decode.attention_reference(q[row], k, v)
            differences.append(relative_difference(out[row], reference))
        return max(differences)

    def body(family: str | None) -> None:
        kvcache[:] = [_kvcache()]
        with samattn.use_family(family):  # one call of each with the value checks on
            out = samattn_decode_fp8(*fp8_sets[0])  # first: a family without fp8 skips here
            bf16_out = samattn_decode_bf16(*bf16_sets[0])
        difference = reference_difference(out, fp8_cache=True)
        bf16_difference = reference_difference(bf16_out, fp8_cache=False)
        del out, bf16_out
        with value_checks(False):
            ms, ran = bench.samattn_ms(family, samattn_decode_fp8, fp8_sets)
            bf16_ms, bf16_ran = bench.samattn_ms(family, samattn_decode_bf16, bf16_sets)
        extra: dict[str, Any] = {}
        if bf16_ran != ran:
            extra["bf16_family"] = bf16_ran
        gbps, bf16_gbps = kv_bytes / 1e9 / (ms / 1e3), bf16_kv_bytes / 1e9 / (bf16_ms / 1e3)
        bench.record(
            op=OP,
            family=ran,
            forced=family is not None,
            dtype=dtype_name,
            fp8=fp8,
            shape=[case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.heads_k, case.d],
            what=what,
            **case._asdict(),
            unit=UNIT,
            samattn=bf16_kv_bytes / 1e9 / (ms / 1e3),
            baseline=bf16_gbps,
            baseline_name="samattn.flash_attn_with_kvcache on the bf16 cache",
            ms=ms,
            bf16_ms=bf16_ms,
            samattn_us=ms * 1e3,
            baseline_us=bf16_ms * 1e3,
            ratio_to_bf16=bf16_ms / ms,
            kv_bytes=kv_bytes,
            bf16_kv_bytes=bf16_kv_bytes,
            copy=copy_gbps,
            copy_fraction=gbps / copy_gbps,
            bf16_copy_fraction=bf16_gbps / copy_gbps,
            difference_to_reference=difference,
            bf16_difference_to_reference=bf16_difference,
            compared_with="fp32 attention on the first and last sequence (fp8: of the "
            "dequantized cache, cache.float() * scale)",
            scales="per KV head, amax / the format's largest finite value, float32 (heads_k,)",
            **extra,
        )

    bench.run_case(label, body, fields)
