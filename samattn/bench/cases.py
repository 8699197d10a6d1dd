"""The cases each routine of ``python -m samattn.bench`` measures, as data.

Every table maps a size (``"full"``, ``"quick"`` with --quick) to a list of cases; a case
is a plain tuple (or NamedTuple) that the routine of its op (``samattn/bench/routines/``)
runs for every kernel family. Nothing here touches a GPU.
"""

from __future__ import annotations

import random
from typing import NamedTuple

# The ops of --ops, in the order a run measures them (one routine module each).
OPS = (
    "gemm",
    "linear",
    "split_k",
    "grouped",
    "softmax",
    "attention",
    "terms",
    "dropout",
    "decode",
    "decode_fp8",
    "overhead",
)

Shape = tuple[int, ...]

# ------------------------------------------------------------------ GEMM ----
# (dtype, (batch, M, N, K)): squares, LLM projections (M tokens against (N, K) weights of a
# Llama-3-8B layer), decode-like small M, and a batch of small products.
_SQUARES = [(1, s, s, s) for s in (1024, 2048, 4096, 8192)]
_LLM_WEIGHTS = [(4096, 4096), (14336, 4096), (4096, 14336)]  # (N, K)
_LLM = [(1, m, n, k) for m in (4096, 16384) for n, k in _LLM_WEIGHTS]
_SMALL_M = [(1, m, 8192, 8192) for m in (16, 64, 128)]
_BATCHED = [(64, 512, 512, 512)]
GEMM_CASES = {
    "full": [
        *[
            (dt, s)
            for dt in ("bf16", "f16")
            for s in dict.fromkeys(_SQUARES + _LLM + _SMALL_M + _BATCHED)  # 4096^3 is in two
        ],
        ("f32", (1, 4096, 4096, 4096)),
        ("f32", (1, 8192, 8192, 8192)),
        ("tf32", (1, 4096, 4096, 4096)),
        ("tf32", (1, 8192, 8192, 8192)),
    ],
    "quick": [
        ("f16", (1, 2048, 2048, 2048)),
        ("f16", (1, 4096, 4096, 4096)),
        ("f16", (64, 512, 512, 512)),
        ("bf16", (1, 4096, 4096, 4096)),
        ("bf16", (1, 16, 8192, 8192)),
        ("f32", (1, 4096, 4096, 4096)),
        ("tf32", (1, 4096, 4096, 4096)),
    ],
}

# (dtype, (tokens, in_features, out_features)): issue 17's MLP projections.
LINEAR_CASES = {
    "full": [
        ("bf16", (tokens, n_in, n_out))
        for tokens in (4096, 16384)
        for n_in, n_out in ((4096, 14336), (14336, 4096))
    ],
    "quick": [("bf16", (4096, 4096, 14336))],
}

# (dtype, (M, N, K)): issue 17's M = N = 256 and 512, then other long-K shapes the
# automatic split meets.
SPLIT_K_CASES = {
    "full": [("bf16", (m, m, 65536)) for m in (256, 512)]
    + [("bf16", shape) for shape in ((384, 1536, 49152), (1024, 1024, 32768), (64, 8192, 65536))],
    "quick": [("bf16", (256, 256, 65536))],
}
# (split_k, split_k_mode) of samattn.gemm, measured per case.
SPLIT_K_CHOICES = (
    ("auto", "auto"),
    (4, "serial"),
    (8, "serial"),
    (16, "serial"),
    (8, "parallel"),
    (16, "parallel"),
    (32, "parallel"),
)


# ---------------------------------------------------------- grouped GEMM ----
class GroupedCase(NamedTuple):
    """A mixture-of-experts layer: top-2 routing of `tokens` tokens (2 * tokens rows reach
    the experts, with skewed loads), hidden size `hidden`, expert size `expert_dim`;
    projection "up" (hidden -> expert_dim), "down" (back), or either's weight gradient
    ("up_wgrad", "down_wgrad")."""

    experts: int
    tokens: int
    projection: str
    hidden: int = 4096
    expert_dim: int = 14336


class GroupedListCase(NamedTuple):
    """samattn.grouped_gemm_list on `count` independent GEMMs of sizes drawn from `sizes`
    ({"m": ..., "n": ..., "k": ...}), the same draw in every run (list_sizes)."""

    count: int
    sizes: tuple[tuple[str, tuple[int, ...]], ...] = (
        ("m", (128, 512, 1000, 2048)),
        ("n", (1024, 4096)),
        ("k", (1024, 2048, 4096)),
    )


GROUPED_CASES = {
    "full": [
        *[
            GroupedCase(experts, tokens, projection)
            for experts in (8, 64)
            for tokens in (4096, 16384)
            for projection in ("up", "down", "up_wgrad", "down_wgrad")
        ],
        GroupedListCase(8),
        GroupedListCase(64),
    ],
    "quick": [GroupedCase(8, 4096, "up"), GroupedListCase(8)],
}


