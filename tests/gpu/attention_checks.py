"""What the GPU attention tests share: the families' dtypes, inputs, the checks of a
forward or backward against tests/reference.py, guarded output buffers for the C ABI,
and the KV-cache problems (Case, Problem). Imported as `attention_checks` (tests/gpu is on
sys.path), so that no test module imports another.
"""

from __future__ import annotations

import ctypes
import math
import random
from dataclasses import dataclass

import pytest
import torch
from gpu_checks import (
    DEVICE,
    UNIT_ROUNDOFF,
    assert_close_to_reference,
    call_forced,
    forced_runs,
    poison_allocator,
    randn,
)
from reference import allowed_keys, attention, attention_grads, rotate

import samattn
from samattn import _lib

F16, BF16 = torch.float16, torch.bfloat16

# The dtypes each family runs; the others are refused (test_bf16_on_sm75_is_refused).
FAMILY_DTYPES = {
    "sm90": (torch.float16, torch.bfloat16),
    "sm80": (torch.float16, torch.bfloat16),
    "sm75": (torch.float16,),
}


def need_dtype(family: str, dtype: torch.dtype) -> None:
    """Skip a case the family does not run (bf16 on sm75)."""
    if dtype not in FAMILY_DTYPES[family]:
        pytest.skip(f"{family} has no {dtype} attention kernels")


def last_dtype(family: str) -> torch.dtype:
    """bf16 where the family runs it (the dtype of the large-value tests), else fp16."""
    return FAMILY_DTYPES[family][-1]


def check_attention(out, lse, q, k, v, *, scale, softcap, mask, what):
    """The accuracy rule for out (b, sq, h, d) and lse (b, h, sq)."""
    ref_out, ref_lse = attention(q, k, v, scale, softcap, mask, torch.float64)
    base_out, base_lse = attention(q, k, v, scale, softcap, mask, q.dtype)
    floor = 0.5 * UNIT_ROUNDOFF[q.dtype]
    assert_close_to_reference(out, ref_out, base_out, floor, f"{what}: out")
    assert_close_to_reference(lse, ref_lse, base_lse, 1e-6, f"{what}: lse")
    empty = torch.isinf(ref_lse).transpose(1, 2)  # (b, sq, h): rows that see no key
    assert torch.all(out[empty] == 0), f"{what}: rows with nothing to attend are not 0"


def run_fixed(family, q, k, v, **kwargs):
    b, sq, h, d = q.shape
    poison_allocator((b, sq, h, d), q.dtype)
    poison_allocator((b, h, sq), torch.float32)
    out, lse, probs = call_forced(
        family,
        lambda: samattn.flash_attn_func(q, k, v, return_attn_probs=True, **kwargs),
        may_launch_nothing=q.numel() == 0,
        expected=forced_runs(family),
    )
    assert out.shape == q.shape and out.dtype == q.dtype and probs is None
    assert lse.shape == (b, h, sq) and lse.dtype == torch.float32
    return out, lse


def make_qkv(b, sq, sk, h, hk, d, dtype, scale=1.0):
    return (
        randn(b, sq, h, d, dtype=dtype, scale=scale),
        randn(b, sk, hk, d, dtype=dtype, scale=scale),
        randn(b, sk, hk, d, dtype=dtype),
    )


def check_fixed(family, b, sq, sk, h, hk, d, dtype, causal=False, window=(-1, -1), softcap=0.0):
    what = (
        f"{family} {dtype} b{b} sq{sq} sk{sk} h{h}/{hk} d{d} causal{causal} w{window} cap{softcap}"
    )
    # Larger inputs with softcap, so that it bends the scores.
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype, scale=3.0 if softcap else 1.0)
    out, lse = run_fixed(family, q, k, v, causal=causal, window_size=window, softcap=softcap)
    mask = allowed_keys(sq, sk, causal, window)
    check_attention(out, lse, q, k, v, scale=d**-0.5, softcap=softcap, mask=mask, what=what)


FEATURES = {
    "causal": dict(causal=True),
    "window": dict(window=(32, 8)),
    "window left": dict(window=(64, -1)),
    "window right": dict(window=(-1, 0)),
    "window 0": dict(window=(0, 0)),
    "causal window": dict(causal=True, window=(48, -1)),
    "softcap": dict(softcap=30.0),
    "GQA": dict(hk=2),
    "MQA": dict(hk=1),
    "everything": dict(causal=True, window=(40, -1), softcap=20.0, hk=2),
}


