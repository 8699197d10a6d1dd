"""Inference attention on the GPU: flash_attn_with_kvcache, paged prefill through
flash_attn_varlen_func(block_table=...), and decode-shaped flash_attn_func (which the
library now runs with the keys split over CTAs), against float64 references.

The reference gathers each sequence's keys from the cache (through block_table when
paged), from cache_leftpad[b] to cache_seqlens[b] + seqlen_new, after doing the append
and the rotary embedding itself; causal and window are bottom-right aligned to that key
count. The accuracy rule is test_gpu_attention's (gpu_checks.assert_close_to_reference):
at most twice torch's own error in the input dtype, plus one output rounding. The
updated caches must equal the reference's: appended rows within one rounding when
rotated (the kernels rotate in fp32), every other row bit-identical (untouched).

The matrix of the issue (append, rotary interleaved or not at full and half the head
dim, cache_batch_idx, left padding, shuffled paged caches of 16/64/256-row pages, GQA
ratios 1/4/8, causal, window, softcap, num_splits 0 to 16, seqlen_q 1 to 16, head dims
64/128 and one case each of 32/96/192/256 and of 36/59, which run on padded copies of
the caches, fp16 and bf16) is sampled with a fixed seed so that every value of every
dimension appears, and each case runs with the sm90, sm80 and sm75 families forced
(sm75: fp16; sm90 runs the calls whose keys split 2 to 16 ways, 8 past head dim 128, the
splits combined in a thread block cluster, and hands the others to sm80) and a subset
with automatic selection.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import random

import pytest
import torch
from attention_checks import (
    Case,
    Guarded,
    Problem,
    _ints,
    check_attention,
    check_caches,
    check_fixed,
    check_fixed_grads,
    make_problem,
)
from gpu_checks import (
    DEVICE,
    assert_cuda_healthy,
    call_forced,
    capture_graph,
    forced_runs,
    has_triton,
    need_family,
    poison_allocator,
    randn,
    runnable_families,
)
from reference import allowed_keys, rotate

import samattn
from samattn import _lib

F16, BF16 = torch.float16, torch.bfloat16
FAMILY_DTYPES = {"sm90": (F16, BF16), "sm80": (F16, BF16), "sm75": (F16,)}


@pytest.fixture(params=["sm90", "sm80", "sm75", "auto"])
def kv_family(request) -> str:
    if request.param != "auto" and request.param not in runnable_families():
        pytest.skip(f"{request.param} is not built or cannot run on this GPU")
    return request.param


def run(family: str, fn):
    """fn() with `family` forced (and checked to be the one that ran, or the family it
    hands what it declines to), or automatic."""
    if family == "auto":
        return fn()
    return call_forced(family, fn, expected=forced_runs(family))


# ------------------------------------------------------------ the cases ----


def _sample_cases(count: int, seed: int) -> list[Case]:
    """`count` cases in which every value of every dimension appears (each dimension's
    values repeated to `count` and shuffled independently)."""
    rng = random.Random(seed)
    dims = {
        "dtype": [F16, BF16],
        "append": [True, False],
        "rotary": ["none", "interleaved full", "interleaved half", "neox full", "neox half"],
        "layout": [
            "contiguous",
            "batch_idx",
            "leftpad",
            "int lengths",
            "paged16",
            "paged64",
            "paged256",
        ],
        "group": [1, 4, 8],
        "mask": ["none", "causal", "window", "causal window"],
        "softcap": [0.0, 0.0, 30.0],
        "num_splits": [0, 1, 2, 3, 5, 8, 16],
        "seqlen_q": [1, 1, 2, 4, 7, 16],
        "d": [64, 128],
    }
    columns = {}
    for name, values in dims.items():
        column = (values * (count // len(values) + 1))[:count]
        rng.shuffle(column)
        columns[name] = column
    cases = []
    for i in range(count):
        c = {name: column[i] for name, column in columns.items()}
        nheads_k = 2 if c["group"] < 8 else 1
        rotary = c["rotary"] if c["append"] else "none"  # rotary only comes with k and v
        cases.append(
            Case(
                c["dtype"],
                3,
                c["seqlen_q"],
                nheads_k * c["group"],
                nheads_k,
                c["d"],
                c["layout"],
                c["append"],
                rotary,
                c["mask"],
                c["softcap"],
                c["num_splits"],
            )
        )
    # One case of each other head dim.
    for d, layout, rotary in (
        (32, "paged16", "neox full"),
        (96, "leftpad", "interleaved half"),
        (192, "batch_idx", "interleaved full"),
        (256, "paged64", "none"),
        # Head dims that are not multiples of 8 run on padded copies of the caches.
        (59, "contiguous", "none"),
        (36, "paged16", "interleaved half"),
    ):
        cases.append(Case(BF16, 2, 2, 8, 2, d, layout, True, rotary, "causal", 0.0, 0))
    return cases


CASES = _sample_cases(40, seed=15)
AUTO_CASES = CASES[::5]


# ------------------------------------------------------------ reference ----


def check_outputs(p: Problem, out, lse, k_cache, v_cache, what: str) -> None:
    """out and lse of every sequence against the reference on the (checked) caches."""
    c = p.case
    new = 0 if p.k is None else p.k.shape[1]
    q = p.q
    if p.cos is not None:
        start = torch.tensor(p.lengths, device=DEVICE)[:, None]
        rows = torch.arange(c.seqlen_q, device=DEVICE)
        per_row = c.causal or c.window != (-1, -1)
        positions = start + rows if per_row else start.expand(-1, c.seqlen_q)
        q = rotate(q, p.cos, p.sin, positions, c.rotary.startswith("interleaved")).to(q.dtype)
    for b in range(c.batch):
        end = p.lengths[b] + new
        first = 0 if p.leftpad is None else p.leftpad[b]
        seq, row = p.rows(b, end)
        keys, values = k_cache[seq, row][first:], v_cache[seq, row][first:]
        mask = allowed_keys(c.seqlen_q, keys.shape[0], c.causal, c.window)
        check_attention(
            out[b : b + 1],
            lse[b : b + 1],
            q[b : b + 1],
            keys[None],
            values[None],
            scale=c.d**-0.5,
            softcap=c.softcap,
            mask=mask,
            what=f"{what} sequence {b}",
        )


def run_case(family: str, case: Case, seed: int, capacity: int | None = None) -> None:
    dtype = case.dtype if family != "sm75" else F16
    p = make_problem(case, dtype, seed, capacity)
    k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()
    poison_allocator(p.q.shape, dtype)
    poison_allocator((case.batch, case.nheads, case.seqlen_q), torch.float32)
    out, lse = run(
        family,
        lambda: samattn.flash_attn_with_kvcache(
            p.q, k_cache, v_cache, return_softmax_lse=True, **p.kwargs()
        ),
    )
    assert out.shape == p.q.shape and out.dtype == dtype and out.is_contiguous()
    assert lse.shape == (case.batch, case.nheads, case.seqlen_q) and lse.dtype == torch.float32
    what = f"{family} {case}"
    check_caches(p, k_cache, v_cache, what)
    check_outputs(p, out, lse, k_cache, v_cache, what)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(c) for c in CASES])
def test_kvcache_matrix(attn_family, index):
    run_case(attn_family, CASES[index], seed=1000 + index)


@pytest.mark.parametrize("index", range(len(AUTO_CASES)), ids=[str(c) for c in AUTO_CASES])
def test_kvcache_matrix_automatic_family(no_family_env, index):
    run_case("auto", AUTO_CASES[index], seed=2000 + index)


@pytest.fixture(params=["sm90", "sm80", "sm75"])
def attn_family(request) -> str:
    if request.param not in runnable_families():
        pytest.skip(f"{request.param} is not built or cannot run on this GPU")
    return request.param


def test_num_splits_agree(kv_family):
    """One long-cache decode problem, every forced split count: all match the reference
    (split results are combined by log-sum-exp, exact up to rounding)."""
    base = Case(F16, 2, 1, 8, 2, 128, "contiguous", True, "none", "none", 0.0, 0)
    for splits in range(17):
        case = dataclasses.replace(base, num_splits=splits)
        # The same inputs for every split count.
        run_case(kv_family, case, seed=77, capacity=6000)


SM90_CLUSTER_CASES = {
    # name: (batch, seqlen_q, nheads, nheads_k, head dim, layout, append, mask, splits,
    #        cache rows); every grid at most one CTA per SM of an H100 (132)
    "d64 gqa8 2 queries, split 2": (4, 2, 16, 2, 64, "contiguous", True, "causal", 2, 1500),
    "d128 mqa, split 3": (4, 1, 8, 1, 128, "contiguous", False, "none", 3, 1500),
    "d128 gqa4 paged64, split 5": (3, 1, 8, 2, 128, "paged64", True, "causal", 5, 0),
    "d256 leftpad, split 8": (4, 3, 4, 4, 256, "leftpad", True, "window", 8, 1500),
    "d96 gqa8 8 queries (64 rows), split 7": (
        2,
        8,
        16,
        2,
        96,
        "contiguous",
        True,
        "causal",
        7,
        1500,
    ),
    "d128 batch_idx, chosen splits": (2, 1, 8, 2, 128, "batch_idx", False, "none", 0, 600),
    "d64 gqa4, split 12 (non-portable cluster)": (
        3,
        1,
        8,
        2,
        64,
        "contiguous",
        True,
        "none",
        12,
        1500,
    ),
    "d128 gqa4 2 queries, split 16": (2, 2, 8, 2, 128, "contiguous", False, "causal", 16, 1500),
    # The automatic count lowered to one CTA per SM over a contiguous cache, whatever the
    # share (16 splits of 8 key tiles).
    "d128 gqa4, chosen splits, long shares": (
        4,
        1,
        8,
        2,
        128,
        "contiguous",
        False,
        "none",
        0,
        8000,
    ),
    # 7 splits x 32 heads chosen: lowered to 4 (one CTA per SM, 2 key tiles a split)
    "d128 mha, chosen splits lowered": (1, 1, 32, 32, 128, "contiguous", False, "none", 0, 512),
}


@pytest.mark.parametrize("name", SM90_CLUSTER_CASES)
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_sm90_combines_key_splits_in_a_cluster(name, dtype):
    """sm90 forced on calls whose keys split 2 to 16 ways (8 past head dim 128) over at most
    one CTA per SM runs sm90 itself (the splits combined through distributed shared memory),
    with sequences empty, shorter than one split's share and full: empty ones give zeros
    and LSE +inf."""
    need_family("sm90")
    b, sq, h, hk, d, layout, append, mask, splits, rows = SM90_CLUSTER_CASES[name]
    case = Case(dtype, b, sq, h, hk, d, layout, append, "none", mask, 0.0, splits)
    p = make_problem(case, dtype, seed=len(name), capacity=rows or None)
    new = sq if append else 0
    capacity = p.k_cache.shape[1] * (p.block_table.shape[1] if p.block_table is not None else 1)
    p.lengths = [0, 1, capacity // 3, capacity - new][:b]
    if p.leftpad is not None:
        p.leftpad = [0, 0, capacity // 5, 7][:b]
    k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()
    poison_allocator(p.q.shape, dtype)
    poison_allocator((b, h, sq), torch.float32)
    out, lse = call_forced(
        "sm90",
        lambda: samattn.flash_attn_with_kvcache(
            p.q, k_cache, v_cache, return_softmax_lse=True, **p.kwargs()
        ),
        expected="sm90",
    )
    what = f"sm90 {name} {dtype}"
    check_caches(p, k_cache, v_cache, what)
    check_outputs(p, out, lse, k_cache, v_cache, what)
    if not append:
        assert torch.all(out[0] == 0) and torch.all(lse[0] == math.inf), f"{what}: empty"


@pytest.mark.parametrize(
    "d, splits, batch",
    [(128, 1, 2), (128, 17, 2), (128, 32, 2), (256, 9, 2), (128, 8, 32)],
)
def test_sm90_hands_other_grids_to_sm80(d, splits, batch):
    """One query tile per CTA (no split), more splits than a cluster holds (16 at d = 128,
    8 at d = 256) and forced grids of more CTAs than SMs run sm80's kernel with sm90
    forced. (An automatic count over a contiguous cache is lowered to fit a cluster:
    SM90_CLUSTER_CASES, "chosen splits, long shares".)"""
    need_family("sm90")
    case = Case(BF16, batch, 1, 8, 2, d, "contiguous", False, "none", "none", 0.0, splits)
    p = make_problem(case, BF16, 3, capacity=4000)
    out, lse = call_forced(
        "sm90",
        lambda: samattn.flash_attn_with_kvcache(
            p.q, p.k_cache, p.v_cache, return_softmax_lse=True, **p.kwargs()
        ),
        expected="sm80",
    )
    check_outputs(p, out, lse, p.k_cache, p.v_cache, f"sm90 forced, d{d}, {splits} splits")


# -------------------------------------------------------- bad values ----
def _decode_inputs(paged: bool = False):
    q = randn(2, 1, 8, 64, dtype=F16)
    shape = (10, 16, 2, 64) if paged else (2, 64, 2, 64)
    k_cache, v_cache = randn(*shape, dtype=F16), randn(*shape, dtype=F16)
    k, v = randn(2, 1, 2, 64, dtype=F16), randn(2, 1, 2, 64, dtype=F16)
    return q, k_cache, v_cache, k, v


BAD_VALUES = {
    # name: (paged, integer arguments as lists, message fragment)
    "block_table entry beyond the cache": (
        True,
        dict(cache_seqlens=[3, 20], block_table=[[0, 1], [2, 10]]),
        r"block_table\[1\]\[1\] = 10 is outside \[0, 10\)",
    ),
    "negative block_table entry": (
        True,
        dict(cache_seqlens=[3, 5], block_table=[[-1, 1], [2, 3]]),
        r"block_table\[0\]\[0\] = -1",
    ),
    "cache_seqlens beyond the cache": (
        False,
        dict(cache_seqlens=[3, 64]),
        r"cache_seqlens\[1\] = 64 plus the 1 new rows",
    ),
    "block_table too short for cache_seqlens": (
        True,
        dict(cache_seqlens=[3, 32], block_table=[[0, 1], [2, 3]]),
        r"cache_seqlens\[1\] = 32 plus the 1 new rows exceeds the 32 rows a cache sequence "
        r"holds \(block_table's 2 pages of 16 rows\)",
    ),
    "negative cache_seqlens": (False, dict(cache_seqlens=[-4, 3]), r"cache_seqlens\[0\] = -4"),
    "cache_batch_idx beyond the cache": (
        False,
        dict(cache_seqlens=[1, 1], cache_batch_idx=[0, 2]),
        r"cache_batch_idx\[1\] = 2 is outside \[0, 2\)",
    ),
    "cache_leftpad past the end": (
        False,
        dict(cache_seqlens=[1, 1], cache_leftpad=[0, 3]),
        r"cache_leftpad\[1\] = 3 is outside \[0, 2\]",
    ),
}


def _int_arguments(lists: dict) -> dict:
    """The integer arguments as device int32 tensors."""
    return {
        name: torch.tensor(values, dtype=torch.int32, device=DEVICE)
        for name, values in lists.items()
    }


def _bad_call(paged: bool, lists: dict):
    q, k_cache, v_cache, k, v = _decode_inputs(paged)
    return samattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, **_int_arguments(lists))


@pytest.mark.parametrize("case", BAD_VALUES)
def test_bad_values_are_refused_before_the_launch(case):
    paged, kwargs, fragment = BAD_VALUES[case]
    # samattn.ArgumentError: a ValueError, and a RuntimeError as flash-attn's TORCH_CHECK.
    for caught in (ValueError, RuntimeError):
        with pytest.raises(caught, match=fragment):
            _bad_call(paged, kwargs)
    assert_cuda_healthy()


BAD_INPUTS = {
    "int64 cache_seqlens": lambda q, kc, vc, k, v: samattn.flash_attn_with_kvcache(
        q, kc, vc, k, v, cache_seqlens=torch.zeros(2, dtype=torch.int64, device=DEVICE)
    ),
    "float32 caches": lambda q, kc, vc, k, v: samattn.flash_attn_with_kvcache(
        q, kc.float(), vc.float(), cache_seqlens=1
    ),
    "new k of other heads": lambda q, kc, vc, k, v: samattn.flash_attn_with_kvcache(
        q, kc, vc, k[:, :, :1], v[:, :, :1], cache_seqlens=1
    ),
    "cache on the cpu": lambda q, kc, vc, k, v: samattn.flash_attn_with_kvcache(
        q, kc.cpu(), vc, cache_seqlens=1
    ),
    "misaligned cache": lambda q, kc, vc, k, v: samattn.flash_attn_with_kvcache(
        q,
        *(
            torch.empty(kc.numel() + 4, dtype=F16, device=DEVICE)[4:].view(kc.shape)
            for _ in range(2)
        ),
        cache_seqlens=1,
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_raise_cleanly(case):
    with pytest.raises((ValueError, TypeError)) as error:
        BAD_INPUTS[case](*_decode_inputs())
    assert str(error.value).startswith("samattn.flash_attn_with_kvcache"), str(error.value)
    assert_cuda_healthy()


@pytest.fixture
def value_checks_off():
    samattn.set_value_checks(False)
    yield
    samattn.set_value_checks(True)


@pytest.mark.parametrize("case", BAD_VALUES)
def test_unchecked_bad_values_stay_inside_the_cache(kv_family, case, value_checks_off):
    """With the checks off, bad values are not reported, but the kernels clamp every index
    into the cache: no fault, and nothing written outside the caches' memory."""
    paged, lists, _ = BAD_VALUES[case]
    q, k_cache, v_cache, k, v = _decode_inputs(paged)
    guards = []
    for cache in (k_cache, v_cache):
        guarded = Guarded(cache.shape, cache.stride(), F16)
        guarded.view.copy_(cache)
        guards.append(guarded)
    kwargs = _int_arguments(lists)
    with samattn.use_family(None if kv_family == "auto" else kv_family):
        samattn.flash_attn_with_kvcache(q, guards[0].view, guards[1].view, k, v, **kwargs)
    torch.cuda.synchronize()
    assert_cuda_healthy()
    for name, guarded in zip(("k_cache", "v_cache"), guards):
        guarded.assert_no_stray_writes(name)