def list_sizes(case: GroupedListCase) -> list[tuple[int, int, int]]:
    """(M, N, K) of each GEMM of a grouped_gemm_list case, the same in every run."""
    rng = random.Random(case.count)
    choices = dict(case.sizes)
    return [tuple(rng.choice(choices[d]) for d in "mnk") for _ in range(case.count)]


def skewed_loads(experts: int, rows: int) -> list[int]:
    """Rows per expert, expert e's share proportional to 1 / (e + 1); the remainder of the
    rounding goes to expert 0."""
    weights = [1.0 / (e + 1) for e in range(experts)]
    total = sum(weights)
    loads = [int(rows * w / total) for w in weights]
    loads[0] += rows - sum(loads)
    return loads


# --------------------------------------------------------------- softmax ----
# (dtype, (rows, cols)), softmax over the last dim; every shape is 64M elements.
_SOFTMAX_SHAPES = [(65536, 1024), (16384, 4096), (8192, 8192), (4096, 16384), (2048, 32768)]
SOFTMAX_CASES = {
    "full": [
        *[("f16", s) for s in _SOFTMAX_SHAPES],
        *[("f32", s) for s in _SOFTMAX_SHAPES],
        ("bf16", (65536, 1024)),
        ("bf16", (8192, 8192)),
    ],
    "quick": [
        ("f16", (16384, 4096)),
        ("f16", (2048, 32768)),
        ("f32", (16384, 4096)),
    ],
}


# ------------------------------------------------------------- attention ----
class AttentionCase(NamedTuple):
    """One attention problem: q, k, v of (batch, seqlen, heads, d), seqlen_q == seqlen_k."""

    batch: int
    heads: int
    seqlen: int
    d: int
    causal: bool


# FlashAttention's benchmark grid: batch * seqlen = 16k tokens, heads * d = 2048 (the model
# width), so every case does the same work per token.
ATTENTION_TOKENS = 16384
ATTENTION_WIDTH = 2048
ATTENTION_SEQLENS = (1024, 2048, 4096, 8192, 16384)
ATTENTION_HEAD_DIMS = (64, 128, 256)