class Guarded:
    """A strided view inside a NaN-filled buffer; everything else must stay NaN."""

    def __init__(self, size, stride, dtype, guard=64):
        span = 1 + sum((s - 1) * st for s, st in zip(size, stride))
        self.buffer = torch.full((guard + span + guard,), math.nan, dtype=dtype, device=DEVICE)
        self.view = self.buffer.as_strided(size, stride, guard)
        self.owned = torch.zeros(self.buffer.shape, dtype=torch.bool, device=DEVICE)
        self.owned.as_strided(size, stride, guard).fill_(True)

    def assert_no_stray_writes(self, what):
        stray = ~self.owned & ~self.buffer.isnan()
        assert not stray.any(), f"{what}: {int(stray.sum())} elements written outside the output"


def check_grads(grads, q, k, v, dout, *, scale, softcap, mask, what):
    """The accuracy rule for (dq, dk, dv) against float64 autograd, torch's own autograd in
    the input dtype as the baseline. The floor is one rounding of the gradient."""
    ref = attention_grads(q, k, v, dout, scale, softcap, mask, torch.float64)
    base = attention_grads(q, k, v, dout, scale, softcap, mask, q.dtype)
    floor = UNIT_ROUNDOFF[q.dtype]
    # dq is exactly 0 where every row's softmax is one-hot (one visible key), yet computed
    # from dP - D, two sums of the size of dv's terms: its floor is relative to those.
    magnitude = max(r.abs().max().item() if r.numel() else 0.0 for r in ref)
    for name, got, r, b, like in zip(("dq", "dk", "dv"), grads, ref, base, (q, k, v)):
        assert got.shape == like.shape and got.dtype == like.dtype, f"{what}: {name} metadata"
        assert_close_to_reference(got, r, b, floor, f"{what}: {name}", magnitude=magnitude)


def run_grads(family, fn, q, k, v, dout, may_launch_nothing=False):
    """(dq, dk, dv) of fn(q, k, v) (an attention output) against dout, with `family` forced
    for the forward and, through autograd, the backward. The gradients' sizes are poisoned
    in the allocator first (the C ABI test below is the exact check)."""
    need_dtype(family, q.dtype)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    for t in leaves:
        poison_allocator(t.shape, t.dtype)
    out = call_forced(
        family,
        lambda: fn(*leaves),
        may_launch_nothing=may_launch_nothing,
        expected=forced_runs(family),
    )
    if family == "sm75" and q.shape[-1] > 192:
        # No sm75 backward tile fits Turing's 64 KB there: a clear refusal, then skip.
        refused = pytest.raises(samattn.UnsupportedError, match="supports head dims up to 192")
        with samattn.use_family(family), refused:
            torch.autograd.grad(out, leaves, dout)
        pytest.skip("the sm75 backward supports head dims up to 192")
    # The family of the backward is not checked here: autograd runs it on its device
    # thread, whose last family this thread cannot see (the C ABI tests check it).
    with samattn.use_family(family):
        return torch.autograd.grad(out, leaves, dout)


def check_fixed_grads(family, b, sq, sk, h, hk, d, dtype, causal=False, window=(-1, -1),
                      softcap=0.0, deterministic=False):  # fmt: skip
    what = (
        f"grad {family} {dtype} b{b} sq{sq} sk{sk} h{h}/{hk} d{d} causal{causal} w{window} "
        f"cap{softcap}"
    )
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype, scale=3.0 if softcap else 1.0)
    dout = randn(b, sq, h, d, dtype=dtype)

    def forward(q, k, v):
        return samattn.flash_attn_func(
            q, k, v, causal=causal, window_size=window, softcap=softcap,
            deterministic=deterministic,
        )  # fmt: skip

    grads = run_grads(family, forward, q, k, v, dout)
    mask = allowed_keys(sq, sk, causal, window)
    check_grads(grads, q, k, v, dout, scale=d**-0.5, softcap=softcap, mask=mask, what=what)


def _set_seq_head(args, name, t):
    setattr(args, name, t.data_ptr())
    for field, value in zip(("batch", "seq", "head"), t.stride()[:3]):
        setattr(args, f"{name}_{field}_stride", value)


