"""Decode (--ops decode): samattn.flash_attn_with_kvcache on full K/V caches, bf16, d128,
32 query heads over 8 KV heads, seqlen_q 1 and 4, batch 1/8/64, cache length 1k/8k/32k/128k,
contiguous caches and paged ones (page sizes 16 and 256, the pages shuffled in the block
table), non-causal, against torch.nn.functional.scaled_dot_product_attention on the same
contiguous problem (q (batch, heads, seqlen_q, d), k and v the (batch, heads_k, seqlen_k, d)
views of the caches, enable_gqa=True, non-causal, whichever backend torch picks:
`baseline_backend`). Reported in GB/s of K and V read (`kv_bytes` = 2 * batch * seqlen_k *
heads_k * d * 2 bytes), with `copy_fraction` = that bandwidth / the device-to-device copy
bandwidth of the same run (a 1 GiB copy, read + write bytes), `ratio` = SDPA's time /
samattn's (contiguous cases), `ratio_to_contiguous` = the contiguous case's time / the paged
case's (paged cases), `paged` the page size (0: contiguous) and `difference_to_reference`
against fp32 attention on the first and last sequence. The value checks of cache_seqlens and
block_table (a device-to-host copy and a synchronization per call) are off while timing
(samattn.set_value_checks(False)), as in a serving loop. A case whose caches would take more
than 60% of the free GPU memory is skipped and listed. The small case (batch 1, 1k cache)
also gets the GPU time per call replayed from a CUDA graph of 20 calls and the host time per
eager call (as --ops overhead measures them; `*_graph_us`, `*_host_us`, and
`samattn_host_checked_us` with the value checks on) for samattn and SDPA."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import samattn

from .. import cases as bench_cases
from .. import common, timing
from ..cases import DECODE_HEAD_DIM, DECODE_HEADS, DECODE_HEADS_K, DecodeCase
from ..common import DTYPES, normal, relative_difference, try_call, value_checks
from ..runner import Bench

OP = "decode"
HEADER = (
    f"decode: flash_attn_with_kvcache, {DECODE_HEADS} query heads over {DECODE_HEADS_K} KV heads, "
    f"d{DECODE_HEAD_DIM}, full caches; GB/s of K and V read, ratio = sdpa time / samattn time"
)
FREES_MEMORY = True
# A case whose K/V caches (all the rotated sets) take more than this share of the free GPU
# memory is skipped, with the reason printed and written to the JSON's `skipped`.
MEMORY_FRACTION = 0.6
# The small case: also the GPU time per call inside a CUDA graph and the host time per call.
SMALL = (1, 1024)  # (batch, seqlen_k)


def cases(size: str) -> list[tuple[str, DecodeCase]]:
    return bench_cases.DECODE_CASES[size]


def inputs(case: DecodeCase, dtype: torch.dtype) -> tuple:
    """(q, k_cache, v_cache, cache_seqlens, block_table): full caches of case.seqlen_k tokens
    per sequence; paged caches with every sequence's pages at random places (block_table
    None for contiguous caches)."""
    device = common.DEVICE
    q = normal((case.batch, case.seqlen_q, case.heads, case.d), dtype)
    cache_seqlens = torch.full((case.batch,), case.seqlen_k, dtype=torch.int32, device=device)
    if not case.paged:
        shape = (case.batch, case.seqlen_k, case.heads_k, case.d)
        return q, normal(shape, dtype), normal(shape, dtype), cache_seqlens, None
    pages_per_sequence = -(-case.seqlen_k // case.paged)
    num_pages = case.batch * pages_per_sequence
    shape = (num_pages, case.paged, case.heads_k, case.d)
    block_table = (
        torch.randperm(num_pages, device=device)
        .to(torch.int32)
        .view(case.batch, pages_per_sequence)
    )
    return q, normal(shape, dtype), normal(shape, dtype), cache_seqlens, block_table


def sequence_kv(k_cache, v_cache, block_table, row: int, seqlen_k: int):
    """Sequence `row`'s keys and values, (seqlen_k, heads_k, d), gathered from its pages."""
    if block_table is None:
        return k_cache[row, :seqlen_k], v_cache[row, :seqlen_k]
    pages = block_table[row].long()
    return tuple(c.index_select(0, pages).flatten(0, 1)[:seqlen_k] for c in (k_cache, v_cache))


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Non-causal attention of one sequence in fp32: q (seqlen_q, heads, d), k, v (seqlen_k,
    heads_k, d) -> (seqlen_q, heads, d); query head i reads KV head i // (heads / heads_k).
    The query heads of a group share one matrix product, so K and V are not repeated."""
    seqlen_q, heads, d = q.shape
    heads_k = k.shape[1]
    group = heads // heads_k
    qf = q.float().reshape(seqlen_q, heads_k, group, d).permute(1, 2, 0, 3)
    qf = qf.reshape(heads_k, group * seqlen_q, d)
    kf, vf = k.float().transpose(0, 1), v.float().transpose(0, 1)  # (heads_k, seqlen_k, d)
    p = torch.softmax(qf @ kf.transpose(1, 2) * d**-0.5, dim=-1)
    out = (p @ vf).reshape(heads_k, group, seqlen_q, d).permute(2, 0, 1, 3)
    return out.reshape(seqlen_q, heads, d)


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """The backend torch's SDPA picks for these (batch, heads, seq, d) tensors, or None
    where torch does not say (torch._fused_sdp_choice is private)."""
    try:
        from torch.nn.attention import SDPBackend

        return SDPBackend(torch._fused_sdp_choice(q, k, v, enable_gqa=True)).name
    except Exception:
        return None


def run(bench: Bench, case: tuple[str, DecodeCase]) -> None:
    """samattn.flash_attn_with_kvcache on full caches (contiguous or paged) against
    torch's scaled_dot_product_attention on the same contiguous problem (k and v as
    (batch, heads_k, seqlen_k, d) views of the caches, enable_gqa, whichever backend
    torch picks), non-causal in both."""
    import torch.nn.functional as F

    dtype_name, case = case
    dtype = DTYPES[dtype_name][0]
    kv_bytes = bench_cases.decode_kv_bytes(case, torch.empty((), dtype=dtype).element_size())
    kv_gb = kv_bytes / 1e9
    what = bench_cases.decode_what(case)
    label = f"decode {dtype_name} {what}"
    fields: dict[str, Any] = {"op": "decode", "dtype": dtype_name, **case._asdict()}
    count = bench.timer.input_set_count(kv_bytes)
    copy_gbps = bench.copy_gbps()
    free = common.free_memory_bytes()
    if count * kv_bytes > MEMORY_FRACTION * free:
        bench.skip(
            label,
            f"its K/V caches ({count} x {kv_bytes / 2**30:.1f} GiB) would take more than "
            f"{MEMORY_FRACTION:.0%} of the {free / 2**30:.1f} GiB of free GPU memory",
            {**fields, "kv_bytes": kv_bytes},
        )
        return
    sets = [inputs(case, dtype) for _ in range(count)]
    contiguous = case._replace(paged=0)
    small = (case.batch, case.seqlen_k) == SMALL
    contiguous_times = bench.memo.setdefault("decode_contiguous_ms", {})

    def samattn_decode(q, k_cache, v_cache, cache_seqlens, block_table):
        kvcache = getattr(samattn, "flash_attn_with_kvcache", None)
        if kvcache is None:
            raise NotImplementedError(
                f"samattn {samattn.__version__} has no flash_attn_with_kvcache"
            )
        return kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table)

    def sdpa_decode(q, k, v):
        try:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        except TypeError as error:  # torch < 2.5 has no enable_gqa
            raise RuntimeError(f"torch {torch.__version__}: {error}") from error

    # SDPA's (batch, heads, seq, d) inputs: q contiguous, k and v views of the caches.
    sdpa_sets = [
        (q.transpose(1, 2).contiguous(), k.transpose(1, 2), v.transpose(1, 2))
        for q, k, v, _, _ in ([] if case.paged else sets)
    ]

    def reference_difference(out: torch.Tensor) -> float:
        """Against fp32 attention on the first and the last sequence (pages gathered)."""
        q, k_cache, v_cache, _, block_table = sets[0]
        differences = []
        for row in dict.fromkeys((0, case.batch - 1)):
            k, v = sequence_kv(k_cache, v_cache, block_table, row, case.seqlen_k)
            reference = attention_reference(q[row], k, v)
            differences.append(relative_difference(out[row], reference))
        return max(differences)

    def body(family: str | None) -> None:
        with samattn.use_family(family):  # one call with the value checks on
            out = samattn_decode(*sets[0])
        difference = reference_difference(out)
        with value_checks(False):
            ms, ran = bench.samattn_ms(family, samattn_decode, sets)
            extra: dict[str, Any] = {}
            base_ms = None
            if not case.paged:
                contiguous_times[(family, dtype_name, contiguous)] = ms
                base_ms, reason = bench.optional_baseline_ms(
                    ("decode", dtype_name, contiguous), lambda: (sdpa_decode, sdpa_sets)
                )
                if reason is not None:
                    extra["baseline_skipped"] = reason
                extra["baseline_backend"] = sdpa_backend(*sdpa_sets[0])
            else:
                contiguous_ms = contiguous_times.get((family, dtype_name, contiguous))
                extra["contiguous_us"] = contiguous_ms * 1e3 if contiguous_ms else None
                extra["ratio_to_contiguous"] = contiguous_ms / ms if contiguous_ms else None
            if small:
                with samattn.use_family(family):
                    extra.update(
                        latencies(
                            lambda: samattn_decode(*sets[0]),
                            None if case.paged else lambda: sdpa_decode(*sdpa_sets[0]),
                        )
                    )
        samattn_gbps = kv_gb / (ms / 1e3)
        bench.record(
            op="decode",
            family=ran,
            forced=family is not None,
            dtype=dtype_name,
            shape=[case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.heads_k, case.d],
            what=what,
            **case._asdict(),
            unit="GB/s",
            samattn=samattn_gbps,
            baseline=kv_gb / (base_ms / 1e3) if base_ms else None,
            baseline_name=None if case.paged else "torch scaled_dot_product_attention",
            samattn_us=ms * 1e3,
            baseline_us=base_ms * 1e3 if base_ms else None,
            kv_bytes=kv_bytes,
            copy=copy_gbps,
            copy_fraction=samattn_gbps / copy_gbps,
            difference_to_reference=difference,
            compared_with="fp32 attention on the first and last sequence",
            **extra,
        )

    bench.run_case(label, body, fields)


def latencies(ours: Callable[[], object], theirs: Callable[[], object] | None) -> dict[str, Any]:
    """The small case's latencies: GPU time per call replayed from a CUDA graph of 20
    calls and host time per eager call (value checks off, as around it; and on), for
    samattn and (where given) SDPA; a measurement that fails is None with the reason."""
    fields: dict[str, Any] = {}

    def measure(key: str, how: Callable[[Callable[[], object]], float], fn) -> None:
        values: list[float] = []
        reason = try_call(lambda: values.append(how(fn)))
        fields[key] = values[0] if values else None
        if reason is not None:
            fields[f"{key}_skipped"] = reason

    for who, fn in (("samattn", ours), ("baseline", theirs)):
        if fn is None:
            continue
        measure(f"{who}_graph_us", timing.graph_gpu_us, fn)
        measure(f"{who}_host_us", timing.host_us, fn)
    with value_checks(True):
        measure("samattn_host_checked_us", timing.host_us, ours)
    return fields