# ------------------------------------------------- graphs and compile ----
def test_decode_step_in_a_cuda_graph(kv_family):
    """A captured decode step (append + attend, paged, rotary), replayed with new q, k, v
    and cache_seqlens advanced in place: each replay matches the reference."""
    case = Case(
        BF16 if kv_family != "sm75" else F16,
        3,
        1,
        8,
        2,
        128,
        "paged16",
        True,
        "neox full",
        "causal",
        0.0,
        0,
    )
    p = make_problem(case, case.dtype, seed=5)
    capacity = p.block_table.shape[1] * case.page_size
    p.lengths = [0, capacity // 3, capacity - 4]  # 3 steps: the last one fills the cache
    start_k, start_v = p.k_cache.clone(), p.v_cache.clone()
    k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()
    lengths = torch.tensor(p.lengths, dtype=torch.int32, device=DEVICE)
    kwargs = {**p.kwargs(), "cache_seqlens": lengths}
    family = None if kv_family == "auto" else kv_family
    with samattn.use_family(family):
        graph, (out, lse) = capture_graph(
            lambda: samattn.flash_attn_with_kvcache(
                p.q, k_cache, v_cache, return_softmax_lse=True, **kwargs
            )
        )
        # The warm-up ran eagerly: start again from the original caches.
        k_cache.copy_(start_k)
        v_cache.copy_(start_v)
        for step in range(3):
            for t in (p.q, p.k, p.v):
                t.copy_(torch.randn_like(t, dtype=torch.float32))
            out.fill_(math.nan)
            graph.replay()
            torch.cuda.synchronize()
            p.k_cache, p.v_cache = start_k.clone(), start_v.clone()
            what = f"graph replay {step} {kv_family}"
            check_caches(p, k_cache, v_cache, what)
            check_outputs(p, out, lse, k_cache, v_cache, what)
            # The next step appends after this one.
            start_k, start_v = k_cache.clone(), v_cache.clone()
            lengths += 1
            p.lengths = [n + 1 for n in p.lengths]


@pytest.mark.parametrize(
    "backend",
    [
        "aot_eager",
        pytest.param("inductor", marks=pytest.mark.skipif(not has_triton(), reason="no triton")),
    ],
)
def test_compiled_decode_step(kv_family, backend):
    """torch.compile(fullgraph=True) of a function calling flash_attn_with_kvcache: the
    same output and the same in-place cache update as eager."""
    torch._dynamo.reset()
    case = Case(F16, 3, 2, 8, 2, 64, "paged64", True, "interleaved half", "causal", 0.0, 0)
    p = make_problem(case, F16, seed=9)
    kwargs = p.kwargs()

    def step(q, k_cache, v_cache):
        out, lse = samattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, return_softmax_lse=True, **kwargs
        )
        return out * 1.0, lse

    family = None if kv_family == "auto" else kv_family
    with samattn.use_family(family):
        eager_k, eager_v = p.k_cache.clone(), p.v_cache.clone()
        eager = step(p.q, eager_k, eager_v)
        compiled_k, compiled_v = p.k_cache.clone(), p.v_cache.clone()
        compiled = torch.compile(step, fullgraph=True, backend=backend)(p.q, compiled_k, compiled_v)
    assert torch.equal(compiled_k, eager_k) and torch.equal(compiled_v, eager_v)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b)
    check_caches(p, compiled_k, compiled_v, f"compiled {backend}")
    check_outputs(p, compiled[0], compiled[1], compiled_k, compiled_v, f"compiled {backend}")
    torch._dynamo.reset()