def attention_case(seqlen: int, d: int, causal: bool) -> AttentionCase:
    return AttentionCase(ATTENTION_TOKENS // seqlen, ATTENTION_WIDTH // d, seqlen, d, causal)


def attention_grid(
    dtypes: tuple[str, ...],
    seqlens: tuple[int, ...],
    head_dims: tuple[int, ...] = ATTENTION_HEAD_DIMS,
) -> list[tuple[str, AttentionCase]]:
    """(dtype, case) for every dtype x head dim x seqlen x causal, in that order."""
    return [
        (dt, attention_case(seqlen, d, causal))
        for dt in dtypes
        for d in head_dims
        for seqlen in seqlens
        for causal in (False, True)
    ]


ATTENTION_CASES = {
    "full": attention_grid(("bf16", "f16"), ATTENTION_SEQLENS),
    "quick": [
        ("bf16", attention_case(2048, 128, False)),
        ("bf16", attention_case(8192, 128, True)),
        ("f16", attention_case(4096, 64, True)),
        ("f16", attention_case(4096, 256, False)),
    ],
}

# Issue 16's grid for the score terms and masks (--ops terms): bf16, head dims 64, 128 and
# 256, seqlen 1k, 4k and 16k on the attention grid (16k tokens, heads x d = 2048), causal
# and not.
TERMS_SEQLENS = (1024, 4096, 16384)
TERMS_CASES = {
    "full": attention_grid(("bf16",), TERMS_SEQLENS),
    "quick": [
        ("bf16", attention_case(4096, 128, False)),
        ("bf16", attention_case(4096, 128, True)),
        ("bf16", attention_case(1024, 64, False)),
    ],
}
# What each measured call adds to the plain flash_attn_func: ALiBi slopes (per head),
# attention sinks (a learnable logit per head), a bool keep-mask and an additive float32
# mask, both of random key padding per batch entry, (batch, 1, seqlen_q, seqlen_k).
TERMS_FEATURES = ("alibi", "sinks", "bool_mask", "float_mask")
MASK_FEATURES = ("bool_mask", "float_mask")

# Attention dropout (--ops dropout): bf16, head dims 64 and 128, seqlen 1k and 4k on the
# attention grid, causal and not, at DROPOUT_P.
DROPOUT_P = 0.1
DROPOUT_CASES = {
    "full": attention_grid(("bf16",), (1024, 4096), head_dims=(64, 128)),
    "quick": [("bf16", attention_case(4096, 128, False))],
}


# ---------------------------------------------------------------- decode ----
class DecodeCase(NamedTuple):
    """One decode step: q (batch, seqlen_q, heads, d) against K/V caches holding seqlen_k
    tokens per sequence with heads_k heads, contiguous (batch, seqlen_k, heads_k, d) when
    paged is 0, else paged (pages of `paged` tokens, num_pages = batch * seqlen_k / paged,
    shuffled in the block table)."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    heads_k: int
    d: int
    paged: int


# Issue 15's grid: bf16, d128, 32 query heads over 8 KV heads (Llama-3-8B's attention).
DECODE_HEADS, DECODE_HEADS_K, DECODE_HEAD_DIM = 32, 8, 128
DECODE_BATCHES = (1, 8, 64)
DECODE_SEQLENS_K = (1024, 8192, 32768, 131072)
DECODE_SEQLENS_Q = (1, 4)
DECODE_PAGE_SIZES = (0, 16, 256)  # 0: contiguous caches


def decode_case(batch: int, seqlen_q: int, seqlen_k: int, paged: int = 0) -> DecodeCase:
    return DecodeCase(
        batch, seqlen_q, seqlen_k, DECODE_HEADS, DECODE_HEADS_K, DECODE_HEAD_DIM, paged
    )


# Per cache (seqlen_k, batch): the contiguous cases first, so that the paged ones can be
# compared with them (ratio_to_contiguous).
DECODE_CASES = {
    "full": [
        ("bf16", decode_case(batch, seqlen_q, seqlen_k, paged))
        for seqlen_k in DECODE_SEQLENS_K
        for batch in DECODE_BATCHES
        for paged in DECODE_PAGE_SIZES
        for seqlen_q in DECODE_SEQLENS_Q
    ],
    "quick": [
        ("bf16", decode_case(batch, seqlen_q, seqlen_k, paged))
        for batch, seqlen_k in ((1, 1024), (8, 8192), (64, 32768))
        for paged in (0, 256)
        for seqlen_q in (1, 4)
    ],
}


def decode_kv_bytes(case: DecodeCase, element_size: int = 2) -> int:
    """Bytes of K and V one call reads: 2 * batch * seqlen_k * heads_k * d * element size."""
    return 2 * case.batch * case.seqlen_k * case.heads_k * case.d * element_size


def _length_text(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def decode_what(case: DecodeCase) -> str:
    """ "b8 sq1 L32k page16": batch, seqlen_q, cache length, page size or contiguous."""
    layout = f"page{case.paged}" if case.paged else "contiguous"
    return f"b{case.batch} sq{case.seqlen_q} L{_length_text(case.seqlen_k)} {layout}"


# ------------------------------------------------------------ decode fp8 ----
# Issue 48: decode on fp8 K/V caches against the same step on the bf16 cache they were
# quantized from, both timed in one run. (dtype of q, fp8 format, case): the decode grid's
# constants (d128, 32 query heads over 8 KV heads), seqlen_q 1, batch 1/8/64, cache length
# 8k/32k/128k, contiguous and paged (pages of 256 tokens); e4m3 everywhere, and e5m2 on the
# batch-8 32k caches too.
DECODE_FP8_FORMATS = ("e4m3", "e5m2")
DECODE_FP8_SEQLENS_K = (8192, 32768, 131072)
DECODE_FP8_PAGE_SIZES = (0, 256)
DECODE_FP8_E5M2 = ((8, 32768),)  # (batch, seqlen_k) also measured in e5m2
# Issue 48's target: the fp8 cache at least this many times as fast as the bf16 cache on
# every case that reads at least DECODE_FP8_TARGET_BYTES of bf16 cache.
DECODE_FP8_TARGET = 1.8
DECODE_FP8_TARGET_BYTES = 256 * 2**20
DECODE_FP8_CASES = {
    "full": [
        ("bf16", fp8, decode_case(batch, 1, seqlen_k, paged))
        for seqlen_k in DECODE_FP8_SEQLENS_K
        for batch in DECODE_BATCHES
        for paged in DECODE_FP8_PAGE_SIZES
        for fp8 in DECODE_FP8_FORMATS
        if fp8 == "e4m3" or (batch, seqlen_k) in DECODE_FP8_E5M2
    ],
    "quick": [
        ("bf16", "e4m3", decode_case(1, 1, 8192)),  # small: 32 MiB of bf16 cache
        ("bf16", "e4m3", decode_case(8, 1, 32768)),  # 1 GiB of bf16 cache
        ("bf16", "e4m3", decode_case(8, 1, 32768, paged=256)),
        ("bf16", "e5m2", decode_case(8, 1, 32768)),
    ],
}


def decode_fp8_what(fp8: str, case: DecodeCase) -> str:
    """ "e4m3 b8 sq1 L32k page256": the fp8 format, then decode_what."""
    return f"{fp8} {decode_what(case)}"
