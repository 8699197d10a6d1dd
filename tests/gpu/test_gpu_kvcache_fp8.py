"""fp8 KV caches on the GPU (issue 48): flash_attn_with_kvcache and paged prefill
(flash_attn_varlen_func with block_table) over caches of torch.float8_e4m3fn or
torch.float8_e5m2 with k_scale / v_scale, q and the output in fp16 / bf16.

The reference dequantizes the caches in fp32 (cache.float() * the scale of each KV head)
and computes attention on them (tests/reference.py, through attention_checks'
check_attention: the accuracy rule of the bf16 KV-cache tests, at most twice torch's own
error in q's dtype plus one output rounding). Appended rows must equal torch's
quantization of the new keys and values bit for bit: (y.float() / scale).clamp(-max,
max).to(fp8 dtype), each KV head with its own scale (max 448 for e4m3, 57344 for e5m2);
every other cache byte is untouched.

The matrix (fp8 dtype, q dtype, the scales' kinds: none, floats, 0-dim / (1,) / per-head
tensors and mixes, contiguous caches of odd capacities and paged ones of 16- and 256-row
pages, GQA ratios 1/4/8, seqlen_q 1 and 4, causal or not, num_splits 0/1/3, append or
not, head dims 128 and one case each of 64, 80 and 256) is sampled with a fixed seed so
that every value of every dimension appears. Each case runs with the sm90 and sm80
families forced (sm90 hands what its plans decline to sm80) and a subset with automatic
selection; the sm75 family must refuse fp8 caches with an UnsupportedError (and write
nothing). Every batch holds a sequence with cache_seqlens 0, one of an odd length and
one that fills the cache.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch
from attention_checks import check_attention
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
)
from reference import allowed_keys

import samattn

F16, BF16 = torch.float16, torch.bfloat16
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
# A scale that spreads N(0, 1) values over much of each format's range.
SCALE_BASE = {E4M3: 1.0 / 64, E5M2: 1.0 / 1024}
FP8_NAME = {E4M3: "e4m3", E5M2: "e5m2"}

# How k_scale and v_scale are given.
SCALE_KINDS = [
    "none",  # both None: 1.0
    "floats",
    "0-dim tensors",
    "(1,) tensors",
    "per-head tensors",
    "per-head k, float v",
    "float k, 0-dim v",
]


@pytest.fixture(params=["sm90", "sm80"])
def fp8_family(request) -> str:
    need_family(request.param)
    return request.param


def run(family: str, fn):
    """fn() with `family` forced (checked to be the one that ran, or the family it hands
    what it declines to), or automatic."""
    if family == "auto":
        return fn()
    return call_forced(family, fn, expected=forced_runs(family))


# ------------------------------------------------------------ quantization ----
def quantize(y: torch.Tensor, per_head: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """torch's fp8 of y (..., nheads_k, d) / the scale of its KV head: the nearest fp8
    value, saturated to the largest finite one."""
    limit = FP8_MAX[fp8]
    return (y.float() / per_head.view(-1, 1)).clamp(-limit, limit).to(fp8)


def dequantize(x: torch.Tensor, per_head: torch.Tensor) -> torch.Tensor:
    """What fp8 x (..., nheads_k, d) stands for: x * the scale of its KV head, in fp32."""
    return x.float() * per_head.view(-1, 1)


def scale_arguments(kind: str, fp8: torch.dtype, hk: int):
    """(k_scale, v_scale) as the call passes them, and the fp32 (hk,) scales they mean."""
    base = SCALE_BASE[fp8]
    k_head = (base * (0.5 + 1.5 * torch.rand(hk, device=DEVICE))).float()
    v_head = (base * (0.5 + 1.5 * torch.rand(hk, device=DEVICE))).float()
    k_one, v_one = float(k_head[0]), float(v_head[0])  # exactly fp32 values

    def every(value: float) -> torch.Tensor:
        return torch.full((hk,), value, device=DEVICE)

    if kind == "none":
        return None, None, every(1.0), every(1.0)
    if kind == "floats":
        return k_one, v_one, every(k_one), every(v_one)
    if kind == "0-dim tensors":
        return k_head[0].clone(), v_head[0].clone(), every(k_one), every(v_one)
    if kind == "(1,) tensors":
        return k_head[:1].clone(), v_head[:1].clone(), every(k_one), every(v_one)
    if kind == "per-head tensors":
        return k_head, v_head, k_head, v_head
    if kind == "per-head k, float v":
        return k_head, v_one, k_head, every(v_one)
    if kind == "float k, 0-dim v":
        return k_one, v_head[0].clone(), every(k_one), every(v_one)
    raise ValueError(kind)


# ------------------------------------------------------------ the cases ----
@dataclass(frozen=True)
class Fp8Case:
    fp8: torch.dtype
    dtype: torch.dtype  # q's
    scales: str  # SCALE_KINDS
    layout: str  # "contiguous", "paged16", "paged256"
    group: int  # nheads // nheads_k
    seqlen_q: int
    causal: bool
    num_splits: int
    append: bool
    d: int = 128

    @property
    def page_size(self) -> int:
        return int(self.layout[5:]) if self.layout.startswith("paged") else 0

    def __str__(self) -> str:
        dtype = "f16" if self.dtype == F16 else "bf16"
        return (
            f"{FP8_NAME[self.fp8]}-{dtype}-{self.scales.replace(' ', '_')}-{self.layout}-"
            f"g{self.group}-sq{self.seqlen_q}-{'causal' if self.causal else 'full'}-"
            f"splits{self.num_splits}-{'append' if self.append else 'read'}-d{self.d}"
        )


def _sample_cases(count: int, seed: int) -> list[Fp8Case]:
    """`count` cases in which every value of every dimension appears (each dimension's
    values repeated to `count` and shuffled independently), then one case per other head
    dim."""
    rng = random.Random(seed)
    dims = {
        "fp8": [E4M3, E5M2],
        "dtype": [F16, BF16],
        "scales": SCALE_KINDS,
        "layout": ["contiguous", "contiguous", "paged16", "paged256"],
        "group": [1, 4, 8],
        "seqlen_q": [1, 4],
        "causal": [False, True],
        "num_splits": [0, 1, 3],
        "append": [True, False],
    }
    columns = {}
    for name, values in dims.items():
        column = (values * (count // len(values) + 1))[:count]
        rng.shuffle(column)
        columns[name] = column
    cases = [Fp8Case(**{name: columns[name][i] for name in dims}) for i in range(count)]
    others = [(64, E5M2, "paged16"), (80, E4M3, "contiguous"), (256, E4M3, "paged256")]
    for d, fp8, layout in others:
        cases.append(Fp8Case(fp8, BF16, "per-head tensors", layout, 4, 4, True, 0, True, d))
    return cases


CASES = _sample_cases(42, seed=48)
AUTO_CASES = CASES[::6]


@dataclass
class Fp8Problem:
    case: Fp8Case
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k: torch.Tensor | None
    v: torch.Tensor | None
    k_scale: object  # as passed
    v_scale: object
    k_head: torch.Tensor  # (nheads_k,) fp32: the scale of each KV head
    v_head: torch.Tensor
    lengths: list[int]  # cache_seqlens
    block_table: torch.Tensor | None

    def kwargs(self) -> dict:
        c = self.case
        return dict(
            k=self.k,
            v=self.v,
            cache_seqlens=torch.tensor(self.lengths, dtype=torch.int32, device=DEVICE),
            block_table=self.block_table,
            causal=c.causal,
            num_splits=c.num_splits,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
        )

    def rows(self, b: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(page or sequence index, row in it) of sequence b's rows 0..end-1."""
        j = torch.arange(end, device=DEVICE)
        if self.block_table is not None:
            ps = self.case.page_size
            return self.block_table[b].long()[j // ps], j % ps
        return torch.full_like(j, b), j


def make_problem(case: Fp8Case, seed: int, capacity: int | None = None) -> Fp8Problem:
    """Random inputs of a case: caches of N(0, 1) values quantized with their scales, and a
    batch of 4 sequences: empty, of an odd length, of a random length, full."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    b, sq, d = 4, case.seqlen_q, case.d
    hk = 2 if case.group < 8 else 1
    h = hk * case.group
    new = sq if case.append else 0
    block_table = None
    if case.page_size:
        width = rng.randint(2, 4) if case.page_size < 256 else 2
        capacity = width * case.page_size
        num_blocks = b * width + 3  # spare pages no sequence uses
        pages = torch.randperm(num_blocks, device=DEVICE)[: b * width].view(b, width)
        block_table = pages.to(torch.int32)
        cache_shape = (num_blocks, case.page_size, hk, d)
    else:
        capacity = capacity or rng.choice([77, 255, 513, 1001])  # odd capacities
        cache_shape = (b, capacity, hk, d)
    k_scale, v_scale, k_head, v_head = scale_arguments(case.scales, case.fp8, hk)
    k_cache = quantize(randn(*cache_shape, dtype=torch.float32), k_head, case.fp8)
    v_cache = quantize(randn(*cache_shape, dtype=torch.float32), v_head, case.fp8)
    room = capacity - new
    odd = rng.randrange(1, room + 1, 2) if room >= 1 else 0
    lengths = [0, odd, rng.randint(0, room), room]
    k = v = None
    if case.append:
        k = randn(b, new, hk, d, dtype=case.dtype)
        v = randn(b, new, hk, d, dtype=case.dtype)
    q = randn(b, sq, h, d, dtype=case.dtype)
    return Fp8Problem(
        case, q, k_cache, v_cache, k, v, k_scale, v_scale, k_head, v_head, lengths, block_table
    )


# ------------------------------------------------------------ reference ----
def expected_caches(p: Fp8Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """The caches after the reference's append: torch's quantization of the new rows."""
    k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()
    if p.k is None:
        return k_cache, v_cache
    new = p.k.shape[1]
    for b, start in enumerate(p.lengths):
        seq, row = p.rows(b, start + new)
        seq, row = seq[start:], row[start:]
        k_cache[seq, row] = quantize(p.k[b], p.k_head, p.case.fp8)
        v_cache[seq, row] = quantize(p.v[b], p.v_head, p.case.fp8)
    return k_cache, v_cache


def assert_same_bytes(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got_bytes, want_bytes = got.view(torch.uint8), want.view(torch.uint8)
    differ = got_bytes != want_bytes
    if differ.any():
        where = differ.nonzero()[:4].tolist()
        first = tuple(where[0])
        raise AssertionError(
            f"{what}: {int(differ.sum())} bytes differ from torch's quantization, e.g. at "
            f"{where}: {got[first].item()} (0x{int(got_bytes[first]):02x}) instead of "
            f"{want[first].item()} (0x{int(want_bytes[first]):02x})"
        )


def check_caches(p: Fp8Problem, k_cache, v_cache, what: str) -> None:
    want_k, want_v = expected_caches(p)
    assert k_cache.dtype == v_cache.dtype == p.case.fp8, what
    assert_same_bytes(k_cache, want_k, f"{what}: k_cache")
    assert_same_bytes(v_cache, want_v, f"{what}: v_cache")


def check_outputs(p: Fp8Problem, out, lse, k_cache, v_cache, what: str) -> None:
    """out and lse of every sequence against attention on the dequantized (checked)
    caches."""
    c = p.case
    assert out.shape == p.q.shape and out.dtype == p.q.dtype and out.is_contiguous(), what
    assert lse.shape == (p.q.shape[0], p.q.shape[2], c.seqlen_q) and lse.dtype == torch.float32
    new = 0 if p.k is None else p.k.shape[1]
    keys_all, values_all = dequantize(k_cache, p.k_head), dequantize(v_cache, p.v_head)
    for b in range(p.q.shape[0]):
        end = p.lengths[b] + new
        seq, row = p.rows(b, end)
        check_attention(
            out[b : b + 1],
            lse[b : b + 1],
            p.q[b : b + 1],
            keys_all[seq, row][None],
            values_all[seq, row][None],
            scale=c.d**-0.5,
            softcap=0.0,
            mask=allowed_keys(c.seqlen_q, end, c.causal, (-1, -1)),
            what=f"{what} sequence {b} ({p.lengths[b]} rows + {new})",
        )


def run_case(family: str, case: Fp8Case, seed: int, capacity: int | None = None) -> Fp8Problem:
    p = make_problem(case, seed, capacity)
    k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()
    poison_allocator(p.q.shape, case.dtype)
    poison_allocator((p.q.shape[0], p.q.shape[2], case.seqlen_q), torch.float32)
    out, lse = run(
        family,
        lambda: samattn.flash_attn_with_kvcache(
            p.q, k_cache, v_cache, return_softmax_lse=True, **p.kwargs()
        ),
    )
    what = f"{family} {case}"
    check_caches(p, k_cache, v_cache, what)
    check_outputs(p, out, lse, k_cache, v_cache, what)
    return p


# ------------------------------------------------------ flash_attn_with_kvcache ----
@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(c) for c in CASES])
def test_fp8_kvcache_matrix(fp8_family, index):
    run_case(fp8_family, CASES[index], seed=4800 + index)


@pytest.mark.parametrize("index", range(len(AUTO_CASES)), ids=[str(c) for c in AUTO_CASES])
def test_fp8_kvcache_matrix_automatic_family(no_family_env, index):
    run_case("auto", AUTO_CASES[index], seed=4900 + index)


@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("splits", [0, 1, 3])
def test_fp8_num_splits_on_a_long_cache(fp8_family, fp8, splits):
    """One long-cache decode step with per-head scales: every split count matches the
    reference (the splits are combined by log-sum-exp)."""
    case = Fp8Case(fp8, BF16, "per-head tensors", "contiguous", 4, 1, False, splits, True)
    run_case(fp8_family, case, seed=77, capacity=6001)


@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
def test_appends_saturate(fp8_family, fp8, layout):
    """New values beyond the format's range (after the division by the scale) are stored
    as its largest finite value, of their sign, and those within it as the nearest fp8
    value; the output reads the saturated caches."""
    case = Fp8Case(fp8, BF16, "per-head tensors", layout, 4, 4, True, 0, True)
    p = make_problem(case, seed=31)
    limit = FP8_MAX[fp8]
    # Every other new element far beyond the range (k of both signs, v negative), the
    # others well inside.
    big_k = torch.zeros_like(p.k, dtype=torch.float32)
    big_k[..., ::2] = 4 * limit * p.k_head.view(-1, 1)
    big_v = torch.zeros_like(p.v, dtype=torch.float32)
    big_v[..., ::2] = 4 * limit * p.v_head.view(-1, 1)
    p.k = (p.k.float() + big_k * torch.sign(p.k.float())).to(p.k.dtype)
    p.v = (p.v.float() - big_v).to(p.v.dtype)
    k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()
    out, lse = run(
        fp8_family,
        lambda: samattn.flash_attn_with_kvcache(
            p.q, k_cache, v_cache, return_softmax_lse=True, **p.kwargs()
        ),
    )
    what = f"saturation {fp8_family} {case}"
    check_caches(p, k_cache, v_cache, what)
    # The largest finite value was indeed written: for every appended sequence, the even
    # channels of v are -limit.
    seq, row = p.rows(3, p.lengths[3] + case.seqlen_q)
    appended = v_cache[seq, row][p.lengths[3] :]
    assert torch.all(appended[..., ::2].float() == -limit), what
    check_outputs(p, out, lse, k_cache, v_cache, what)


def test_appended_nan_stays_nan(fp8_family):
    """A NaN among the new values is stored as an fp8 NaN (only the cache is checked: the
    output of a sequence whose keys hold a NaN is NaN)."""
    case = Fp8Case(E4M3, F16, "floats", "contiguous", 1, 1, False, 0, True)
    p = make_problem(case, seed=5)
    p.k[1, 0, 0, 3] = math.nan
    p.v[2, 0, 0, 5] = math.nan
    k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()
    run(fp8_family, lambda: samattn.flash_attn_with_kvcache(p.q, k_cache, v_cache, **p.kwargs()))
    torch.cuda.synchronize()
    assert k_cache[1, p.lengths[1], 0, 3].float().isnan(), "k: NaN not kept"
    assert v_cache[2, p.lengths[2], 0, 5].float().isnan(), "v: NaN not kept"
    want_k, want_v = expected_caches(p)
    for got, want, name in ((k_cache, want_k, "k_cache"), (v_cache, want_v, "v_cache")):
        finite = ~want.float().isnan()
        assert_same_bytes(got[finite], want[finite], f"nan {name}")


def test_scales_are_each_calls_own(fp8_family):
    """One signature called with other float scales, then other tensor scales (its prepared
    call, and for tensors the values read by the kernels): each call reads with its own."""
    case = Fp8Case(E4M3, BF16, "floats", "paged16", 4, 1, True, 0, False)
    p = make_problem(case, seed=11)
    for factor in (1.0, 0.5, 3.0):
        p.k_scale, p.v_scale = p.k_scale * factor, p.v_scale / factor
        p.k_head = torch.full_like(p.k_head, p.k_scale)
        p.v_head = torch.full_like(p.v_head, p.v_scale)
        out, lse = run(
            fp8_family,
            lambda: samattn.flash_attn_with_kvcache(
                p.q, p.k_cache, p.v_cache, return_softmax_lse=True, **p.kwargs()
            ),
        )
        check_outputs(p, out, lse, p.k_cache, p.v_cache, f"float scales x{factor}")
    k_scale = torch.tensor([0.02, 0.05], device=DEVICE)
    v_scale = torch.tensor([0.03, 0.01], device=DEVICE)
    p.k_scale, p.v_scale = k_scale, v_scale
    for factor in (1.0, 2.0):
        k_scale.mul_(factor)
        v_scale.div_(factor)
        p.k_head, p.v_head = k_scale.clone(), v_scale.clone()
        out, lse = run(
            fp8_family,
            lambda: samattn.flash_attn_with_kvcache(
                p.q, p.k_cache, p.v_cache, return_softmax_lse=True, **p.kwargs()
            ),
        )
        check_outputs(p, out, lse, p.k_cache, p.v_cache, f"tensor scales x{factor}")


def test_sm75_refuses_fp8_caches():
    """The sm75 family has no fp8 KV-cache kernels: forced, it refuses the call with an
    UnsupportedError naming it, before anything is written."""
    need_family("sm75")
    case = Fp8Case(E4M3, F16, "per-head tensors", "paged16", 4, 1, True, 0, True)
    p = make_problem(case, seed=3)
    k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()
    with samattn.use_family("sm75"), pytest.raises(samattn.UnsupportedError, match="sm75"):
        samattn.flash_attn_with_kvcache(p.q, k_cache, v_cache, **p.kwargs())
    assert_cuda_healthy()
    assert_same_bytes(k_cache, p.k_cache, "refused call: k_cache")
    assert_same_bytes(v_cache, p.v_cache, "refused call: v_cache")
    # Paged prefill over the same pages: two sequences of 4 and 20 rows, two pages each.
    q = randn(24, 8, 128, dtype=F16)
    cu = torch.tensor([0, 4, 24], dtype=torch.int32, device=DEVICE)
    table = torch.arange(4, dtype=torch.int32, device=DEVICE).view(2, 2)
    with samattn.use_family("sm75"), pytest.raises(samattn.UnsupportedError, match="sm75"):
        samattn.flash_attn_varlen_func(
            q, p.k_cache, p.v_cache, cu, cu, 20, 20, block_table=table, k_scale=0.5
        )
    assert_cuda_healthy()


def test_16_bit_caches_with_scales_are_refused_on_the_gpu():
    q = randn(2, 1, 8, 128, dtype=BF16)
    cache = randn(2, 64, 2, 128, dtype=BF16)
    refused = r"k_scale is given, but k_cache has dtype torch\.bfloat16"
    with pytest.raises(ValueError, match=refused):
        samattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=3, k_scale=0.5)
    misaligned = torch.empty(2 * 64 * 2 * 128 + 8, dtype=E4M3, device=DEVICE)[8:]
    misaligned = misaligned.view(2, 64, 2, 128)
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        samattn.flash_attn_with_kvcache(
            q, misaligned, misaligned, cache_seqlens=3, k_scale=torch.ones(2, device=DEVICE)
        )
    assert_cuda_healthy()


# ------------------------------------------------- graphs and compile ----
def test_fp8_decode_step_in_a_cuda_graph(fp8_family):
    """A captured decode step over fp8 caches with per-head tensor scales, replayed with new
    q, k, v, cache_seqlens advanced and the scales changed in place: the kernels read the
    scales when the graph replays."""
    case = Fp8Case(E4M3, BF16, "per-head tensors", "paged16", 4, 1, True, 0, True)
    p = make_problem(case, seed=8)
    capacity = p.block_table.shape[1] * case.page_size
    p.lengths = [0, 5, capacity // 2, capacity - 3]  # 3 steps: the last fills the cache
    start_k, start_v = p.k_cache.clone(), p.v_cache.clone()
    k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()
    kwargs = p.kwargs()
    lengths = kwargs["cache_seqlens"]
    k_scale, v_scale = p.k_scale, p.v_scale
    with samattn.use_family(fp8_family):
        graph, (out, lse) = capture_graph(
            lambda: samattn.flash_attn_with_kvcache(
                p.q, k_cache, v_cache, return_softmax_lse=True, **kwargs
            )
        )
        k_cache.copy_(start_k)  # the warm-up ran eagerly
        v_cache.copy_(start_v)
        for step in range(3):
            for t in (p.q, p.k, p.v):
                t.copy_(torch.randn_like(t, dtype=torch.float32))
            k_scale.mul_(1.5)
            v_scale.mul_(0.75)
            p.k_head, p.v_head = k_scale.clone(), v_scale.clone()
            out.fill_(math.nan)
            graph.replay()
            torch.cuda.synchronize()
            p.k_cache, p.v_cache = start_k.clone(), start_v.clone()
            what = f"graph replay {step} {fp8_family}"
            check_caches(p, k_cache, v_cache, what)
            check_outputs(p, out, lse, k_cache, v_cache, what)
            start_k, start_v = k_cache.clone(), v_cache.clone()
            lengths += 1
            p.lengths = [n + 1 for n in p.lengths]


@pytest.mark.parametrize("scales", ["floats", "per-head tensors"])
@pytest.mark.parametrize(
    "backend",
    [
        "aot_eager",
        pytest.param("inductor", marks=pytest.mark.skipif(not has_triton(), reason="no triton")),
    ],
)
def test_compiled_fp8_decode_step(fp8_family, backend, scales):
    """torch.compile(fullgraph=True) of a decode step over fp8 caches: the same output and
    the same cache update as eager."""
    torch._dynamo.reset()
    case = Fp8Case(E5M2, F16, scales, "paged256", 4, 4, True, 0, True)
    p = make_problem(case, seed=9)
    kwargs = p.kwargs()

    def step(q, k_cache, v_cache):
        out, lse = samattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, return_softmax_lse=True, **kwargs
        )
        return out * 1.0, lse

    with samattn.use_family(fp8_family):
        eager_k, eager_v = p.k_cache.clone(), p.v_cache.clone()
        eager = step(p.q, eager_k, eager_v)
        compiled_k, compiled_v = p.k_cache.clone(), p.v_cache.clone()
        compiled = torch.compile(step, fullgraph=True, backend=backend)(p.q, compiled_k, compiled_v)
    assert_same_bytes(compiled_k, eager_k, "compiled k_cache")
    assert_same_bytes(compiled_v, eager_v, "compiled v_cache")
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b)
    check_caches(p, compiled_k, compiled_v, f"compiled {backend}")
    check_outputs(p, compiled[0], compiled[1], compiled_k, compiled_v, f"compiled {backend}")
    torch._dynamo.reset()


# ------------------------------------------------------- paged prefill ----
PAGED_PREFILL = {
    # lens_q, lens_k, page size
    "mixed": ([5, 1, 64, 0], [5, 41, 301, 7], 16),
    "chunked prefill": ([16, 16], [100, 16], 256),
}


@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("scales", ["none", "floats", "per-head tensors", "float k, 0-dim v"])
@pytest.mark.parametrize("batch", PAGED_PREFILL)
@pytest.mark.parametrize("feature", ["plain", "causal", "GQA 4"])
def test_fp8_paged_prefill(fp8_family, fp8, scales, batch, feature):
    lens_q, lens_k, page = PAGED_PREFILL[batch]
    dtype = BF16 if fp8 == E4M3 else F16
    h, d = 8, 128
    hk = 2 if feature == "GQA 4" else h
    causal = feature == "causal"
    b = len(lens_q)
    width = max(-(-n // page) for n in lens_k) + 1
    num_blocks = b * width + 2
    block_table = torch.randperm(num_blocks, device=DEVICE)[: b * width].view(b, width)
    block_table = block_table.to(torch.int32)
    k_scale, v_scale, k_head, v_head = scale_arguments(scales, fp8, hk)
    k_pages = quantize(randn(num_blocks, page, hk, d, dtype=torch.float32), k_head, fp8)
    v_pages = quantize(randn(num_blocks, page, hk, d, dtype=torch.float32), v_head, fp8)
    q = randn(sum(lens_q), h, d, dtype=dtype)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    poison_allocator(q.shape, dtype)
    out, lse, _ = call_forced(
        fp8_family,
        lambda: samattn.flash_attn_varlen_func(
            q,
            k_pages,
            v_pages,
            cu_q.to(DEVICE),
            cu_k.to(DEVICE),
            max(lens_q),
            max(lens_k),
            causal=causal,
            return_attn_probs=True,
            block_table=block_table,
            k_scale=k_scale,
            v_scale=v_scale,
        ),
        may_launch_nothing=sum(lens_q) == 0,
        expected=forced_runs(fp8_family),
    )
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (h, sum(lens_q))
    keys_all, values_all = dequantize(k_pages, k_head), dequantize(v_pages, v_head)
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
            keys_all[pages, rows][None],
            values_all[pages, rows][None],
            scale=d**-0.5,
            softcap=0.0,
            mask=allowed_keys(sq, sk, causal, (-1, -1)),
            what=f"fp8 paged {FP8_NAME[fp8]} {scales} {batch} {feature} sequence {i}",
        )


def test_fp8_paged_prefill_has_no_backward(fp8_family):
    q = randn(8, 2, 64, dtype=F16).requires_grad_(True)
    pages = quantize(randn(4, 16, 2, 64, dtype=torch.float32), torch.ones(2, device=DEVICE), E4M3)
    cu = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    table = torch.tensor([[2, 0]], dtype=torch.int32, device=DEVICE)
    with samattn.use_family(fp8_family):
        out = samattn.flash_attn_varlen_func(
            q, pages, pages, cu, cu, 8, 8, block_table=table, k_scale=1.0, v_scale=1.0
        )
        assert out.requires_grad
        with pytest.raises(NotImplementedError, match="no backward through a paged KV cache"):
            out.sum().backward()
    assert_cuda_healthy()