def run_c_backward(args, tensors: dict[str, torch.Tensor], lse: torch.Tensor) -> int:
    """Point args at tensors (name -> a (batch, seq, head, d) view: q, k, v, o, dout, dq, dk,
    dv) and lse, run samattn_attention_backward on a workspace of garbage (the library
    zeroes what it needs) and wait for it. Returns the family code it ran."""
    for name, t in tensors.items():
        _set_seq_head(args, name, t)
    args.lse = lse.data_ptr()
    args.lse_batch_stride, args.lse_head_stride, args.lse_seq_stride = lse.stride()
    lib = _lib.lib()
    size = ctypes.c_int64(-1)
    assert (
        lib.samattn_attention_backward_workspace_size(ctypes.byref(args), ctypes.byref(size)) == 0
    )
    workspace = torch.full((max(size.value, 1),), 0xFF, dtype=torch.uint8, device=DEVICE)
    args.workspace, args.workspace_bytes = workspace.data_ptr(), size.value
    used = ctypes.c_int32(-1)
    status = lib.samattn_attention_backward(ctypes.byref(args), ctypes.byref(used))
    assert status == _lib.OK, _lib.last_error()
    torch.cuda.synchronize()
    return used.value


@dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    batch: int
    seqlen_q: int
    nheads: int
    nheads_k: int
    d: int
    layout: str  # "contiguous", "batch_idx", "leftpad", "int lengths", "paged16", ...
    append: bool
    rotary: str  # "none", or "interleaved" / "neox" + " full" / " half"
    mask: str  # "none", "causal", "window", "causal window"
    softcap: float
    num_splits: int

    @property
    def page_size(self) -> int:
        return int(self.layout[5:]) if self.layout.startswith("paged") else 0

    @property
    def window(self) -> tuple[int, int]:
        return {"window": (40, 8), "causal window": (48, -1)}.get(self.mask, (-1, -1))

    @property
    def causal(self) -> bool:
        return self.mask.startswith("causal")

    @property
    def rotary_dim(self) -> int:
        if self.rotary == "none":
            return 0
        return self.d if self.rotary.endswith("full") else self.d // 2

    def __str__(self) -> str:
        dtype = "f16" if self.dtype == F16 else "bf16"
        return (
            f"{dtype}-b{self.batch}-sq{self.seqlen_q}-h{self.nheads}/{self.nheads_k}-d{self.d}-"
            f"{self.layout}-{'append' if self.append else 'read'}-rot:{self.rotary}-"
            f"{self.mask}-cap{self.softcap:g}-splits{self.num_splits}"
        )


