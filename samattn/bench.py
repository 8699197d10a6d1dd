"""Benchmarks of samattn against torch, measured in the same run.

    python -m samattn.bench [--ops gemm,linear,split_k,grouped,softmax,attention,terms,decode,
                             overhead]
                            [--families sm80,sm75] [--quick] [--json PATH] [--plot PATH]
                            [--terms-features alibi,sinks,bool_mask,float_mask]

GEMM is reported in TFLOPS (2 * batch * M * N * K flops) against torch.matmul
(cuBLAS) in the same dtype and fp32 precision; softmax in GB/s of the minimum
traffic (forward reads x and writes y: 2 * numel * element size; backward
reads y and dy and writes dx: 3x) against torch.softmax and
torch._softmax_backward_data, and the forward also against a device-to-device
copy of the same bytes (y.copy_(x)), the bandwidth a softmax could reach.
Attention is reported in TFLOPS (forward 4 * batch * heads * seqlen^2 * headdim,
halved when causal; backward 2.5x the forward) against
torch.nn.functional.scaled_dot_product_attention forced to its FLASH_ATTENTION
backend (FlashAttention-2; `baseline`, `ratio`) and to CUDNN_ATTENTION (`cudnn`,
`ratio_to_cudnn`). samattn.flash_attn_func reads (batch, seqlen, heads, headdim)
tensors; SDPA gets the (batch, heads, seqlen, headdim) transposed views of the
same tensors, as FlashAttention's own benchmark does. The backward is timed
alone: one forward with requires_grad, then torch.autograd.grad(out, (q, k, v),
dout, retain_graph=True) repeatedly. A baseline that refuses a case (e.g.
cuDNN's head dim 256 backward) is left out of that record with the reason
(`baseline_skipped`, `cudnn_skipped`); a samattn case that the family or the
library cannot run (UnsupportedError, NotImplementedError) goes to the JSON's
`skipped` list with the library's message.
`ratio` is samattn / torch: above 1 is faster.

Linear with a fused epilogue (--ops linear): samattn.linear(x, w, b, activation="gelu"),
bf16, LLM shapes (tokens 4096/16384 x (4096 -> 14336) and (14336 -> 4096)), against
F.gelu(F.linear(x, w, b)) in eager torch and compiled with torch.compile (default mode, one
compilation per shape before timing): op "linear_epilogue", one record per baseline
(`baseline_name`), in TFLOPS of the GEMM (2 * tokens * in * out).

Split-K (--ops split_k): samattn.gemm on a small output with a long K (M = N = 256 and
512, K = 65536, and three other long-K shapes, bf16; --quick: 256 only), automatic and
with each forced split of SPLIT_K_CHOICES, against torch.matmul (cuBLAS, which splits K
itself): op "gemm_split_k", one record per choice (fields `split_k`, `split_k_mode`,
`config` from the plan); a choice the family cannot run goes to `skipped`.

Grouped GEMM (--ops grouped): samattn.grouped_gemm for a mixture-of-experts layer, bf16,
8 and 64 experts, top-2 routing of 4096 / 16384 tokens with skewed loads (expert e gets a
share proportional to 1 / (e + 1)), hidden 4096 and expert dim 14336, both projections
(up: 4096 -> 14336, down: 14336 -> 4096; --quick: 8 experts, 4096 tokens, up), and the
weight gradient of each (`projection` "up_wgrad", "down_wgrad": grad_w[e] = x_e^T dy_e, the
K-grouped GEMM autograd runs): op "grouped_gemm", one record per baseline:
torch._grouped_mm where the installed torch has it and it runs the case (for a weight
gradient its 2-D x 2-D form, offsets along K), and a Python loop of torch.mm over the
experts (`versus`). Then samattn.grouped_gemm_list on 8 and 64 independent bf16 GEMMs
(--quick: 8) of sizes drawn from M in {128, 512, 1000, 2048}, N in {1024, 4096}, K in
{1024, 2048, 4096} (`sizes`), against a loop of torch.mm: op "grouped_gemm_list".

Score terms and masks (--ops terms): bf16, head dims 64/128/256, seqlen 1k/4k/16k on the
attention grid, causal and not (--quick: three cases). Forward and backward of
samattn.flash_attn_func with ALiBi slopes, with attention sinks (requiring grad in the
backward), and with a bool and an additive float32 mask of random key padding, (batch, 1,
seqlen, seqlen) (through samattn.scaled_dot_product_attention; when causal through
flash_attn_func(causal=True, attn_mask=...), as SDPA refuses is_causal with a mask), each
against the same call without the feature: op "attention_terms", fields `feature`,
`direction`, `ratio` = plain time / feature time (0.9: the feature costs 10%). The mask
calls also against torch's SDPA forced to its EFFICIENT_ATTENTION backend with the same
mask (the float mask in the inputs' dtype, which that kernel reads; the causal mask folded
in): op "attention_mask", `ratio` = SDPA's time / samattn's, `difference_to_baseline` of
the output or the largest of the gradients. TFLOPS count the attention's nominal work (as
above, halved when causal) for every call. --terms-features measures only the features
named.

Overhead (--ops overhead): what an eager call costs the CPU, as a user meets it. For
each call (small GEMMs, a small softmax, a prefill-sized and a decode-sized attention,
and forward + backward through autograd) against torch's own op on the same tensors:
the host time per call of a tight loop of asynchronous calls, in rounds that alternate
with torch's so that a drift of the shared host's speed reaches both (`samattn`, `baseline`
in microseconds, `ratio` = torch's time / samattn's, so >= 0.8 meets the design's
"at most 1.25x torch"), the GPU time per call with the calls queued back to back (no
sleep kernel hides the host time) and inside a captured CUDA graph (`*_queued_us`,
`*_graph_us`).

Decode (--ops decode): samattn.flash_attn_with_kvcache on full K/V caches, bf16, d128,
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
`samattn_host_checked_us` with the value checks on) for samattn and SDPA.

Timing: CUDA events around every call, median of 20-200 calls (about 0.2 s
of GPU time per measurement, less with --quick) after a warm-up. Before the
timed calls the GPU is kept busy (torch.cuda._sleep) for as long as the CPU
needs to queue them all, so Python overhead between calls does not count:
the numbers are GPU time. Inputs are fresh random normal data; when one set
of inputs fits in twice the L2 cache, several sets are rotated so that every
call reads from memory, not from L2.

Results go to benchmarks/results/<gpu>.json (relative to the current folder;
--json DIR/ picks the folder), with the GPU, torch, CUDA and samattn versions
and this command line; --plot writes a PNG of the ratios (needs matplotlib).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import math
import random
import re
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

import samattn

from . import _checks, _cuda, _lib

OPS = (
    "gemm",
    "linear",
    "split_k",
    "grouped",
    "softmax",
    "attention",
    "terms",
    "decode",
    "overhead",
)
FAMILIES = ("auto", *_lib.FAMILY_CODES)  # "auto": the library's own choice for the GPU

# dtype name -> (torch dtype, torch fp32 matmul precision): "f32" is exact fp32
# ("highest"), "tf32" lets fp32 GEMMs use tf32 tensor cores ("high").
DTYPES = {
    "f16": (torch.float16, "highest"),
    "bf16": (torch.bfloat16, "highest"),
    "f32": (torch.float32, "highest"),
    "tf32": (torch.float32, "high"),
}

Shape = tuple[int, ...]

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
SPLIT_K_CASES = {
    # Issue 17's M = N = 256 and 512, then other long-K shapes the automatic split meets.
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

# (experts, tokens, projection): top-2 routing, so 2 * tokens rows reach the experts.
GROUPED_CASES = {
    "full": [
        (experts, tokens, projection)
        for experts in (8, 64)
        for tokens in (4096, 16384)
        for projection in ("up", "down", "up_wgrad", "down_wgrad")
    ],
    "quick": [(8, 4096, "up")],
}
GROUPED_HIDDEN, GROUPED_EXPERT_DIM = 4096, 14336
# samattn.grouped_gemm_list: this many GEMMs of sizes drawn from GROUPED_LIST_SIZES.
GROUPED_LIST_CASES = {"full": [8, 64], "quick": [8]}
GROUPED_LIST_SIZES = {"m": (128, 512, 1000, 2048), "n": (1024, 4096), "k": (1024, 2048, 4096)}


def _weight_gradient(xt: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """grad_w[e] = x_e^T dy_e: the K-grouped GEMM of samattn.grouped_gemm's backward."""
    return torch.ops.samattn.grouped_gemm_k(xt, dy, offsets)