# ------------------------------------------------------- paged prefill ----
PAGED_PREFILL = {
    # lens_q, lens_k, page size
    "mixed": ([5, 1, 64, 0], [5, 40, 300, 7], 16),
    "chunked prefill": ([16, 16], [100, 16], 64),
    "long": ([200, 3], [700, 3], 256),
}


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("batch", PAGED_PREFILL)
@pytest.mark.parametrize("feature", ["plain", "causal", "window", "softcap", "GQA", "d59"])
def test_paged_prefill(attn_family, dtype, batch, feature):
    if dtype not in FAMILY_DTYPES[attn_family]:
        pytest.skip(f"{attn_family} has no {dtype} attention kernels")
    lens_q, lens_k, page = PAGED_PREFILL[batch]
    h, d = 4, 59 if feature == "d59" else 128  # 59: padded copies of the caches
    hk = 1 if feature == "GQA" else h
    causal, softcap = feature == "causal", 25.0 if feature == "softcap" else 0.0
    window = (24, 8) if feature == "window" else (-1, -1)
    scale = 3.0 if softcap else 1.0
    b = len(lens_q)
    width = max(-(-n // page) for n in lens_k) + 1
    num_blocks = b * width + 2
    block_table = torch.randperm(num_blocks, device=DEVICE)[: b * width].view(b, width)
    block_table = block_table.to(torch.int32)
    k_cache = randn(num_blocks, page, hk, d, dtype=dtype, scale=scale)
    v_cache = randn(num_blocks, page, hk, d, dtype=dtype)
    q = randn(sum(lens_q), h, d, dtype=dtype, scale=scale)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    poison_allocator(q.shape, dtype)
    out, lse, _ = call_forced(
        attn_family,
        lambda: samattn.flash_attn_varlen_func(
            q,
            k_cache,
            v_cache,
            cu_q.to(DEVICE),
            cu_k.to(DEVICE),
            max(lens_q),
            max(lens_k),
            causal=causal,
            window_size=window,
            softcap=softcap,
            return_attn_probs=True,
            block_table=block_table,
        ),
        may_launch_nothing=sum(lens_q) == 0,
        expected=forced_runs(attn_family),  # sm90: paged prefill does not split, sm80 runs it
    )
    assert out.shape == q.shape and lse.shape == (h, sum(lens_q))
    for i, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        if sq == 0:
            continue
        j = torch.arange(sk, device=DEVICE)
        pages, rows = block_table[i].long()[j // page], j % page
        rq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        check_attention(
            out[rq][None],
            lse[:, rq][None],
            q[rq][None],
            k_cache[pages, rows][None],
            v_cache[pages, rows][None],
            scale=d**-0.5,
            softcap=softcap,
            mask=allowed_keys(sq, sk, causal, window),
            what=f"paged {batch} sequence {i}",
        )


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_paged_prefill_runs_under_autograd_without_a_backward(attn_family, compiled):
    # As in flash-attn: the forward runs on inputs that require grad (the same output as
    # without), only the backward through the paged cache is missing, and says so.
    q = randn(8, 2, 64, dtype=F16).requires_grad_(True)
    cache = randn(4, 16, 2, 64, dtype=F16)
    cu = _ints(0, 8)
    table = _ints(2, 0).view(1, 2)

    def prefill(q):
        return samattn.flash_attn_varlen_func(q, cache, cache, cu, cu, 8, 8, block_table=table)

    torch._dynamo.reset()
    run = torch.compile(prefill, fullgraph=True, backend="aot_eager") if compiled else prefill
    with samattn.use_family(attn_family):
        out = run(q)
        with torch.no_grad():
            expected = prefill(q)
        assert out.requires_grad and torch.equal(out.detach(), expected)
        with pytest.raises(NotImplementedError, match="no backward through a paged KV cache"):
            out.sum().backward()
    torch._dynamo.reset()
    assert_cuda_healthy()


# ------------------------------------------ decode-shaped flash_attn_func ----
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("sq", [1, 2, 3, 4])
@pytest.mark.parametrize("sk, hk", [(1, 8), (300, 2), (5000, 8), (20000, 1)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_decode_shaped_flash_attn_func(attn_family, dtype, sq, sk, hk, causal):
    """seqlen_q 1 to 4 over long keys: the library splits the keys (and needs a workspace
    from the caller) where it pays."""
    if dtype not in FAMILY_DTYPES[attn_family]:
        pytest.skip(f"{attn_family} has no {dtype} attention kernels")
    b = 1 if sk > 4000 else 3
    check_fixed(attn_family, b, sq, sk, 8, hk, 128, dtype, causal=causal)


@pytest.mark.parametrize("sq, sk", [(1, 3000), (4, 777), (2, 64)], ids=str)
def test_decode_shaped_gradients(attn_family, sq, sk):
    """The backward of a decode-shaped forward (split-KV in the library) is still right."""
    dtype = FAMILY_DTYPES[attn_family][-1]
    check_fixed_grads(attn_family, 2, sq, sk, 8, 2, 128, dtype, causal=True)
    check_fixed_grads(attn_family, 2, sq, sk, 4, 4, 64, dtype, window=(100, 0), softcap=20.0)


def test_decode_forward_workspace_through_the_c_abi():
    """A decode-shaped call through the C ABI without a workspace answers NEEDS_WORKSPACE
    (nothing launched) or runs; with the size it asks for, it runs."""
    q = randn(4, 1, 32, 128, dtype=BF16 if "sm80" in runnable_families() else F16)
    k = v = randn(4, 8192, 8, 128, dtype=q.dtype)
    out = torch.full_like(q, math.nan)
    args = _lib.AttentionArgs(
        dtype=_lib.BF16 if q.dtype == BF16 else _lib.F16,
        family=_lib.FAMILY_AUTO,
        device=torch.cuda.current_device(),
        batch=4,
        nheads=32,
        nheads_k=8,
        seqlen_q=1,
        seqlen_k=8192,
        headdim=128,
        q=q.data_ptr(),
        q_batch_stride=32 * 128,
        q_head_stride=128,
        k=k.data_ptr(),
        k_batch_stride=8192 * 8 * 128,
        k_seq_stride=8 * 128,
        k_head_stride=128,
        v=v.data_ptr(),
        v_batch_stride=8192 * 8 * 128,
        v_seq_stride=8 * 128,
        v_head_stride=128,
        o=out.data_ptr(),
        o_batch_stride=32 * 128,
        o_head_stride=128,
        softmax_scale=128**-0.5,
        window_left=-1,
        window_right=-1,
        stream=torch.cuda.current_stream().cuda_stream,
    )
    lib = _lib.lib()
    status = lib.samattn_attention_forward(ctypes.byref(args), None)
    assert status in (_lib.OK, _lib.NEEDS_WORKSPACE), _lib.last_error()
    if status == _lib.NEEDS_WORKSPACE:
        torch.cuda.synchronize()
        assert out.isnan().all(), "NEEDS_WORKSPACE, yet something was written"
        size = ctypes.c_int64(-1)
        assert (
            lib.samattn_attention_forward_workspace_size(ctypes.byref(args), ctypes.byref(size))
            == _lib.OK
        )
        assert size.value > 0
        workspace = torch.empty(size.value, dtype=torch.uint8, device=DEVICE)
        args.workspace, args.workspace_bytes = workspace.data_ptr(), size.value
        assert lib.samattn_attention_forward(ctypes.byref(args), None) == _lib.OK
    torch.cuda.synchronize()
    expected = samattn.flash_attn_func(q, k, v)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected)