@dataclass
class Problem:
    """A flash_attn_with_kvcache call's inputs, and where each sequence's rows live."""

    case: Case
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k: torch.Tensor | None
    v: torch.Tensor | None
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    lengths: list[int]  # cache_seqlens
    leftpad: list[int] | None
    batch_idx: list[int] | None
    block_table: torch.Tensor | None

    def kwargs(self) -> dict:
        c = self.case
        lengths = self.lengths[0] if c.layout == "int lengths" else _ints(*self.lengths)
        return dict(
            k=self.k,
            v=self.v,
            rotary_cos=self.cos,
            rotary_sin=self.sin,
            cache_seqlens=lengths,
            cache_batch_idx=_ints_or_none(self.batch_idx),
            cache_leftpad=_ints_or_none(self.leftpad),
            block_table=self.block_table,
            causal=c.causal,
            window_size=c.window,
            softcap=c.softcap,
            rotary_interleaved=c.rotary.startswith("interleaved"),
            num_splits=c.num_splits,
        )

    def rows(self, b: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(page or sequence index, row in it) of sequence b's logical rows 0..end-1."""
        j = torch.arange(end, device=DEVICE)
        if self.block_table is not None:
            ps = self.case.page_size
            return self.block_table[b].long()[j // ps], j % ps
        seq = b if self.batch_idx is None else self.batch_idx[b]
        return torch.full_like(j, seq), j


def _ints(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _ints_or_none(values: list[int] | None) -> torch.Tensor | None:
    return None if values is None else _ints(*values)


def make_problem(case: Case, dtype: torch.dtype, seed: int, capacity: int | None = None) -> Problem:
    """Random inputs of a case; `capacity` fixes a contiguous cache's rows."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    b, sq, h, hk, d = case.batch, case.seqlen_q, case.nheads, case.nheads_k, case.d
    new = sq if case.append else 0
    scale = 3.0 if case.softcap else 1.0
    block_table = batch_idx = leftpad = None
    if case.page_size:
        width = rng.randint(2, 5) if case.page_size < 256 else 2
        capacity = width * case.page_size
        num_blocks = b * width + 3  # spare pages no sequence uses
        pages = torch.randperm(num_blocks, device=DEVICE)[: b * width].view(b, width)
        block_table = pages.to(torch.int32)
        cache_shape = (num_blocks, case.page_size, hk, d)
    else:
        capacity = capacity or rng.choice([64, 200, 513, 1000])
        batch_cache = b + 2 if case.layout == "batch_idx" else b
        cache_shape = (batch_cache, capacity, hk, d)
        if case.layout == "batch_idx":
            batch_idx = rng.sample(range(batch_cache), b)  # distinct: appends do not collide
    k_cache = randn(*cache_shape, dtype=dtype, scale=scale)
    v_cache = randn(*cache_shape, dtype=dtype)
    # Lengths from empty to full (the last sequence fills the cache when appending).
    lengths = [rng.randint(0, capacity - new) for _ in range(b)]
    lengths[-1] = capacity - new
    if case.layout == "int lengths":
        lengths = [lengths[0]] * b
    if case.layout == "leftpad":
        leftpad = [rng.randint(0, n + new) for n in lengths]
        leftpad[0] = 0
    k = v = cos = sin = None
    if case.append:
        k = randn(b, new, hk, d, dtype=dtype, scale=scale)
        v = randn(b, new, hk, d, dtype=dtype)
    if case.rotary_dim:
        angles = torch.rand(capacity + rng.randint(0, 7), case.rotary_dim // 2, device=DEVICE)
        angles = angles * 2 * math.pi
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    q = randn(b, sq, h, d, dtype=dtype, scale=scale)
    return Problem(
        case, q, k_cache, v_cache, k, v, cos, sin, lengths, leftpad, batch_idx, block_table
    )


def expected_caches(p: Problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k_cache, v_cache, appended): the caches after the reference's append (rotated new
    keys rounded to the dtype) and a bool mask of the cache rows it wrote."""
    k_cache, v_cache = p.k_cache.clone(), p.v_cache.clone()
    appended = torch.zeros(k_cache.shape[:2], dtype=torch.bool, device=DEVICE)
    if p.k is None:
        return k_cache, v_cache, appended
    new = p.k.shape[1]
    k_new = p.k
    if p.cos is not None:
        positions = torch.tensor(p.lengths, device=DEVICE)[:, None] + torch.arange(
            new, device=DEVICE
        )
        k_new = rotate(p.k, p.cos, p.sin, positions, p.case.rotary.startswith("interleaved"))
        k_new = k_new.to(p.k.dtype)
    for b, start in enumerate(p.lengths):
        seq, row = p.rows(b, start + new)
        seq, row = seq[start:], row[start:]
        k_cache[seq, row] = k_new[b]
        v_cache[seq, row] = p.v[b]
        appended[seq, row] = True
    return k_cache, v_cache, appended


def check_caches(p: Problem, k_cache: torch.Tensor, v_cache: torch.Tensor, what: str) -> None:
    want_k, want_v, appended = expected_caches(p)
    assert torch.equal(v_cache, want_v), f"{what}: v_cache differs from the reference's append"
    assert torch.equal(k_cache[~appended], want_k[~appended]), f"{what}: k_cache rows changed"
    if p.cos is None:
        assert torch.equal(k_cache, want_k), f"{what}: appended k rows differ"
    else:
        # Rotated in fp32 by the kernels, in float64 here: one rounding apart at most.
        u = UNIT_ROUNDOFF[k_cache.dtype]
        torch.testing.assert_close(
            k_cache[appended].float(),
            want_k[appended].float(),
            rtol=2 * u,
            atol=2 * u,
            msg=lambda m: f"{what}: rotated k rows: {m}",
        )


# The largest head dim of the sm75 backward (Turing's 64 KB of shared memory).
SM75_BACKWARD_MAX_D = 192


def need_backward(family: str, d: int) -> None:
    if family == "sm75" and d > SM75_BACKWARD_MAX_D:
        pytest.skip(f"the sm75 backward supports head dims up to {SM75_BACKWARD_MAX_D}")


def alibi_slopes(kind: str, b: int, h: int) -> torch.Tensor | None:
    """float32 slopes on the GPU: "none"; "head" (h,) ALiBi's geometric slopes; "batch"
    (b, h) random; "batch view" (b, h) rows of a wider buffer (read through its row
    stride); "broadcast" (b, h) expanded from (h,) (batch stride 0); "negative" (h,) of
    both signs (the bias is generic)."""
    if kind == "none":
        return None
    geometric = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device=DEVICE)
    if kind == "head":
        return geometric
    if kind == "batch":
        return torch.rand(b, h, device=DEVICE) * 0.5 + 0.01
    if kind == "batch view":
        return (torch.rand(b, 2 * h + 3, device=DEVICE) * 0.5 + 0.01)[:, 1 : h + 1]
    if kind == "broadcast":
        return geometric.expand(b, h)
    if kind == "negative":
        return torch.randn(h, device=DEVICE) * 0.2
    raise ValueError(kind)


def make_sinks(h: int, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(h, device=DEVICE) * scale