def list_sizes(count: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of each GEMM of a grouped_gemm_list case, the same in every run."""
    rng = random.Random(count)
    return [tuple(rng.choice(GROUPED_LIST_SIZES[d]) for d in "mnk") for _ in range(count)]


def skewed_loads(experts: int, rows: int) -> list[int]:
    """Rows per expert, expert e's share proportional to 1 / (e + 1); the remainder of the
    rounding goes to expert 0."""
    weights = [1.0 / (e + 1) for e in range(experts)]
    total = sum(weights)
    loads = [int(rows * w / total) for w in weights]
    loads[0] += rows - sum(loads)
    return loads


LINEAR_CASES = {
    "full": [
        ("bf16", (tokens, n_in, n_out))
        for tokens in (4096, 16384)
        for n_in, n_out in ((4096, 14336), (14336, 4096))
    ],
    "quick": [("bf16", (4096, 4096, 14336))],
}

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


def attention_grid(dtypes: Sequence[str], seqlens: Sequence[int]) -> list[tuple]:
    """(dtype, case) for every dtype x head dim x seqlen x causal, in that order."""
    return [
        (dt, attention_case(seqlen, d, causal))
        for dt in dtypes
        for d in ATTENTION_HEAD_DIMS
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

SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}

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
# torch's kernel that takes a mask: the baseline of the mask cases.
MASK_BASELINE_BACKEND = "EFFICIENT_ATTENTION"
# Issue 16's targets: a feature costs at most 10% (ratio plain / feature >= 0.9); with a
# mask, at least 1.5x SDPA with the same mask.
TERMS_TARGETS = {"attention_terms": 0.9, "attention_mask": 1.5}


def attention_tflop(case: AttentionCase, direction: str) -> float:
    """Tera-FLOPs of one call: forward 4 * batch * heads * seqlen^2 * d (two GEMMs of
    2 * seqlen^2 * d each), halved when causal; backward (five GEMMs) 2.5x the forward."""
    flop = 4 * case.batch * case.heads * case.seqlen * case.seqlen * case.d
    if case.causal:
        flop /= 2
    return flop * (2.5 if direction == "bwd" else 1.0) / 1e12


def try_call(fn: Callable[..., object], *args: object) -> str | None:
    """Runs fn(*args) once; returns None if it worked, else why not (torch's SDPA raises
    RuntimeError when a forced backend refuses a case, with the reasons in warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn(*args)
            return None
        except (RuntimeError, NotImplementedError, ValueError) as error:
            reasons = [str(w.message).splitlines()[0] for w in caught]
            first_line = (str(error).splitlines() or [type(error).__name__])[0]
            return "; ".join(dict.fromkeys([first_line, *reasons]))


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
# A case whose K/V caches (all the rotated sets) take more than this share of the free GPU
# memory is skipped, with the reason printed and written to the JSON's `skipped`.
DECODE_MEMORY_FRACTION = 0.6
# The small case: also the GPU time per call inside a CUDA graph and the host time per call.
DECODE_SMALL = (1, 1024)  # (batch, seqlen_k)
# The device-to-device copy whose bandwidth the decode bandwidth is compared with.
COPY_BYTES = 2**30


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


def alibi_slopes(heads: int, device: torch.device | str) -> torch.Tensor:
    """ALiBi's geometric slopes, 2 ** (-8 (h + 1) / heads), float32 (heads,)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=device)


def padding_mask(batch: int, seqlen: int, device: torch.device | str) -> torch.Tensor:
    """A bool (batch, 1, seqlen, seqlen) keep-mask of key padding: batch entry b keeps its
    first n_b keys, n_b random in [seqlen / 2, seqlen]; contiguous, as a model that builds
    its mask per query row makes it."""
    lengths = torch.randint(seqlen // 2, seqlen + 1, (batch,), device=device)
    keep = torch.arange(seqlen, device=device)[None, :] < lengths[:, None]
    return keep[:, None, None, :].expand(batch, 1, seqlen, seqlen).contiguous()


def sdpa_with_backend(
    backend_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """torch's scaled_dot_product_attention forced to SDPBackend.<backend_name>, on
    (batch, heads, seq, d) tensors with attn_mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name, None)
    if backend is None:
        raise RuntimeError(f"torch {torch.__version__} has no SDPBackend.{backend_name}")
    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


# samattn's output may differ from torch's by rounding, not by more.
AGREEMENT_LIMIT = 2e-2


# --------------------------------------------------------------- timing ----


class Timer:
    """Median GPU time of a call, with inputs rotated through several sets."""

    def __init__(self, quick: bool) -> None:
        self.target_s = 0.05 if quick else 0.2
        self.min_reps, self.max_reps = (10, 50) if quick else (20, 200)
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.l2_bytes = getattr(props, "L2_cache_size", 0) or 50 * 2**20
        # torch.cuda._sleep counts GPU clock cycles; clock_rate is in kHz = cycles per ms.
        self.cycles_per_ms = getattr(props, "clock_rate", 0) or 2_000_000

    def input_set_count(self, set_bytes: int) -> int:
        """How many input sets to rotate so that their total is well past the L2 cache."""
        if set_bytes >= 2 * self.l2_bytes:
            return 1
        return min(64, math.ceil(3 * self.l2_bytes / max(set_bytes, 1)))

    def _sleep(self, ms: float) -> None:
        torch.cuda._sleep(int(min(ms, 2000.0) * self.cycles_per_ms))

    def median_ms(self, fn: Callable[..., object], input_sets: Sequence[tuple]) -> float:
        sets = len(input_sets)
        # Warm-up, also measuring how long the CPU takes to queue one call.
        warmup = max(3, min(sets, 10))
        torch.cuda.synchronize()
        started = time.perf_counter()
        for i in range(warmup):
            fn(*input_sets[i % sets])
        cpu_ms = (time.perf_counter() - started) * 1e3 / warmup
        torch.cuda.synchronize()

        # A first estimate of the GPU time per call picks the repetitions.
        estimate_calls = max(3, min(sets, 10))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._sleep(estimate_calls * cpu_ms * 1.5 + 1)
        start.record()
        for i in range(estimate_calls):
            fn(*input_sets[i % sets])
        end.record()
        torch.cuda.synchronize()
        gpu_ms = max(start.elapsed_time(end) / estimate_calls, 1e-3)
        reps = int(min(self.max_reps, max(self.min_reps, self.target_s * 1e3 / gpu_ms)))

        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(reps)
        ]
        self._sleep(reps * cpu_ms * 1.3 + 1)
        for i, (start, end) in enumerate(events):
            start.record()
            fn(*input_sets[i % sets])
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events)


# ------------------------------------------------------------- overhead ----


class OverheadCase(NamedTuple):
    """One eager call and torch's equivalent, as thunks over fixed inputs."""

    name: str  # the record's op is "overhead_" + name
    what: str
    samattn: Callable[[], object]
    torch: Callable[[], object]


def overhead_cases() -> list[OverheadCase]:
    import torch.nn.functional as F

    def attention(batch: int, seqlen_q: int, seqlen_k: int, heads: int, d: int, grad: bool):
        q = _randn((batch, seqlen_q, heads, d), torch.bfloat16).requires_grad_(grad)
        k = _randn((batch, seqlen_k, heads, d), torch.bfloat16).requires_grad_(grad)
        v = _randn((batch, seqlen_k, heads, d), torch.bfloat16).requires_grad_(grad)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA's (batch, heads, seq, d)
        if not grad:
            return (
                lambda: samattn.flash_attn_func(q, k, v),
                lambda: F.scaled_dot_product_attention(qt, kt, vt),
            )
        dout = _randn((batch, seqlen_q, heads, d), torch.bfloat16)
        doutt = dout.transpose(1, 2)
        return (
            lambda: torch.autograd.grad(samattn.flash_attn_func(q, k, v), (q, k, v), dout),
            lambda: torch.autograd.grad(
                F.scaled_dot_product_attention(qt, kt, vt), (q, k, v), doutt
            ),
        )

    a, b = _randn((1024, 1024), torch.bfloat16), _randn((1024, 1024), torch.bfloat16)
    a64, b64 = _randn((64, 64), torch.bfloat16), _randn((64, 64), torch.bfloat16)
    x = _randn((64, 1024), torch.float32)
    xl, bl = _randn((64, 1024), torch.bfloat16), _randn((1024,), torch.bfloat16)
    ag, bg = a64.clone().requires_grad_(), b64.clone().requires_grad_()
    xg, dy = x.clone().requires_grad_(), _randn((64, 1024), torch.float32)
    dd = _randn((64, 64), torch.bfloat16)
    return [
        OverheadCase("gemm", "gemm bf16 1024^3", lambda: samattn.gemm(a, b), lambda: a @ b),
        OverheadCase(
            "gemm_small", "gemm bf16 64^3", lambda: samattn.gemm(a64, b64), lambda: a64 @ b64
        ),
        OverheadCase(
            "linear_gelu", "linear + bias + gelu bf16 64x1024 -> 1024",
            lambda: samattn.linear(xl, a, bl, activation="gelu"),
            lambda: F.gelu(F.linear(xl, a, bl)),
        ),
        OverheadCase(
            "softmax", "softmax f32 64x1024", lambda: samattn.softmax(x, -1),
            lambda: torch.softmax(x, -1),
        ),
        OverheadCase(
            "attention", "flash_attn_func bf16 b1 sq128 sk512 h8 d64",
            *attention(1, 128, 512, 8, 64, grad=False),
        ),
        OverheadCase(
            "attention_decode", "flash_attn_func bf16 decode sq1 sk512 h32 d128",
            *attention(1, 1, 512, 32, 128, grad=False),
        ),
        OverheadCase(
            "gemm_backward", "gemm bf16 64^3 forward + backward",
            lambda: torch.autograd.grad(samattn.gemm(ag, bg), (ag, bg), dd),
            lambda: torch.autograd.grad(ag @ bg, (ag, bg), dd),
        ),
        OverheadCase(
            "softmax_backward", "softmax f32 64x1024 forward + backward",
            lambda: torch.autograd.grad(samattn.softmax(xg, -1), (xg,), dy),
            lambda: torch.autograd.grad(torch.softmax(xg, -1), (xg,), dy),
        ),
        OverheadCase(
            "attention_backward", "flash_attn_func bf16 b1 sq128 sk512 h8 d64 forward + backward",
            *attention(1, 128, 512, 8, 64, grad=True),
        ),
    ]  # fmt: skip


def host_us(fn: Callable[[], object], calls: int = 100, rounds: int = 15) -> float:
    """Median host time per call of `calls` asynchronous calls in a row (the GPU drained
    between rounds, so its queue never throttles the loop)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - started) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def host_us_pair(
    first: Callable[[], object],
    second: Callable[[], object],
    calls: int = 100,
    rounds: int = 21,
) -> tuple[float, float]:
    """host_us of two calls, measured in alternating rounds: the machine's host is shared
    and its speed drifts (up to 2x between runs), and a drift must reach both alike."""
    times = host_us_alternating({"first": first, "second": second}, calls, rounds)
    return times["first"], times["second"]


def host_us_alternating(
    functions: dict[str, Callable[[], object]],
    calls: int = 100,
    rounds: int = 21,
    warmup: int = 5,
) -> dict[str, float]:
    """Median host µs per call of each function, the functions taking turns round by round
    (as host_us_pair, for any number of them)."""
    for fn in functions.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(rounds):
        for name, fn in functions.items():
            started = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - started) / calls * 1e6)
            torch.cuda.synchronize()
    return {name: statistics.median(times) for name, times in samples.items()}


def queued_gpu_us(fn: Callable[[], object], calls: int = 100, rounds: int = 10) -> float:
    """GPU time per call of calls issued back to back, as an eager loop meets it: when the
    host is slower than the kernels, this is the host's time."""
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def graph_gpu_us(fn: Callable[[], object], calls: int = 20, rounds: int = 10) -> float:
    """GPU time per call replayed from a captured CUDA graph of `calls` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


# ---------------------------------------------------------------- cases ----


def _randn(shape: Shape, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _relative_difference(x: torch.Tensor, y: torch.Tensor) -> float:
    """||x - y|| / ||y|| (Frobenius), in fp64 a slice at a time: the largest outputs
    (a weight gradient of 64 experts: 3.8 G elements) do not fit the GPU twice in fp64."""
    squares = [0.0, 0.0]
    for xs, ys in zip(x.reshape(-1).split(1 << 26), y.reshape(-1).split(1 << 26)):
        yd = ys.double()
        squares[0] += (xs.double() - yd).square().sum().item()
        squares[1] += yd.square().sum().item()
    return math.sqrt(squares[0]) / max(math.sqrt(squares[1]), 1e-30)


# ---------------------------------------------------------- decode inputs ----

DEVICE = "cuda"  # where the decode section allocates (the CPU tests run it on "cpu")


def _normal(shape: Shape, dtype: torch.dtype) -> torch.Tensor:
    """Random normal data made in place in `dtype`: a 32 GiB bf16 cache needs no fp32 copy."""
    return torch.empty(shape, device=DEVICE, dtype=dtype).normal_()


def _free_memory_bytes() -> int:
    """Free GPU memory, torch's cached blocks released first."""
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


@contextlib.contextmanager
def _value_checks(enabled: bool) -> Iterator[None]:
    """samattn.set_value_checks(enabled) inside the block, the previous setting after. The
    check copies cache_seqlens / block_table to the host once per call and synchronizes:
    GPU timings turn it off, as a serving loop would."""
    setter = getattr(samattn, "set_value_checks", None)
    if setter is None:  # a library without the switch
        yield
        return
    getter = getattr(samattn, "value_checks_enabled", None) or getattr(
        _checks, "value_checks_enabled", None
    )
    previous = bool(getter()) if getter is not None else True
    setter(enabled)
    try:
        yield
    finally:
        setter(previous)


def _decode_inputs(case: DecodeCase, dtype: torch.dtype) -> tuple:
    """(q, k_cache, v_cache, cache_seqlens, block_table): full caches of case.seqlen_k tokens
    per sequence; paged caches with every sequence's pages at random places (block_table
    None for contiguous caches)."""
    q = _normal((case.batch, case.seqlen_q, case.heads, case.d), dtype)
    cache_seqlens = torch.full((case.batch,), case.seqlen_k, dtype=torch.int32, device=DEVICE)
    if not case.paged:
        shape = (case.batch, case.seqlen_k, case.heads_k, case.d)
        return q, _normal(shape, dtype), _normal(shape, dtype), cache_seqlens, None
    pages_per_sequence = -(-case.seqlen_k // case.paged)
    num_pages = case.batch * pages_per_sequence
    shape = (num_pages, case.paged, case.heads_k, case.d)
    block_table = (
        torch.randperm(num_pages, device=DEVICE)
        .to(torch.int32)
        .view(case.batch, pages_per_sequence)
    )
    return q, _normal(shape, dtype), _normal(shape, dtype), cache_seqlens, block_table


def _sequence_kv(k_cache, v_cache, block_table, row: int, seqlen_k: int):
    """Sequence `row`'s keys and values, (seqlen_k, heads_k, d), gathered from its pages."""
    if block_table is None:
        return k_cache[row, :seqlen_k], v_cache[row, :seqlen_k]
    pages = block_table[row].long()
    return tuple(c.index_select(0, pages).flatten(0, 1)[:seqlen_k] for c in (k_cache, v_cache))


def _attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
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


def _sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """The backend torch's SDPA picks for these (batch, heads, seq, d) tensors, or None
    where torch does not say (torch._fused_sdp_choice is private)."""
    try:
        from torch.nn.attention import SDPBackend

        return SDPBackend(torch._fused_sdp_choice(q, k, v, enable_gqa=True)).name
    except Exception:
        return None


class Bench:
    """Runs the cases, prints one line per record and keeps the records."""

    def __init__(
        self,
        timer: Timer,
        families: list[str | None],
        terms_features: Sequence[str] = TERMS_FEATURES,
    ) -> None:
        self.timer = timer
        self.families = families
        self.terms_features = tuple(terms_features)  # those --ops terms measures
        self.records: list[dict[str, Any]] = []
        # {"case": label, "reason": message, **the case's fields}: also written to the JSON.
        self.skipped: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._baselines: dict[tuple, float] = {}  # torch's times, measured once per case
        # Baselines that may refuse a case: (ms, None) or (None, why), measured once per case.
        self._optional_baselines: dict[tuple, tuple[float | None, str | None]] = {}
        self._copy_gbps: float | None = None  # the device-to-device copy, measured once
        # The contiguous decode times, per (family, dtype, case with paged=0), for the paged
        # cases' ratio_to_contiguous.
        self._decode_contiguous_ms: dict[tuple, float] = {}

    def _samattn_ms(self, family: str | None, fn, input_sets) -> tuple[float, str]:
        """Median time of fn under `family` (None: automatic), and the family that ran."""
        with samattn.use_family(family):
            _lib.set_last_family(_lib.FAMILY_AUTO)
            fn(*input_sets[0])
            ran = _lib.last_family() or "?"
            return self.timer.median_ms(fn, input_sets), ran

    def _baseline_ms(self, key: tuple, fn, input_sets) -> float:
        if key not in self._baselines:
            self._baselines[key] = self.timer.median_ms(fn, input_sets)
        return self._baselines[key]

    def _optional_baseline_ms(
        self, key: tuple, make: Callable[[], tuple[Callable[..., object], Sequence[tuple]]]
    ) -> tuple[float | None, str | None]:
        """(median ms, None) of fn over input_sets, with (fn, input_sets) = make(); or
        (None, the reason) when make() or fn refuses the case. Measured once per key."""
        if key not in self._optional_baselines:
            made: list = []
            reason = try_call(lambda: made.extend(make()))
            if reason is None:
                fn, input_sets = made
                reason = try_call(fn, *input_sets[0])
            if reason is None:
                self._optional_baselines[key] = (self.timer.median_ms(fn, input_sets), None)
            else:
                self._optional_baselines[key] = (None, reason)
        return self._optional_baselines[key]

    def _run_case(
        self,
        label: str,
        body: Callable[[str | None], None],
        fields: dict[str, Any] | None = None,
    ) -> None:
        """body(family) for every family; a family or build that cannot run the case
        (UnsupportedError) or a feature not implemented yet (NotImplementedError) is recorded
        as skipped, with `fields` describing the case in the JSON."""
        for family in self.families:
            what = f"{label} [{family or 'auto'}]"
            try:
                body(family)
            except (samattn.UnsupportedError, NotImplementedError) as error:
                self.skipped.append(
                    {
                        "case": what,
                        "family": family or "auto",
                        **(fields or {}),
                        "reason": str(error),
                    }
                )
                print(f"  skipped {what}: {str(error).splitlines()[0]}", flush=True)
            except Exception as error:  # keep benchmarking the other cases
                self.errors.append(f"{what}: {type(error).__name__}: {error}")
                print(f"  ERROR {what}: {type(error).__name__}: {error}", flush=True)
                torch.cuda.synchronize()  # a sticky CUDA error ends the run here

    def _record(self, **fields: Any) -> None:
        baseline = fields["baseline"]
        fields["ratio"] = fields["samattn"] / baseline if baseline else None
        self.records.append(fields)
        print(format_record(fields), flush=True)

    # -- GEMM
    def gemm(self, dtype_name: str, shape: Shape) -> None:
        batch, m, n, k = shape
        dtype, precision = DTYPES[dtype_name]
        a_shape = (batch, m, k) if batch > 1 else (m, k)
        b_shape = (batch, k, n) if batch > 1 else (k, n)
        set_bytes = (batch * m * k + batch * k * n) * torch.empty((), dtype=dtype).element_size()
        count = self.timer.input_set_count(set_bytes)
        sets = [(_randn(a_shape, dtype), _randn(b_shape, dtype)) for _ in range(count)]
        tflop = 2 * batch * m * n * k / 1e12

        def body(family: str | None) -> None:
            saved = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision(precision)
            try:
                ms, ran = self._samattn_ms(family, lambda a, b: samattn.gemm(a, b), sets)
                base_ms = self._baseline_ms(("gemm", dtype_name, shape), torch.matmul, sets)
                with samattn.use_family(family):
                    agreement = _relative_difference(samattn.gemm(*sets[0]), torch.matmul(*sets[0]))
                    config = _cuda.gemm_plan(*sets[0])[1]
            finally:
                torch.set_float32_matmul_precision(saved)
            self._record(
                op="gemm",
                family=ran,
                forced=family is not None,
                dtype=dtype_name,
                shape=list(shape),
                unit="TFLOPS",
                samattn=tflop / (ms / 1e3),
                baseline=tflop / (base_ms / 1e3),
                baseline_name="torch.matmul (cuBLAS)",
                config=config,
                samattn_ms=ms,
                baseline_ms=base_ms,
                difference_to_baseline=agreement,
            )

        self._run_case(f"gemm {dtype_name} {_shape_text(shape)}", body)

    # -- linear + bias + GELU in one GEMM
    def linear(self, dtype_name: str, shape: tuple[int, int, int]) -> None:
        tokens, n_in, n_out = shape
        dtype, _ = DTYPES[dtype_name]
        sets = [
            (_randn((tokens, n_in), dtype), _randn((n_out, n_in), dtype) * 0.02,
             _randn((n_out,), dtype))
        ]  # fmt: skip
        tflop = 2 * tokens * n_in * n_out / 1e12
        import torch.nn.functional as F

        def eager(x, w, b):
            return F.gelu(F.linear(x, w, b))

        compiled = torch.compile(eager, fullgraph=True)
        try:
            compiled(*sets[0])  # compile before timing
            baselines = (("eager", eager), ("compiled", compiled))
        except Exception as error:  # no working inductor here: eager torch only
            print(f"  torch.compile refused linear: {str(error).splitlines()[0]}", flush=True)
            baselines = (("eager", eager),)

        def body(family: str | None) -> None:
            ms, ran = self._samattn_ms(
                family, lambda x, w, b: samattn.linear(x, w, b, activation="gelu"), sets
            )
            with samattn.use_family(family):
                out = samattn.linear(*sets[0], activation="gelu")
            agreement = _relative_difference(out, eager(*sets[0]))
            for name, fn in baselines:
                base_ms = self._baseline_ms(("linear", name, dtype_name, shape), fn, sets)
                self._record(
                    op="linear_epilogue",
                    family=ran,
                    forced=family is not None,
                    dtype=dtype_name,
                    shape=list(shape),
                    unit="TFLOPS",
                    samattn=tflop / (ms / 1e3),
                    baseline=tflop / (base_ms / 1e3),
                    baseline_name=f"F.gelu(F.linear(x, w, b)), torch {name}",
                    versus=name,
                    samattn_ms=ms,
                    baseline_ms=base_ms,
                    difference_to_baseline=agreement,
                )

        self._run_case(f"linear {dtype_name} {'x'.join(map(str, shape))}", body)

    # -- split-K
    def split_k(self, dtype_name: str, shape: tuple[int, int, int]) -> None:
        m, n, k = shape
        dtype, _ = DTYPES[dtype_name]
        set_bytes = (m * k + k * n) * torch.empty((), dtype=dtype).element_size()
        count = self.timer.input_set_count(set_bytes)
        sets = [(_randn((m, k), dtype), _randn((k, n), dtype)) for _ in range(count)]
        tflop = 2 * m * n * k / 1e12

        def body(family: str | None) -> None:
            base_ms = self._baseline_ms(("gemm_split_k", dtype_name, shape), torch.matmul, sets)
            for split_k, mode in SPLIT_K_CHOICES:

                def run(a, b, split_k=split_k, mode=mode):
                    return samattn.gemm(a, b, split_k=split_k, split_k_mode=mode)

                with samattn.use_family(family):
                    refused = try_call(run, *sets[0])
                if refused is not None:
                    self.skipped.append(
                        {
                            "case": f"split_k {_shape_text(shape)} [{family or 'auto'}]",
                            "family": family or "auto",
                            "split_k": split_k,
                            "split_k_mode": mode,
                            "reason": refused,
                        }
                    )
                    print(f"  skipped split_k={split_k} {mode}: {refused}", flush=True)
                    continue
                ms, ran = self._samattn_ms(family, run, sets)
                with samattn.use_family(family):
                    agreement = _relative_difference(run(*sets[0]), torch.matmul(*sets[0]))
                    config = _cuda.gemm_plan(*sets[0], split_k=split_k, split_k_mode=mode)[1]
                self._record(
                    op="gemm_split_k",
                    family=ran,
                    forced=family is not None,
                    dtype=dtype_name,
                    shape=list(shape),
                    split_k=split_k,
                    split_k_mode=mode,
                    unit="TFLOPS",
                    samattn=tflop / (ms / 1e3),
                    baseline=tflop / (base_ms / 1e3),
                    baseline_name="torch.matmul (cuBLAS)",
                    config=config,
                    samattn_ms=ms,
                    baseline_ms=base_ms,
                    difference_to_baseline=agreement,
                )

        self._run_case(f"split_k {dtype_name} {_shape_text(shape)}", body)

    # -- grouped GEMM (mixture of experts)
    def grouped(self, case: tuple[int, int, str]) -> None:
        experts, tokens, projection = case
        n_in, n_out = (GROUPED_HIDDEN, GROUPED_EXPERT_DIM)
        if projection.startswith("down"):
            n_in, n_out = n_out, n_in
        rows = 2 * tokens
        loads = skewed_loads(experts, rows)
        dtype = torch.bfloat16
        x = _randn((rows, n_in), dtype)
        offsets = torch.tensor(loads, dtype=torch.int32).cumsum(0).int().to(x.device)
        tflop = 2 * rows * n_in * n_out / 1e12
        shape = [experts, tokens, n_in, n_out]
        if projection.endswith("_wgrad"):
            self._grouped_weight_gradient(case, x, offsets, loads, n_out, tflop, shape)
            return
        w = _randn((experts, n_in, n_out), dtype) * 0.02
        sets = [(x, w, offsets)]

        def loop(x, w, offsets):
            out = x.new_empty(rows, n_out)
            begin = 0
            for e, count in enumerate(loads):  # the host knows the loads: no sync
                torch.mm(x[begin : begin + count], w[e], out=out[begin : begin + count])
                begin += count
            return out

        # torch._grouped_mm wants the weights' K contiguous (w.mT of an (E, N, K) tensor).
        w_t = w.mT.contiguous().mT
        self._grouped_records(
            case, samattn.grouped_gemm, sets, loop,
            lambda x, w, offsets: torch._grouped_mm(x, w_t, offs=offsets), loads, tflop, shape,
        )  # fmt: skip

    def _grouped_weight_gradient(
        self,
        case: tuple[int, int, str],
        x: torch.Tensor,
        offsets: torch.Tensor,
        loads: list[int],
        n_out: int,
        tflop: float,
        shape: list[int],
    ) -> None:
        """grad_w[e] = x_e^T dy_e, as samattn.grouped_gemm's backward computes it."""
        experts = case[0]
        dy = _randn((x.shape[0], n_out), x.dtype) * 0.02

        def loop(xt, dy, offsets):
            out = xt.new_empty(experts, xt.shape[0], n_out)
            begin = 0
            for e, count in enumerate(loads):  # the host knows the loads: no sync
                torch.mm(xt[:, begin : begin + count], dy[begin : begin + count], out=out[e])
                begin += count
            return out

        self._grouped_records(
            case, _weight_gradient, [(x.mT, dy, offsets)], loop,
            lambda xt, dy, offsets: torch._grouped_mm(xt, dy, offs=offsets), loads, tflop, shape,
        )  # fmt: skip

    def _grouped_records(
        self,
        case: tuple[int, int, str],
        samattn_fn: Callable[..., torch.Tensor],
        sets: list[tuple],
        loop: Callable[..., torch.Tensor],
        torch_grouped: Callable[..., torch.Tensor],
        loads: list[int],
        tflop: float,
        shape: list[int],
    ) -> None:
        """The records of one grouped case: samattn_fn against the loop of torch.mm and,
        where the installed torch has it and it runs the case, torch._grouped_mm."""
        experts, tokens, projection = case
        baselines = [("torch.mm loop", loop)]
        if getattr(torch, "_grouped_mm", None) is not None:
            refused = try_call(torch_grouped, *sets[0])
            if refused is None:
                baselines.append(("torch._grouped_mm", torch_grouped))
            else:
                print(f"  torch._grouped_mm refused: {refused}", flush=True)

        def body(family: str | None) -> None:
            ms, ran = self._samattn_ms(family, samattn_fn, sets)
            with samattn.use_family(family):
                out = samattn_fn(*sets[0])
            agreement = _relative_difference(out, loop(*sets[0]))
            del out
            for name, fn in baselines:
                base_ms = self._baseline_ms(("grouped", name, projection, *shape), fn, sets)
                self._record(
                    op="grouped_gemm",
                    family=ran,
                    forced=family is not None,
                    dtype="bf16",
                    shape=shape,
                    experts=experts,
                    tokens=tokens,
                    projection=projection,
                    loads=loads,
                    unit="TFLOPS",
                    samattn=tflop / (ms / 1e3),
                    baseline=tflop / (base_ms / 1e3),
                    baseline_name=name,
                    versus=name,
                    samattn_ms=ms,
                    baseline_ms=base_ms,
                    difference_to_baseline=agreement,
                )

        self._run_case(f"grouped {experts} experts {tokens} tokens {projection}", body)

    # -- a list of independent GEMMs
    def grouped_list(self, count: int) -> None:
        sizes = list_sizes(count)
        as_ = [_randn((m, k), torch.bfloat16) for m, _, k in sizes]
        bs = [_randn((k, n), torch.bfloat16) * 0.02 for _, n, k in sizes]
        sets = [(as_, bs)]
        tflop = sum(2 * m * n * k for m, n, k in sizes) / 1e12

        def loop(as_, bs):
            return [torch.mm(a, b) for a, b in zip(as_, bs)]

        def body(family: str | None) -> None:
            ms, ran = self._samattn_ms(family, samattn.grouped_gemm_list, sets)
            base_ms = self._baseline_ms(("grouped_list", count), loop, sets)
            with samattn.use_family(family):
                outs = samattn.grouped_gemm_list(as_, bs)
            agreement = max(_relative_difference(o, r) for o, r in zip(outs, loop(as_, bs)))
            self._record(
                op="grouped_gemm_list",
                family=ran,
                forced=family is not None,
                dtype="bf16",
                shape=[count],
                sizes=[list(size) for size in sizes],
                unit="TFLOPS",
                samattn=tflop / (ms / 1e3),
                baseline=tflop / (base_ms / 1e3),
                baseline_name="torch.mm loop",
                versus="torch.mm loop",
                samattn_ms=ms,
                baseline_ms=base_ms,
                difference_to_baseline=agreement,
            )

        self._run_case(f"grouped_gemm_list {count} GEMMs", body)

    # -- eager overhead
    def overhead(self, case: OverheadCase) -> None:
        def body(family: str | None) -> None:
            with samattn.use_family(family):
                _lib.set_last_family(_lib.FAMILY_AUTO)
                case.samattn()
                ran = _lib.last_family() or "?"
                ours, theirs = host_us_pair(case.samattn, case.torch)
                fields: dict[str, Any] = {}
                for name, measure in (("queued", queued_gpu_us), ("graph", graph_gpu_us)):
                    for who, fn in (("samattn", case.samattn), ("baseline", case.torch)):
                        reason = try_call(measure, fn)  # a graph may refuse a call
                        key = f"{who}_{name}_us"
                        fields[key] = measure(fn) if reason is None else None
                        if reason is not None:
                            fields[f"{key}_skipped"] = reason
            record = dict(
                op="overhead_" + case.name,
                family=ran,
                forced=family is not None,
                dtype="-",
                shape=[],
                what=case.what,
                unit="us",
                samattn=ours,
                baseline=theirs,
                baseline_name="torch eager (same tensors)",
                **fields,
            )
            self.records.append({**record, "ratio": theirs / ours})
            print(format_record(self.records[-1]), flush=True)

        self._run_case(f"overhead {case.what}", body)

    # -- softmax
    def softmax(self, dtype_name: str, shape: Shape) -> None:
        dtype = DTYPES[dtype_name][0]
        x = _randn(shape, dtype)
        count = self.timer.input_set_count(_nbytes(x))
        xs = [(x,)] + [(_randn(shape, dtype),) for _ in range(count - 1)]
        forward_gb = 2 * _nbytes(x) / 1e9
        backward_gb = 3 * _nbytes(x) / 1e9
        # Backward inputs: a valid y = softmax(x) and a random dy.
        backward_sets = [(torch.softmax(x, -1), _randn(shape, dtype)) for (x,) in xs]

        def forward(family: str | None) -> None:
            ms, ran = self._samattn_ms(family, lambda x: samattn.softmax(x, -1), xs)
            key = ("softmax_forward", dtype_name, shape)
            base_ms = self._baseline_ms(key, lambda x: torch.softmax(x, -1), xs)
            copy_sets = [(x, torch.empty_like(x)) for (x,) in xs]
            copy_ms = self._baseline_ms(("copy", *key), lambda x, y: y.copy_(x), copy_sets)
            del copy_sets
            with samattn.use_family(family):
                agreement = _relative_difference(samattn.softmax(x, -1), torch.softmax(x, -1))
            self._record(
                op="softmax_forward",
                family=ran,
                forced=family is not None,
                dtype=dtype_name,
                shape=list(shape),
                unit="GB/s",
                samattn=forward_gb / (ms / 1e3),
                baseline=forward_gb / (base_ms / 1e3),
                baseline_name="torch.softmax",
                samattn_ms=ms,
                baseline_ms=base_ms,
                copy=forward_gb / (copy_ms / 1e3),
                ratio_to_copy=copy_ms / ms,
                difference_to_baseline=agreement,
            )

        def backward(family: str | None) -> None:
            def samattn_backward(y, dy):
                return torch.ops.samattn.softmax_backward(y, dy, -1)

            def torch_backward(y, dy):
                return torch._softmax_backward_data(dy, y, -1, dtype)

            ms, ran = self._samattn_ms(family, samattn_backward, backward_sets)
            key = ("softmax_backward", dtype_name, shape)
            base_ms = self._baseline_ms(key, torch_backward, backward_sets)
            with samattn.use_family(family):
                agreement = _relative_difference(
                    samattn_backward(*backward_sets[0]), torch_backward(*backward_sets[0])
                )
            self._record(
                op="softmax_backward",
                family=ran,
                forced=family is not None,
                dtype=dtype_name,
                shape=list(shape),
                unit="GB/s",
                samattn=backward_gb / (ms / 1e3),
                baseline=backward_gb / (base_ms / 1e3),
                baseline_name="torch._softmax_backward_data",
                samattn_ms=ms,
                baseline_ms=base_ms,
                difference_to_baseline=agreement,
            )

        self._run_case(f"softmax_forward {dtype_name} {_shape_text(shape)}", forward)
        self._run_case(f"softmax_backward {dtype_name} {_shape_text(shape)}", backward)

    # -- attention
    def attention(self, dtype_name: str, case: AttentionCase) -> None:
        """Forward and backward of samattn.flash_attn_func against SDPA's flash and cuDNN
        backends, on the same (batch, seqlen, heads, d) tensors (SDPA: transposed views)."""
        from torch.nn.attention import SDPBackend

        dtype = DTYPES[dtype_name][0]
        shape = (case.batch, case.seqlen, case.heads, case.d)
        set_bytes = 3 * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        count = self.timer.input_set_count(set_bytes)
        sets = [tuple(_randn(shape, dtype) for _ in range(3)) for _ in range(count)]
        dout = _randn(shape, dtype)
        causal = case.causal

        def samattn_forward(q, k, v):
            return samattn.flash_attn_func(q, k, v, causal=causal)

        def sdpa_forward(backend_name: str) -> Callable[..., torch.Tensor]:
            backend = getattr(SDPBackend, SDPA_BACKENDS[backend_name], None)

            def forward(q, k, v):
                if backend is None:
                    raise RuntimeError(
                        f"torch {torch.__version__} has no SDPBackend.{SDPA_BACKENDS[backend_name]}"
                    )
                with torch.nn.attention.sdpa_kernel(backend):
                    out = torch.nn.functional.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
                    )
                return out.transpose(1, 2)

            return forward

        implementations = {"samattn": samattn_forward}
        implementations.update((name, sdpa_forward(name)) for name in SDPA_BACKENDS)
        what = f"{dtype_name} {_shape_text(case[:4])}{' causal' if causal else ''}"
        fields = {"dtype": dtype_name, **case._asdict()}

        def record(direction: str, family: str | None, ms: float, ran: str, reference, output):
            tflop = attention_tflop(case, direction)
            timings = {
                name: self._optional_baseline_ms(
                    (f"attention_{direction}", dtype_name, case, name),
                    functools.partial(reference, name),
                )
                for name in SDPA_BACKENDS
            }
            flash_ms, flash_skipped = timings["flash"]
            cudnn_ms, cudnn_skipped = timings["cudnn"]
            compared = next((name for name in SDPA_BACKENDS if timings[name][0]), None)
            extra: dict[str, Any] = {}
            if flash_skipped:
                extra["baseline_skipped"] = flash_skipped
            if cudnn_skipped:
                extra["cudnn_skipped"] = cudnn_skipped
            cudnn = tflop / (cudnn_ms / 1e3) if cudnn_ms else None
            samattn_tflops = tflop / (ms / 1e3)
            with samattn.use_family(family):
                difference = output(compared) if compared else None
            self._record(
                op=f"attention_{'forward' if direction == 'fwd' else 'backward'}",
                family=ran,
                forced=family is not None,
                dtype=dtype_name,
                shape=list(case[:4]),
                **case._asdict(),
                direction=direction,
                unit="TFLOPS",
                samattn=samattn_tflops,
                baseline=tflop / (flash_ms / 1e3) if flash_ms else None,
                baseline_name="sdpa FLASH_ATTENTION (FlashAttention-2)",
                cudnn=cudnn,
                ratio_to_cudnn=samattn_tflops / cudnn if cudnn else None,
                samattn_ms=ms,
                baseline_ms=flash_ms,
                cudnn_ms=cudnn_ms,
                difference_to_baseline=difference,
                compared_with=compared,
                **extra,
            )

        def forward(family: str | None) -> None:
            ms, ran = self._samattn_ms(family, samattn_forward, sets)

            def output_difference(name: str) -> float:
                return _relative_difference(
                    samattn_forward(*sets[0]), implementations[name](*sets[0])
                )

            def reference(name: str):
                return implementations[name], sets

            record("fwd", family, ms, ran, reference, output_difference)

        def backward_sets(name: str, family: str | None) -> list[tuple]:
            """(out, q, k, v, dout) per input set, out from one forward with requires_grad."""
            graphs = []
            with samattn.use_family(family):
                for inputs in sets:
                    q, k, v = (t.detach().requires_grad_() for t in inputs)
                    graphs.append((implementations[name](q, k, v), q, k, v, dout))
            return graphs

        def gradients(out, q, k, v, dout):
            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        def backward_family(family: str | None) -> str:
            """The family of the backward op called once on this thread (autograd runs it
            on its own thread, out of sight of the last-family record; it may choose
            another family than the forward did)."""
            q, k, v = sets[0]
            with samattn.use_family(family):
                out, lse, _ = samattn.flash_attn_func(
                    q, k, v, causal=causal, return_attn_probs=True
                )
                _lib.set_last_family(_lib.FAMILY_AUTO)
                torch.ops.samattn.flash_attn_backward(
                    dout, q, k, v, out, lse, None, None, case.seqlen, case.seqlen,
                    case.d**-0.5, causal, -1, -1, 0.0, False,
                )  # fmt: skip
            return _lib.last_family() or "?"

        def backward(family: str | None) -> None:
            samattn_graphs = backward_sets("samattn", family)
            ms, ran = self._samattn_ms(family, gradients, samattn_graphs)
            if ran == "?":
                ran = backward_family(family)

            def reference(name: str):
                return gradients, backward_sets(name, None)

            def gradient_difference(name: str) -> float:
                ours = gradients(*samattn_graphs[0])
                theirs = gradients(*backward_sets(name, None)[0])
                return max(_relative_difference(a, b) for a, b in zip(ours, theirs))

            record("bwd", family, ms, ran, reference, gradient_difference)

        self._run_case(f"attention_forward {what}", forward, {"op": "attention_forward", **fields})
        self._run_case(
            f"attention_backward {what}", backward, {"op": "attention_backward", **fields}
        )

    # -- score terms and masks
    def terms(self, dtype_name: str, case: AttentionCase) -> None:
        """Forward and backward of flash_attn_func with each of TERMS_FEATURES against the
        same call without it ("attention_terms", ratio = plain time / feature time), and
        the masked calls against SDPA's memory-efficient backend with the same mask
        ("attention_mask", ratio = SDPA's time / samattn's). The masks go through
        samattn.scaled_dot_product_attention when not causal; causal, through
        flash_attn_func(causal=True, attn_mask=...) (SDPA refuses is_causal with a mask),
        with SDPA given the mask and the causal mask as one. The masks are key padding
        (padding_mask): the masked call skips tiles of padded keys that the call without it
        computes, so the mask records carry mask_keeps, the fraction of the mask's elements
        it keeps (averaged over the input sets), to read their ratio by."""
        dtype = DTYPES[dtype_name][0]
        causal = case.causal
        shape = (case.batch, case.seqlen, case.heads, case.d)
        mask_shape = (case.batch, 1, case.seqlen, case.seqlen)
        element = torch.empty((), dtype=dtype).element_size()
        # q, k, v, the bool mask (1 byte) and the float32 one (4 bytes) of each set.
        count = self.timer.input_set_count(
            3 * math.prod(shape) * element + 5 * math.prod(mask_shape)
        )
        sets = []
        for _ in range(count):
            q, k, v = (_randn(shape, dtype) for _ in range(3))
            keep = padding_mask(case.batch, case.seqlen, q.device)
            bias = torch.zeros(mask_shape, device=q.device).masked_fill_(~keep, -math.inf)
            sets.append((q, k, v, keep, bias))
        mask_keeps = sum(keep.float().mean().item() for *_, keep, _ in sets) / len(sets)
        dout = _randn(shape, dtype)
        slopes = alibi_slopes(case.heads, dout.device)
        sinks = torch.randn(case.heads, device=dout.device)
        what = f"{dtype_name} {_shape_text(case[:4])}{' causal' if causal else ''}"

        def call(feature: str, q, k, v, keep, bias, sink_logits):
            """The measured call: samattn with `feature` ("plain": none)."""
            if feature == "alibi":
                return samattn.flash_attn_func(q, k, v, causal=causal, alibi_slopes=slopes)
            if feature == "sinks":
                return samattn.flash_attn_func(q, k, v, causal=causal, sinks=sink_logits)
            if feature in MASK_FEATURES:
                mask = keep if feature == "bool_mask" else bias
                if causal:
                    return samattn.flash_attn_func(q, k, v, causal=True, attn_mask=mask)
                out = samattn.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
                )
                return out.transpose(1, 2)
            return samattn.flash_attn_func(q, k, v, causal=causal)

        def gradients(out, inputs):
            return torch.autograd.grad(out, inputs, dout, retain_graph=True)

        def samattn_graphs(feature: str, family: str | None) -> list[tuple]:
            """(out, the inputs to differentiate) per set: q, k, v, and the sinks."""
            graphs = []
            with samattn.use_family(family):
                for q, k, v, keep, bias in sets:
                    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                    if feature == "sinks":
                        leaves.append(sinks.detach().clone().requires_grad_())
                    logits = leaves[3] if feature == "sinks" else None
                    graphs.append((call(feature, *leaves[:3], keep, bias, logits), leaves))
            return graphs

        plain: dict[tuple, float] = {}  # (family, direction) -> ms of the plain call

        def measure(feature: str, family: str | None, direction: str) -> tuple[float, str]:
            if direction == "fwd":
                inputs = [(*inputs, sinks) for inputs in sets]
                return self._samattn_ms(family, functools.partial(call, feature), inputs)
            _lib.set_last_family(_lib.FAMILY_AUTO)
            graphs = samattn_graphs(feature, family)
            forward_ran = _lib.last_family() or "?"
            ms, ran = self._samattn_ms(family, gradients, graphs)
            # Autograd runs the backward on its own thread, out of the last-family record.
            return ms, forward_ran if ran == "?" else ran

        def torch_inputs(feature: str, inputs: tuple) -> tuple:
            """SDPA's (batch, heads, seq, d) views and the same mask (float: in q's dtype,
            which its kernel reads), with the causal mask folded in when causal."""
            q, k, v, keep, bias = inputs
            mask = keep if feature == "bool_mask" else bias.to(dtype)
            if causal:
                lower = torch.ones(case.seqlen, case.seqlen, dtype=torch.bool, device=q.device)
                lower = lower.tril()
                mask = (
                    mask & lower if feature == "bool_mask" else mask.masked_fill(~lower, -math.inf)
                )
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask

        def sdpa(q, k, v, mask):
            out = sdpa_with_backend(MASK_BASELINE_BACKEND, q, k, v, mask)
            return out.transpose(1, 2)  # (batch, seq, heads, d), as samattn's

        def torch_graphs(feature: str) -> list[tuple]:
            graphs = []
            for q, k, v, mask in (torch_inputs(feature, inputs) for inputs in sets):
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                graphs.append((sdpa(*leaves, mask), leaves))
            return graphs

        def torch_make(feature: str, direction: str):
            def make():
                if direction == "fwd":
                    return sdpa, [torch_inputs(feature, inputs) for inputs in sets]
                return gradients, torch_graphs(feature)

            return make

        def difference(feature: str, direction: str, family: str | None) -> float:
            """samattn against SDPA on the first set: the output, or the largest relative
            difference of dq, dk, dv (SDPA's transposed to samattn's layout)."""
            with samattn.use_family(family):
                if direction == "fwd":
                    ours = call(feature, *sets[0], sinks)
                    return _relative_difference(ours, sdpa(*torch_inputs(feature, sets[0])))
                ours = gradients(*samattn_graphs(feature, family)[0])
            theirs = gradients(*torch_graphs(feature)[0])
            return max(_relative_difference(a, b.transpose(1, 2)) for a, b in zip(ours, theirs))

        def body(feature: str, direction: str, family: str | None) -> None:
            key = (family, direction)
            if key not in plain:
                plain[key] = measure("plain", family, direction)[0]
            ms, ran = measure(feature, family, direction)
            tflop = attention_tflop(case, direction)
            common = dict(
                family=ran, forced=family is not None, dtype=dtype_name, shape=list(case[:4]),
                **case._asdict(), feature=feature, direction=direction, unit="TFLOPS",
                samattn=tflop / (ms / 1e3), samattn_ms=ms,
                **({"mask_keeps": mask_keeps} if feature in MASK_FEATURES else {}),
            )  # fmt: skip
            self._record(
                op="attention_terms",
                what=f"{feature} {direction} {what}",
                **common,
                baseline=tflop / (plain[key] / 1e3),
                baseline_name="samattn without the feature",
                baseline_ms=plain[key],
            )
            if feature not in MASK_FEATURES:
                return
            base_ms, reason = self._optional_baseline_ms(
                ("attention_mask", direction, dtype_name, case, feature),
                torch_make(feature, direction),
            )
            extra: dict[str, Any] = {"baseline_skipped": reason} if reason else {}
            via = "flash_attn_func(causal=True, attn_mask=...)" if causal else "sdpa(attn_mask=...)"
            self._record(
                op="attention_mask",
                what=f"{feature} {direction} {what}",
                **common,
                baseline=tflop / (base_ms / 1e3) if base_ms else None,
                baseline_name=f"sdpa {MASK_BASELINE_BACKEND} (the same mask)",
                baseline_ms=base_ms,
                samattn_call=via,
                mask_shape=list(mask_shape),
                mask_dtype="bool" if feature == "bool_mask" else "float32",
                baseline_mask_dtype="bool" if feature == "bool_mask" else dtype_name,
                difference_to_baseline=difference(feature, direction, family) if base_ms else None,
                **extra,
            )

        fields = {"dtype": dtype_name, **case._asdict()}
        for feature in self.terms_features:
            for direction in ("fwd", "bwd"):
                self._run_case(
                    f"attention_terms {feature} {direction} {what}",
                    functools.partial(body, feature, direction),
                    {"op": "attention_terms", "feature": feature, "direction": direction,
                     **fields},
                )  # fmt: skip

    # -- decode
    def copy_gbps(self) -> float:
        """Device-to-device copy bandwidth (bytes read + written / time) of a COPY_BYTES
        buffer, measured once per run; printed."""
        if self._copy_gbps is None:
            source = torch.empty(COPY_BYTES, dtype=torch.uint8, device=DEVICE).fill_(1)
            target = torch.empty_like(source)
            ms = self.timer.median_ms(lambda x, y: y.copy_(x), [(source, target)])
            self._copy_gbps = 2 * COPY_BYTES / 1e9 / (ms / 1e3)
            print(
                f"device-to-device copy: {self._copy_gbps:.0f} GB/s "
                f"(read + write of {COPY_BYTES / 2**30:.3g} GiB)",
                flush=True,
            )
        return self._copy_gbps

    def _skip(self, label: str, reason: str, fields: dict[str, Any]) -> None:
        """Records a case that runs for no family (e.g. too large for this GPU)."""
        for family in self.families:
            what = f"{label} [{family or 'auto'}]"
            self.skipped.append(
                {"case": what, "family": family or "auto", **fields, "reason": reason}
            )
        print(f"  skipped {label}: {reason}", flush=True)

    def decode(self, dtype_name: str, case: DecodeCase) -> None:
        """samattn.flash_attn_with_kvcache on full caches (contiguous or paged) against
        torch's scaled_dot_product_attention on the same contiguous problem (k and v as
        (batch, heads_k, seqlen_k, d) views of the caches, enable_gqa, whichever backend
        torch picks), non-causal in both."""
        import torch.nn.functional as F

        dtype = DTYPES[dtype_name][0]
        kv_bytes = decode_kv_bytes(case, torch.empty((), dtype=dtype).element_size())
        kv_gb = kv_bytes / 1e9
        what = decode_what(case)
        label = f"decode {dtype_name} {what}"
        fields: dict[str, Any] = {"op": "decode", "dtype": dtype_name, **case._asdict()}
        count = self.timer.input_set_count(kv_bytes)
        copy_gbps = self.copy_gbps()
        free = _free_memory_bytes()
        if count * kv_bytes > DECODE_MEMORY_FRACTION * free:
            self._skip(
                label,
                f"its K/V caches ({count} x {kv_bytes / 2**30:.1f} GiB) would take more than "
                f"{DECODE_MEMORY_FRACTION:.0%} of the {free / 2**30:.1f} GiB of free GPU memory",
                {**fields, "kv_bytes": kv_bytes},
            )
            return
        sets = [_decode_inputs(case, dtype) for _ in range(count)]
        contiguous = case._replace(paged=0)
        small = (case.batch, case.seqlen_k) == DECODE_SMALL

        def samattn_decode(q, k_cache, v_cache, cache_seqlens, block_table):
            kvcache = getattr(samattn, "flash_attn_with_kvcache", None)
            if kvcache is None:
                raise NotImplementedError(
                    f"samattn {samattn.__version__} has no flash_attn_with_kvcache"
                )
            return kvcache(
                q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table
            )

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
                k, v = _sequence_kv(k_cache, v_cache, block_table, row, case.seqlen_k)
                reference = _attention_reference(q[row], k, v)
                differences.append(_relative_difference(out[row], reference))
            return max(differences)

        def body(family: str | None) -> None:
            with samattn.use_family(family):  # one call with the value checks on
                out = samattn_decode(*sets[0])
            difference = reference_difference(out)
            with _value_checks(False):
                ms, ran = self._samattn_ms(family, samattn_decode, sets)
                extra: dict[str, Any] = {}
                base_ms = None
                if not case.paged:
                    self._decode_contiguous_ms[(family, dtype_name, contiguous)] = ms
                    base_ms, reason = self._optional_baseline_ms(
                        ("decode", dtype_name, contiguous), lambda: (sdpa_decode, sdpa_sets)
                    )
                    if reason is not None:
                        extra["baseline_skipped"] = reason
                    extra["baseline_backend"] = _sdpa_backend(*sdpa_sets[0])
                else:
                    contiguous_ms = self._decode_contiguous_ms.get((family, dtype_name, contiguous))
                    extra["contiguous_us"] = contiguous_ms * 1e3 if contiguous_ms else None
                    extra["ratio_to_contiguous"] = contiguous_ms / ms if contiguous_ms else None
                if small:
                    with samattn.use_family(family):
                        extra.update(
                            self._decode_latency(
                                lambda: samattn_decode(*sets[0]),
                                None if case.paged else lambda: sdpa_decode(*sdpa_sets[0]),
                            )
                        )
            samattn_gbps = kv_gb / (ms / 1e3)
            self._record(
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

        self._run_case(label, body, fields)

    def _decode_latency(
        self, ours: Callable[[], object], theirs: Callable[[], object] | None
    ) -> dict[str, Any]:
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
            measure(f"{who}_graph_us", graph_gpu_us, fn)
            measure(f"{who}_host_us", host_us, fn)
        with _value_checks(True):
            measure("samattn_host_checked_us", host_us, ours)
        return fields


# ------------------------------------------------------------ reporting ----


def _shape_text(shape: Sequence[int]) -> str:
    return "x".join(str(s) for s in shape)


def _family_text(r: dict[str, Any]) -> str:
    return r["family"] + ("" if r["forced"] else "*")


DECODE_HEADER = (
    f"decode: flash_attn_with_kvcache, {DECODE_HEADS} query heads over {DECODE_HEADS_K} KV heads, "
    f"d{DECODE_HEAD_DIM}, full caches; GB/s of K and V read, ratio = sdpa time / samattn time"
)

TERMS_HEADER = (
    "score terms and masks: attention_terms ratio = plain time / time with the feature "
    f"(target {TERMS_TARGETS['attention_terms']:.2f}); attention_mask ratio = sdpa "
    f"{MASK_BASELINE_BACKEND} time / samattn time with the same mask (target "
    f"{TERMS_TARGETS['attention_mask']:.1f})"
)

TABLE_HEADER = (
    f"{'op':<17} {'family':<6} {'dtype':<5} {'shape':<22} "
    f"{'samattn':>9} {'torch':>9} {'ratio':>6}  unit   "
    "(* automatic family; gemm shape: batch x M x N x K)"
)


def _number(value: float | None, width: int, digits: int) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def _case_text(r: dict[str, Any]) -> str:
    if "what" in r:
        return r["what"]
    text = _shape_text(r["shape"]) + (" causal" if r.get("causal") else "")
    return text + (f" vs {r['versus']}" if "versus" in r else "")


def _mismatch(r: dict[str, Any]) -> bool:
    differences = (r.get("difference_to_baseline"), r.get("difference_to_reference"))
    return any(d is not None and d > AGREEMENT_LIMIT for d in differences)


def _difference(r: dict[str, Any]) -> float:
    differences = (r.get("difference_to_baseline"), r.get("difference_to_reference"))
    return max(d for d in differences if d is not None)


def _decode_text(r: dict[str, Any]) -> str:
    """A decode record's extras: GPU time, share of the copy bandwidth, the paged / contiguous
    ratio and the small case's latencies."""
    text = f"  {r['samattn_us']:.1f} us, {r['copy_fraction']:.2f} of copy"
    if r.get("baseline_us"):
        text += f", sdpa {r['baseline_us']:.1f} us ({r.get('baseline_backend') or '?'})"
    if r.get("ratio_to_contiguous") is not None:
        text += f", {r['ratio_to_contiguous']:.2f} of contiguous"
    latencies = [
        f"{name} {r[key]:.1f}"
        for name, key in (
            ("graph", "samattn_graph_us"),
            ("sdpa graph", "baseline_graph_us"),
            ("host", "samattn_host_us"),
            ("sdpa host", "baseline_host_us"),
            ("host checked", "samattn_host_checked_us"),
        )
        if r.get(key) is not None
    ]
    if latencies:
        text += f"; us per call: {', '.join(latencies)}"
    return text


def format_record(r: dict[str, Any]) -> str:
    line = (
        f"{r['op']:<17} {_family_text(r):<6} {r['dtype']:<5} {_case_text(r):<22} "
        f"{r['samattn']:>9.1f} {_number(r['baseline'], 9, 1)} {_number(r['ratio'], 6, 2)}  "
        f"{r['unit']}"
    )
    if "split_k" in r:
        line += f"  split_k={r['split_k']} {r['split_k_mode']}"
    if "ratio_to_copy" in r:
        line += f"  ({r['ratio_to_copy']:.2f} of copy at {r['copy']:.0f} GB/s)"
    if r["op"] == "decode":
        line += _decode_text(r)
    if "cudnn" in r:
        line += f"  cudnn {_number(r['cudnn'], 0, 1)} ratio {_number(r['ratio_to_cudnn'], 0, 2)}"
    for key in ("baseline_skipped", "cudnn_skipped"):
        if key in r:
            line += f"  ({key.split('_')[0]} refused: {r[key].splitlines()[0][:80]})"
    if _mismatch(r):
        line += f"  MISMATCH: differs from torch by {_difference(r):.2g}"
    return line


# The targets for the sm80 family's attention: samattn / SDPA flash backend.
ATTENTION_TARGETS = {"attention_forward": 1.0, "attention_backward": 0.9}

# Issue 15's decode targets: (field, target, which records, what they are).
DECODE_TARGETS = (
    ("copy_fraction", 0.8, lambda r: r["kv_bytes"] >= 256 * 2**20, "of copy, >= 256 MiB read"),
    ("ratio", 1.0, lambda r: not r["paged"], "x sdpa, contiguous"),
    ("ratio_to_contiguous", 0.95, lambda r: r["paged"], "of contiguous, paged"),
)


def decode_summary(records: list[dict[str, Any]]) -> list[str]:
    """Per family, how many decode cases meet each of issue 15's targets, and which not."""
    lines = []
    for family in sorted({r["family"] for r in records if r["op"] == "decode"}):
        rows = [r for r in records if r["op"] == "decode" and r["family"] == family]
        for key, target, applies, what in DECODE_TARGETS:
            measured = [r for r in rows if applies(r) and r.get(key) is not None]
            below = [r for r in measured if r[key] < target]
            if not measured:
                continue
            lines.append(
                f"  decode {family} target {target:.2f} {what}: "
                f"{len(measured) - len(below)} of {len(measured)} cases meet it"
                + "".join(f"\n    below: {_case_text(r)} {r[key]:.2f}" for r in below)
            )
    return lines


def terms_summary(records: list[dict[str, Any]]) -> list[str]:
    """Per op (attention_terms, attention_mask), family, feature and direction: the range
    of the ratios and how many cases meet issue 16's target, and which not."""
    lines = []
    rows: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        if r["op"] in TERMS_TARGETS and r["ratio"] is not None:
            key = (r["op"], r["family"], r["feature"], r["direction"])
            rows.setdefault(key, []).append(r)
    for (op, family, feature, direction), group in sorted(rows.items()):
        target = TERMS_TARGETS[op]
        ratios = [r["ratio"] for r in group]
        below = [r for r in group if r["ratio"] < target]
        lines.append(
            f"  {op} {family} {feature} {direction}: {min(ratios):.2f} .. {max(ratios):.2f}, "
            f"target {target:.2f} met by {len(group) - len(below)} of {len(group)}"
            + "".join(f"\n    below: {_case_text(r)} {r['ratio']:.2f}" for r in below)
        )
    return lines


def summarize(bench: Bench) -> str:
    """Geometric mean, min and max of the ratios per op x dtype x family."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in bench.records:
        if r["ratio"] is not None and r["op"] not in TERMS_TARGETS:  # terms_summary's
            op = r["op"] + (f" vs {r['versus']}" if "versus" in r else "")
            groups.setdefault((op, r["dtype"], r["family"]), []).append(r["ratio"])
    lines = ["", "summary: samattn / torch (above 1: samattn is faster)"]
    for (op, dtype, family), ratios in sorted(groups.items()):
        geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines.append(
            f"  {op:<17} {dtype:<5} {family:<6} geomean {geomean:5.2f}  "
            f"min {min(ratios):5.2f}  max {max(ratios):5.2f}  ({len(ratios)} shapes)"
        )
    copies = [r["ratio_to_copy"] for r in bench.records if "ratio_to_copy" in r]
    if copies:
        lines.append(f"  softmax forward vs copy bandwidth: {min(copies):.2f} .. {max(copies):.2f}")
    cudnn: dict[tuple[str, str, str], list[float]] = {}
    for r in bench.records:
        if r.get("ratio_to_cudnn") is not None:
            cudnn.setdefault((r["op"], r["dtype"], r["family"]), []).append(r["ratio_to_cudnn"])
    if cudnn:
        lines.append("summary: samattn / sdpa CUDNN_ATTENTION")
    for (op, dtype, family), ratios in sorted(cudnn.items()):
        geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines.append(
            f"  {op:<17} {dtype:<5} {family:<6} geomean {geomean:5.2f}  "
            f"min {min(ratios):5.2f}  max {max(ratios):5.2f}  ({len(ratios)} shapes)"
        )
    for op, target in ATTENTION_TARGETS.items():
        rows = [r for r in bench.records if r["op"] == op and r["family"] == "sm80"]
        below = [r for r in rows if r["ratio"] is not None and r["ratio"] < target]
        if rows:
            lines.append(
                f"  {op} sm80 target {target:.1f}x flash: {len(rows) - len(below)} of "
                f"{len(rows)} cases meet it"
                + "".join(
                    f"\n    below: {r['dtype']} {_case_text(r)} {r['ratio']:.2f}" for r in below
                )
            )
    lines += decode_summary(bench.records)
    lines += terms_summary(bench.records)
    for r in bench.records:
        if _mismatch(r):
            lines.append(f"  MISMATCH {r['op']} {r['dtype']} {_case_text(r)} {r['family']}")
    lines += [f"  skipped {s['case']}: {s['reason'].splitlines()[0]}" for s in bench.skipped]
    lines += [f"  ERROR {e}" for e in bench.errors]
    return "\n".join(lines)


def gpu_slug(name: str) -> str:
    """ "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def environment(command: str) -> dict[str, Any]:
    device = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(device)
    runtime, driver = _lib.cuda_versions()
    return {
        "gpu": torch.cuda.get_device_name(device),
        "cc": f"{major}.{minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "samattn": samattn.__version__,
        "samattn_cuda_runtime": f"{runtime // 1000}.{runtime % 1000 // 10}",
        "driver_cuda": f"{driver // 1000}.{driver % 1000 // 10}",
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_plot(records: list[dict[str, Any]], gpu: str, path: Path) -> None:
    """A horizontal bar per record: samattn / torch, with the line at 1."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"note: matplotlib is not installed; no plot written to {path}")
        return
    records = [r for r in records if r["ratio"] is not None]
    labels = [f"{r['op']} {r['dtype']} {_case_text(r)} [{r['family']}]" for r in records]
    colors = {
        "gemm": "tab:blue",
        "softmax_forward": "tab:green",
        "softmax_backward": "tab:olive",
        "attention_forward": "tab:red",
        "attention_backward": "tab:purple",
        "decode": "tab:cyan",
        "attention_terms": "tab:orange",
        "attention_mask": "tab:brown",
    }
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.25 * len(records)))
    ax.barh(
        range(len(records)),
        [r["ratio"] for r in records],
        color=[colors.get(r["op"], "tab:gray") for r in records],
    )
    ax.set_xscale("log", base=2)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(records)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("samattn / torch (higher is better; * automatic family)")
    ax.set_title(f"samattn vs torch on {gpu}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot: {path}")


# ------------------------------------------------------------------ CLI ----


def _list_argument(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in allowed]
        if unknown or not items:
            raise argparse.ArgumentTypeError(
                f"{text!r}: choose from {', '.join(allowed)} (comma-separated)"
            )
        return items

    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m samattn.bench",
        description="Benchmark samattn against torch (cuBLAS, torch.softmax, SDPA's flash and "
        "cuDNN attention) on this GPU.",
    )
    parser.add_argument(
        "--ops",
        type=_list_argument(OPS),
        default=list(OPS),
        help=f"{','.join(OPS)} (default: all)",
    )
    parser.add_argument(
        "--families",
        type=_list_argument(FAMILIES),
        default=["auto"],
        help="kernel families to measure, e.g. sm80,sm75 or auto,sm75 (default: auto, the "
        "family samattn picks for this GPU)",
    )
    parser.add_argument(
        "--json",
        default="benchmarks/results/",
        help="results file, or a folder (ending in /) for <gpu>.json "
        "(default: benchmarks/results/<gpu>.json)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of the ratios here")
    parser.add_argument(
        "--terms-features",
        type=_list_argument(TERMS_FEATURES),
        default=list(TERMS_FEATURES),
        help=f"the features --ops terms measures: {','.join(TERMS_FEATURES)} (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("samattn.bench: torch sees no CUDA GPU; nothing to measure", file=sys.stderr)
        return 2
    command = "python -m samattn.bench" + ("" if not argv else " " + shlex.join(argv))
    env = environment(command)
    json_path = Path(args.json)
    if args.json.endswith("/") or json_path.is_dir():
        json_path = json_path / f"{gpu_slug(env['gpu'])}.json"
    print(
        f"samattn {env['samattn']} on {env['gpu']} (cc {env['cc']}), torch {env['torch']}, "
        f"CUDA {env['cuda']}; families built: {', '.join(samattn.built_families())}"
    )
    print(f"command: {command}\n")

    size = "quick" if args.quick else "full"
    families = [None if name == "auto" else name for name in dict.fromkeys(args.families)]
    bench = Bench(Timer(args.quick), families, args.terms_features)
    started = time.perf_counter()
    print(TABLE_HEADER, flush=True)
    if "gemm" in args.ops:
        for dtype_name, shape in GEMM_CASES[size]:
            bench.gemm(dtype_name, shape)
    if "linear" in args.ops:
        for dtype_name, shape in LINEAR_CASES[size]:
            bench.linear(dtype_name, shape)
            torch.cuda.empty_cache()
    if "split_k" in args.ops:
        for dtype_name, shape in SPLIT_K_CASES[size]:
            bench.split_k(dtype_name, shape)
    if "grouped" in args.ops:
        for case in GROUPED_CASES[size]:
            bench.grouped(case)
            torch.cuda.empty_cache()
        for count in GROUPED_LIST_CASES[size]:
            bench.grouped_list(count)
    if "softmax" in args.ops:
        for dtype_name, shape in SOFTMAX_CASES[size]:
            bench.softmax(dtype_name, shape)
            torch.cuda.empty_cache()  # the 64M-element inputs of the next shape need room
    if "attention" in args.ops:
        for dtype_name, case in ATTENTION_CASES[size]:
            bench.attention(dtype_name, case)
            torch.cuda.empty_cache()
    if "terms" in args.ops:
        print(f"\n{TERMS_HEADER}", flush=True)
        for dtype_name, case in TERMS_CASES[size]:
            bench.terms(dtype_name, case)
            torch.cuda.empty_cache()
    if "decode" in args.ops:
        print(f"\n{DECODE_HEADER}", flush=True)
        for dtype_name, case in DECODE_CASES[size]:
            bench.decode(dtype_name, case)
            torch.cuda.empty_cache()
    if "overhead" in args.ops:
        print("\neager overhead: host us per call (samattn, torch), ratio = torch / samattn")
        for case in overhead_cases():
            bench.overhead(case)
    print(summarize(bench))
    print(f"\n{len(bench.records)} records in {time.perf_counter() - started:.0f} s")

    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(
        json.dumps({**env, "records": bench.records, "skipped": bench.skipped}, indent=1) + "\n"
    )
    print(f"results: {json_path}")
    if args.plot is not None and bench.records:
        write_plot(bench.records, env["gpu"], args.plot)
    return 1 if bench.errors else 0


if __name__ == "__main__":
    sys.exit(main())
