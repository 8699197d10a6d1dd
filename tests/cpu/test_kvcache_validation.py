"""Inference attention without a GPU: flash_attn_with_kvcache's and paged prefill's
argument validation (on "meta" tensors, through the fake implementations), the checks of
integer values (pure functions on host lists), the value-check switch, the packing of the
KV-cache fields of the C struct, the op under torch.compile, and paged prefill under
autograd (a forward, and a backward that raises).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest
import torch

import samattn
from samattn import _checks, _cuda, _lib, _prepared

F16, BF16, I32 = torch.float16, torch.bfloat16, torch.int32
OP = "samattn.flash_attn_with_kvcache"


def meta(*shape: int, dtype: torch.dtype = F16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def ints(*shape: int) -> torch.Tensor:
    return meta(*shape, dtype=I32)


@pytest.fixture(autouse=True)
def _no_prepared_kvcache_calls():
    """Tests that replace the launch must not leave prepared entries to the next test, whose
    call of the same signature would skip its replaced seams."""
    _cuda._KVCACHE.clear()
    yield
    _cuda._KVCACHE.clear()


# A decode problem: batch 2, 8 query heads over 2 kv heads, d 128, caches of 4 x 256 rows.
B, H, HK, D, SQ = 2, 8, 2, 128, 1


def call(**changes):
    """flash_attn_with_kvcache on valid meta inputs, with `changes` by argument name."""
    args = dict(q=meta(B, SQ, H, D), k_cache=meta(4, 256, HK, D), v_cache=meta(4, 256, HK, D))
    args.update(changes)
    return samattn.flash_attn_with_kvcache(**args)


def new_kv(s: int = 1, hk: int = HK, d: int = D, dtype: torch.dtype = F16) -> dict:
    return dict(k=meta(B, s, hk, d, dtype=dtype), v=meta(B, s, hk, d, dtype=dtype))


def paged(num_blocks: int = 10, page: int = 16, width: int = 3) -> dict:
    return dict(
        k_cache=meta(num_blocks, page, HK, D),
        v_cache=meta(num_blocks, page, HK, D),
        block_table=ints(B, width),
    )


def rotary(seqlen: int = 256, dim: int = D, dtype: torch.dtype = F16) -> dict:
    return dict(
        rotary_cos=meta(seqlen, dim // 2, dtype=dtype),
        rotary_sin=meta(seqlen, dim // 2, dtype=dtype),
    )


# --------------------------------------------------------- valid shapes ----
VALID = {
    "attend only": dict(),
    "int cache_seqlens": dict(cache_seqlens=100),
    "append": dict(cache_seqlens=ints(B), **new_kv()),
    "append 16 rows, causal": dict(cache_seqlens=ints(B), causal=True, **new_kv(16)),
    "rotary": dict(cache_seqlens=ints(B), **new_kv(), **rotary()),
    "rotary half, not interleaved": dict(
        cache_seqlens=ints(B), rotary_interleaved=False, **new_kv(), **rotary(dim=D // 2)
    ),
    "rotary dim 2": dict(cache_seqlens=ints(B), **new_kv(), **rotary(dim=2)),
    "cache_batch_idx": dict(cache_batch_idx=ints(B), cache_seqlens=ints(B)),
    "cache_leftpad": dict(cache_leftpad=ints(B), cache_seqlens=ints(B)),
    "paged": dict(cache_seqlens=ints(B), **paged()),
    "paged, page 256, append, rotary": dict(
        cache_seqlens=ints(B), **paged(page=256, width=2), **new_kv(), **rotary(512)
    ),
    "window, softcap, num_splits": dict(window_size=(64, 0), softcap=30.0, num_splits=16),
    "MQA": dict(k_cache=meta(4, 256, 1, D), v_cache=meta(4, 256, 1, D)),
    "bf16": dict(
        q=meta(B, SQ, H, D, dtype=BF16),
        k_cache=meta(4, 256, HK, D, dtype=BF16),
        v_cache=meta(4, 256, HK, D, dtype=BF16),
    ),
    "more cache sequences than batch": dict(k_cache=meta(9, 64, HK, D), v_cache=meta(9, 64, HK, D)),
    "alibi per head, sinks": dict(
        cache_seqlens=ints(B),
        alibi_slopes=meta(H, dtype=torch.float32),
        sinks=meta(H, dtype=torch.float32),
        **new_kv(),
    ),
    # Head dims that are not multiples of 8 run on padded copies (a warning once).
    "head dim 36": dict(
        q=meta(B, SQ, H, 36), k_cache=meta(4, 256, HK, 36), v_cache=meta(4, 256, HK, 36)
    ),
    "head dim 59, append, paged": dict(
        q=meta(B, SQ, H, 59),
        k_cache=meta(10, 16, HK, 59),
        v_cache=meta(10, 16, HK, 59),
        block_table=ints(B, 3),
        cache_seqlens=ints(B),
        **new_kv(d=59),
    ),
    "alibi per sequence, paged": dict(
        cache_seqlens=ints(B), alibi_slopes=meta(B, H, dtype=torch.float32), **paged()
    ),
}


@pytest.mark.parametrize("case", VALID)
def test_valid_calls_give_shapes(case):
    changes = VALID[case]
    out, lse = call(return_softmax_lse=True, **changes)
    q = changes.get("q", meta(B, SQ, H, D))
    assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == "meta"
    assert lse.shape == (B, H, SQ) and lse.dtype == torch.float32
    assert call(**changes).shape == q.shape  # out alone without return_softmax_lse


# --------------------------------------------------------- bad arguments ----
BAD = {
    "q not a tensor": (dict(q=[1.0]), TypeError, "q must be a torch.Tensor"),
    "q 3-D": (dict(q=meta(B, H, D)), ValueError, "q must be 4-D"),
    "k_cache 3-D": (dict(k_cache=meta(4, 256, D)), ValueError, "k_cache must be 4-D"),
    "caches differ": (
        dict(v_cache=meta(4, 128, HK, D)),
        ValueError,
        "k_cache and v_cache must agree",
    ),
    "head dims differ": (
        dict(k_cache=meta(4, 256, HK, 64), v_cache=meta(4, 256, HK, 64)),
        ValueError,
        "k_cache has head dim 64 but q has 128",
    ),
    "GQA not divisible": (
        dict(k_cache=meta(4, 256, 3, D), v_cache=meta(4, 256, 3, D)),
        ValueError,
        "q has 8 heads and k_cache, v_cache have 3",
    ),
    "float32": (
        dict(q=meta(B, SQ, H, D, dtype=torch.float32)),
        TypeError,
        "q has dtype torch.float32",
    ),
    "cache dtype": (
        dict(k_cache=meta(4, 256, HK, D, dtype=BF16)),
        TypeError,
        "k_cache has dtype torch.bfloat16 but q has torch.float16",
    ),
    "cache head dim not a multiple of 8, unlike q's": (
        dict(k_cache=meta(4, 256, HK, 36), v_cache=meta(4, 256, HK, 36)),
        ValueError,
        "head dim",
    ),
    "cache head dim not contiguous": (
        dict(k_cache=meta(4, 256, D, HK).transpose(2, 3)),
        ValueError,
        "k_cache has strides",
    ),
    "cache sequence stride off 16 bytes": (
        dict(v_cache=meta(4, 256, HK, D + 4)[..., :D]),
        ValueError,
        "v_cache has strides",
    ),
    "fewer cache sequences than batch": (
        dict(k_cache=meta(1, 256, HK, D), v_cache=meta(1, 256, HK, D)),
        ValueError,
        "k_cache holds 1 sequences but q has batch 2",
    ),
    "k without v": (dict(k=meta(B, 1, HK, D), cache_seqlens=3), ValueError, "k and v"),
    "append without cache_seqlens": (new_kv(), ValueError, "appending k and v needs cache_seqlens"),
    "k wrong heads": (
        dict(cache_seqlens=3, **new_kv(hk=1)),
        ValueError,
        "k must be 4-D (batch, seqlen_new, nheads_k, headdim) = (2, seqlen_new, 2, 128)",
    ),
    "k and v rows differ": (
        dict(cache_seqlens=3, k=meta(B, 2, HK, D), v=meta(B, 3, HK, D)),
        ValueError,
        "k has 2 new rows but v has 3",
    ),
    "k dtype": (
        dict(cache_seqlens=3, **new_kv(dtype=BF16)),
        TypeError,
        "k has dtype torch.bfloat16 but q has torch.float16",
    ),
    "more new rows than the cache": (
        dict(cache_seqlens=0, **new_kv(300)),
        ValueError,
        "k has 300 new rows but a cache sequence holds 256",
    ),
    "rotary without k": (
        dict(cache_seqlens=3, **rotary()),
        ValueError,
        "rotary_cos / rotary_sin apply to q and the new k: they need k and v",
    ),
    "only rotary_cos": (
        dict(cache_seqlens=3, rotary_cos=meta(256, 64), **new_kv()),
        ValueError,
        "rotary_cos and rotary_sin must both be given",
    ),
    "rotary shapes differ": (
        dict(cache_seqlens=3, rotary_cos=meta(256, 64), rotary_sin=meta(256, 32), **new_kv()),
        ValueError,
        "must be 2-D (seqlen_ro, rotary_dim / 2) of one shape",
    ),
    "rotary dim > head dim": (
        dict(cache_seqlens=3, **new_kv(), **rotary(dim=2 * D)),
        ValueError,
        "rotary_dim (2 * rotary_cos.shape[1]) must be in 2..128",
    ),
    "rotary too short": (
        dict(cache_seqlens=3, **new_kv(), **rotary(seqlen=100)),
        ValueError,
        "rotary_cos has 100 positions but a cache sequence holds 256",
    ),
    "rotary dtype": (
        dict(cache_seqlens=3, **new_kv(), **rotary(dtype=BF16)),
        TypeError,
        "rotary_cos has dtype torch.bfloat16",
    ),
    "cache_seqlens int64": (
        dict(cache_seqlens=meta(B, dtype=torch.int64)),
        TypeError,
        "cache_seqlens must have dtype torch.int32, got torch.int64",
    ),
    "cache_seqlens shape": (
        dict(cache_seqlens=ints(B + 1)),
        ValueError,
        "cache_seqlens must have shape (batch,) = (2,), got (3,)",
    ),
    "cache_seqlens float": (dict(cache_seqlens=3.0), TypeError, "cache_seqlens must be an int"),
    "cache_seqlens bool": (dict(cache_seqlens=True), TypeError, "cache_seqlens must be an int"),
    "int cache_seqlens negative": (dict(cache_seqlens=-1), ValueError, "cache_seqlens[0] = -1"),
    "int cache_seqlens beyond the cache": (
        dict(cache_seqlens=256, **new_kv()),
        ValueError,
        "cache_seqlens[0] = 256 plus the 1 new rows exceeds the 256 rows",
    ),
    "cache_batch_idx int64": (
        dict(cache_batch_idx=meta(B, dtype=torch.int64)),
        TypeError,
        "cache_batch_idx must have dtype torch.int32",
    ),
    "cache_leftpad shape": (
        dict(cache_leftpad=ints(B, 1)),
        ValueError,
        "cache_leftpad must have shape (batch,)",
    ),
    "block_table int64": (
        {**paged(), "block_table": meta(B, 3, dtype=torch.int64)},
        TypeError,
        "block_table must have dtype torch.int32, got torch.int64",
    ),
    "block_table 1-D": (
        {**paged(), "block_table": ints(B)},
        ValueError,
        "block_table must be 2-D (batch, max_blocks)",
    ),
    "block_table rows": (
        {**paged(), "block_table": ints(B + 1, 3)},
        ValueError,
        "block_table has 3 rows but q has batch 2",
    ),
    "page size not a multiple of 16": (
        paged(page=24),
        ValueError,
        "page_block_size (k_cache.shape[1]) must be a positive multiple of 16, got 24",
    ),
    "block_table and cache_leftpad": (
        dict(cache_leftpad=ints(B), **paged()),
        ValueError,
        "cache_leftpad cannot be combined with block_table",
    ),
    "block_table and cache_batch_idx": (
        dict(cache_batch_idx=ints(B), **paged()),
        ValueError,
        "cache_batch_idx cannot be combined with block_table",
    ),
    "num_splits negative": (dict(num_splits=-1), ValueError, "num_splits must be >= 0"),
    "num_splits float": (dict(num_splits=2.0), TypeError, "num_splits must be an int"),
    "window floats": (dict(window_size=(1.5, 0)), ValueError, "window_size must be a pair"),
    "softcap negative": (dict(softcap=-1.0), ValueError, "softcap must be finite and >= 0"),
    "alibi float16": (
        dict(alibi_slopes=meta(H)),
        TypeError,
        "alibi_slopes must have dtype torch.float32",
    ),
    "alibi per kv head": (
        dict(alibi_slopes=meta(HK, dtype=torch.float32)),
        ValueError,
        f"alibi_slopes must have shape (nheads,) = ({H},) or (batch, nheads) = ({B}, {H}), "
        f"got ({HK},)",
    ),
    "alibi on the cpu": (
        dict(alibi_slopes=torch.zeros(H)),
        ValueError,
        "alibi_slopes is on cpu",
    ),
    "sinks (batch, nheads)": (
        dict(sinks=meta(B, H, dtype=torch.float32)),
        ValueError,
        f"sinks must have shape (nheads,) = ({H},)",
    ),
    "sinks bfloat16": (dict(sinks=meta(H, dtype=BF16)), TypeError, "sinks must have dtype"),
    "sinks not a tensor": (dict(sinks=[0.0] * H), TypeError, "sinks must be a torch.Tensor"),
    "cpu cache": (
        dict(k_cache=torch.empty(4, 256, HK, D, dtype=F16)),
        ValueError,
        "need CUDA tensors, but k_cache is on cpu",
    ),
    "cpu cache_seqlens": (
        dict(cache_seqlens=torch.zeros(B, dtype=I32)),
        ValueError,
        "cache_seqlens is on cpu",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_arguments_raise_naming_them(case):
    changes, error, fragment = BAD[case]
    with pytest.raises(error) as info:
        call(**changes)
    message = str(info.value)
    assert fragment in message and message.startswith(OP), message
    if error is ValueError:  # also a RuntimeError, which flash-attn's checks raise
        assert isinstance(info.value, samattn.ArgumentError), type(info.value)


def test_paged_capacity_is_pages_times_page_size():
    # 3 pages of 16 rows: 47 + 1 fits, 48 + 1 does not.
    call(cache_seqlens=47, **paged(), **new_kv(), **rotary(48))
    with pytest.raises(ValueError, match="exceeds the 48 rows a cache sequence holds"):
        call(cache_seqlens=48, **paged(), **new_kv(), **rotary(48))
    # flash-attn's TORCH_CHECK raises a RuntimeError naming block_table: so does this.
    with pytest.raises(RuntimeError, match=r"holds \(block_table's 3 pages of 16 rows\)"):
        call(cache_seqlens=48, **paged(), **new_kv(), **rotary(48))


# ------------------------------------------------ integer values (pure) ----
def sizes(**changes) -> _checks.KVCacheShape:
    """Batch 2; not paged: 4 cache sequences of 64 rows; 1 new row."""
    fields = dict(
        batch=2,
        seqlen_q=1,
        nheads=8,
        nheads_k=2,
        headdim=128,
        kv_cache_batch=4,
        capacity=64,
        page_size=0,
        block_table_width=0,
        seqlen_new=1,
        rotary_dim=0,
        rotary_seqlen=0,
    )
    fields.update(changes)
    return _checks.KVCacheShape(**fields)


PAGED = dict(kv_cache_batch=10, capacity=48, page_size=16, block_table_width=3)

BAD_VALUES = {
    "negative length": ((sizes(), [3, -1], None, None, None), "cache_seqlens[1] = -1 is negative"),
    "append beyond the cache": (
        (sizes(), [63, 64], None, None, None),
        "cache_seqlens[1] = 64 plus the 1 new rows exceeds the 64 rows",
    ),
    "beyond the cache without append": (
        (sizes(seqlen_new=0), [65, 0], None, None, None),
        "cache_seqlens[0] = 65 exceeds the 64 rows",
    ),
    "leftpad past the end": (
        (sizes(), [3, 10], [0, 12], None, None),
        "cache_leftpad[1] = 12 is outside [0, 11]",
    ),
    "negative leftpad": ((sizes(), None, [-2, 0], None, None), "cache_leftpad[0] = -2"),
    "batch index out of range": (
        (sizes(), [1, 1], None, [3, 4], None),
        "cache_batch_idx[1] = 4 is outside [0, 4)",
    ),
    "negative batch index": ((sizes(), [1, 1], None, [-1, 0], None), "cache_batch_idx[0] = -1"),
    "used page out of range": (
        (sizes(**PAGED), [16, 5], None, None, [0, 10, 0, 2, 0, 0]),
        "block_table[0][1] = 10 is outside [0, 10)",
    ),
    "negative page": (
        (sizes(**PAGED), None, None, None, [0, 1, 2, 3, -1, 5]),
        "block_table[1][1] = -1",
    ),
}


@pytest.mark.parametrize("case", BAD_VALUES)
def test_bad_values(case):
    args, fragment = BAD_VALUES[case]
    with pytest.raises(ValueError) as info:
        _checks.kvcache_values(OP, *args)
    assert fragment in str(info.value) and str(info.value).startswith(OP), str(info.value)
    assert isinstance(info.value, RuntimeError)


def test_good_values_pass():
    check = _checks.kvcache_values
    check(OP, sizes(), [0, 63], [0, 64], [3, 0], None)  # the last row, leftpad = end
    check(OP, sizes(seqlen_new=0), [64, 0], None, None, None)
    check(OP, sizes(seqlen_new=0), None, [64, 0], None, None)  # no lengths: the capacity
    # Unused pages may hold anything (-1 is a common filler).
    check(OP, sizes(**PAGED, seqlen_new=0), [16, 0], None, None, [9, -1, -1, -1, -1, -1])


def test_paged_varlen_values():
    check = _checks.paged_varlen_values
    check("op", [17, 0], 16, 3, 4, [0, 1, -1, -1, -1, -1])
    with pytest.raises(ValueError, match=r"op: block_table\[0\]\[1\] = 4 is outside \[0, 4\)"):
        check("op", [17, 0], 16, 3, 4, [0, 4, -1, -1, -1, -1])


def test_host_values_splits_one_copy():
    a, b = torch.tensor([1, 2], dtype=I32), torch.tensor([[3, 4, 5]], dtype=I32)
    assert _cuda._host_values([a, None, b]) == [[1, 2], None, [3, 4, 5]]
    assert _cuda._host_values([None, None]) == [None, None]


def test_checked_values_are_read_once_per_tensor_version(monkeypatch):
    # A check that passed is not repeated (no device-to-host copy) for the same, unmodified
    # tensors against the same bounds; anything else checks again.
    monkeypatch.setattr(_cuda, "_verified", type(_cuda._verified)())
    reads = []

    def host_values(tensors):
        reads.append(len(tensors))
        return [None if t is None else t.tolist() for t in tensors]

    monkeypatch.setattr(_cuda, "_host_values", host_values)
    seen = []

    def check(values):
        seen.append(values)
        if values[0][-1] > 10:
            raise ValueError("too long")

    a, b = torch.tensor([0, 3, 7], dtype=I32), torch.tensor([1], dtype=I32)
    _cuda._checked_once(("b", 10), [a, None, b], check)
    _cuda._checked_once(("b", 10), [a, None, b], check)  # same tensors: not read again
    assert len(reads) == 1 and seen == [[[0, 3, 7], None, [1]]]
    _cuda._checked_once(("b", 11), [a, None, b], check)  # other bounds
    assert len(reads) == 2
    b += 0  # modified in place: its version changed
    _cuda._checked_once(("b", 10), [a, None, b], check)
    assert len(reads) == 3
    _cuda._checked_once(("b", 10), [a.clone(), None, b], check)  # another tensor
    assert len(reads) == 4
    a[2] = 12  # a failing check raises, every time
    for _ in range(2):
        with pytest.raises(ValueError, match="too long"):
            _cuda._checked_once(("b", 10), [a, None, b], check)
    assert len(reads) == 6
    # Entries only hold weak references and stay within the limit.
    for n in range(_cuda._VERIFIED_LIMIT + 5):
        _cuda._checked_once(("n", n), [torch.tensor([0], dtype=I32)], lambda values: None)
    assert len(_cuda._verified) == _cuda._VERIFIED_LIMIT


# ------------------------------------------------------- the switch ----
def test_set_value_checks(monkeypatch):
    monkeypatch.setattr(_checks, "_value_checks", True)
    samattn.set_value_checks(False)
    assert not _checks.value_checks_enabled()
    samattn.set_value_checks(True)
    assert _checks.value_checks_enabled()
    with pytest.raises(TypeError, match="enabled must be a bool"):
        samattn.set_value_checks(0)


@pytest.mark.parametrize("value, expected", [("0", False), ("1", True), ("", True)])
def test_value_checks_environment(value, expected):
    env = dict(os.environ, SAMATTN_VALUE_CHECKS=value)
    code = "from samattn import _checks; print(_checks.value_checks_enabled())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(expected)


# ------------------------------------------------- paged prefill (varlen) ----
def varlen_paged(**changes):
    args = dict(
        q=meta(40, H, 64),
        k=meta(10, 16, HK, 64),
        v=meta(10, 16, HK, 64),
        cu_seqlens_q=ints(3),
        cu_seqlens_k=ints(3),
        max_seqlen_q=30,
        max_seqlen_k=48,
        block_table=ints(2, 3),
    )
    args.update(changes)
    return samattn.flash_attn_varlen_func(**args)


def test_paged_prefill_shapes():
    out, lse, _ = varlen_paged(causal=True, return_attn_probs=True)
    assert out.shape == (40, H, 64) and lse.shape == (H, 40)


BAD_PAGED_VARLEN = {
    "packed k": (dict(k=meta(50, HK, 64)), ValueError, "k must be a 4-D paged cache"),
    "max_seqlen_k beyond a sequence's pages": (
        dict(max_seqlen_k=49),
        ValueError,
        "max_seqlen_k = 49 exceeds a sequence's capacity of 48 rows",
    ),
    "block_table rows": (
        dict(block_table=ints(3, 3)),
        ValueError,
        "block_table has 3 rows but cu_seqlens_q describes 2 sequences",
    ),
    "block_table int64": (
        dict(block_table=meta(2, 3, dtype=torch.int64)),
        TypeError,
        "block_table must have dtype torch.int32",
    ),
    "page size": (
        dict(k=meta(10, 8, HK, 64), v=meta(10, 8, HK, 64)),
        ValueError,
        "must be a positive multiple of 16, got 8",
    ),
    "cache head dim unlike q's": (
        dict(k=meta(10, 16, HK, 36), v=meta(10, 16, HK, 36)),
        ValueError,
        "head dim",
    ),
}


@pytest.mark.parametrize("case", BAD_PAGED_VARLEN)
def test_paged_prefill_rejects(case):
    changes, error, fragment = BAD_PAGED_VARLEN[case]
    with pytest.raises(error) as info:
        varlen_paged(**changes)
    assert fragment in str(info.value), str(info.value)


@pytest.mark.filterwarnings("ignore:samattn.flash_attn_varlen_func. head dim")
def test_paged_prefill_odd_head_dim_runs_padded():
    out, lse, _ = varlen_paged(
        q=meta(40, H, 36), k=meta(10, 16, HK, 36), v=meta(10, 16, HK, 36), return_attn_probs=True
    )
    assert out.shape == (40, H, 36) and out.is_contiguous() and lse.shape == (H, 40)


def test_paged_prefill_without_grad_mode_runs():
    with torch.no_grad():
        out = varlen_paged(q=meta(40, H, 64).requires_grad_(True))
    assert not out.requires_grad


PAGED_BACKWARD = r"no backward through a paged KV cache \(block_table\)"


@pytest.mark.parametrize("grad", ["q", "k", "q, k, v", "sinks"])
def test_paged_prefill_forward_runs_under_autograd(grad):
    # flash-attn runs the forward of a paged call whose inputs require grad; only the
    # backward through the paged cache is missing. The output requires grad (it depends
    # on them), and its backward says why there is none.
    tensors = dict(q=meta(40, H, 64), k=meta(10, 16, HK, 64), v=meta(10, 16, HK, 64))
    tensors["sinks"] = meta(H, dtype=torch.float32)
    for name in grad.split(", "):
        tensors[name].requires_grad_(True)
    out = varlen_paged(**tensors)
    assert out.shape == (40, H, 64) and out.requires_grad
    with pytest.raises(NotImplementedError, match=PAGED_BACKWARD) as info:
        out.sum().backward()
    assert isinstance(info.value, RuntimeError)  # flash-attn's fails with a RuntimeError


def paged_prefill(q, k_cache, v_cache, cu_q, cu_k, table, sinks):
    out = samattn.flash_attn_varlen_func(
        q, k_cache, v_cache, cu_q, cu_k, 30, 48, causal=True, block_table=table, sinks=sinks
    )
    return out.float().sum()


@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "sinks"])
def test_compiled_paged_prefill_under_autograd(sinks):
    # AOTAutograd traces the backward with the forward: the paged one must trace (to the op
    # that raises when the compiled backward runs), or the forward would not compile.
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    backward_graphs = []

    def keep_backward(graph, example_inputs):
        backward_graphs.append(graph)
        return make_boxed_func(graph)

    torch._dynamo.reset()
    backend = aot_autograd(
        fw_compiler=lambda graph, _: make_boxed_func(graph), bw_compiler=keep_backward
    )
    q = meta(40, H, 64).requires_grad_(True)
    s = meta(H, dtype=torch.float32).requires_grad_(True) if sinks else None
    loss = torch.compile(paged_prefill, fullgraph=True, backend=backend)(
        q, meta(10, 16, HK, 64), meta(10, 16, HK, 64), ints(3), ints(3), ints(2, 3), s
    )
    assert loss.requires_grad
    loss.backward()  # meta tensors run the op's fake; CUDA ones raise (below)
    assert "samattn.flash_attn_paged_backward" in backward_graphs[-1].code
    torch._dynamo.reset()


def test_paged_backward_op_raises_when_it_runs():
    tensors = (torch.zeros(4, H, 64), torch.zeros(10, 16, HK, 64), torch.zeros(10, 16, HK, 64))
    with pytest.raises(NotImplementedError, match=PAGED_BACKWARD):
        torch.ops.samattn.flash_attn_paged_backward(torch.zeros(4, H, 64), *tensors, None)
    dq, dk, _, dsinks = torch.ops.samattn.flash_attn_paged_backward(
        meta(4, H, 64), meta(4, H, 64), meta(10, 16, HK, 64), meta(10, 16, HK, 64),
        meta(H, dtype=torch.float32),
    )  # fmt: skip
    assert (dq.shape, dk.shape, dsinks.shape) == ((4, H, 64), (10, 16, HK, 64), (H,))


def test_kvcache_outputs_do_not_require_grad():
    # As in flash-attn, flash_attn_with_kvcache records no graph: inputs that require grad
    # are computed on as they are.
    q = meta(B, SQ, H, D).requires_grad_(True)
    out, lse = call(q=q, return_softmax_lse=True)
    assert not out.requires_grad and not lse.requires_grad


# -------------------------------------------------- the C struct's fields ----
def test_kvcache_fields_are_packed(monkeypatch):
    """Paged cache, append with rotary: every KV-cache field where the header wants it.
    CPU tensors stand in for CUDA ones (the device check and the launch are replaced)."""
    captured = {}

    def launch(function, size_function, args, like, expected=False, known_bytes=0):
        captured["args"] = args
        return 0

    monkeypatch.setattr(_cuda, "_stream", lambda t: 0x5000)
    monkeypatch.setattr(_prepared, "run_with_workspace", launch)
    monkeypatch.setattr(_cuda, "_checking_values", lambda: True)
    monkeypatch.setattr(_checks, "_check_devices", lambda op, tensors: None)
    q = torch.zeros(2, 3, 8, 64, dtype=BF16)
    k_cache = v_cache = torch.zeros(10, 32, 2, 64, dtype=BF16)
    k = torch.zeros(2, 3, 2, 64, dtype=BF16)
    v = torch.zeros(2, 3, 2, 64 + 8, dtype=BF16)[..., :64]  # a view: read as it is
    cos = sin = torch.zeros(96, 16, dtype=BF16)
    lens = torch.tensor([5, 40], dtype=I32)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=I32)
    out, lse = _cuda.flash_attn_kvcache(
        q, k_cache, v_cache, k, v, cos, sin, lens, None, None, table,
        _checks.AttentionParams(0.125, True, -1, 0, 0.0), False, 7,
    )  # fmt: skip
    assert out.shape == q.shape and lse.shape == (2, 8, 3)
    args = captured["args"]
    expected = dict(
        struct_size=ctypes.sizeof(_lib.AttentionArgs), dtype=_lib.BF16, batch=2, nheads=8,
        nheads_k=2, seqlen_q=3, seqlen_k=96, headdim=64, cu_seqlens_q=None,
        k=k_cache.data_ptr(), k_batch_stride=32 * 128, k_seq_stride=128, k_head_stride=64,
        seqused_k=lens.data_ptr(), leftpad_k=None, kv_batch_idx=None,
        block_table=table.data_ptr(), block_table_batch_stride=3, block_table_width=3,
        page_size=32, kv_cache_batch=10,
        k_new=k.data_ptr(), k_new_batch_stride=3 * 128, k_new_seq_stride=128,
        k_new_head_stride=64, v_new=v.data_ptr(), v_new_batch_stride=3 * 2 * 72,
        v_new_seq_stride=2 * 72, v_new_head_stride=72, seqlen_new=3,
        rotary_cos=cos.data_ptr(), rotary_sin=sin.data_ptr(), rotary_dim=32,
        rotary_seqlen=96, rotary_interleaved=0, num_splits=7, causal=1, window_right=0,
        stream=0x5000, workspace=None, workspace_bytes=0,
    )  # fmt: skip
    assert {name: getattr(args, name) for name in expected} == expected


def test_kvcache_score_terms_are_packed(monkeypatch):
    """ALiBi slopes (batch, nheads) whose head dim is strided (copied: the library reads
    them with a unit stride) and sinks: the score-term fields of a decode call."""
    captured = {}

    def launch(function, size_function, args, like, expected=False, known_bytes=0):
        captured["args"] = args
        # Read now: a copy lives until the launch is queued.
        slopes = ctypes.cast(args.alibi_slopes, ctypes.POINTER(ctypes.c_float))
        captured["slopes"] = [slopes[i] for i in range(8)]
        return 0

    monkeypatch.setattr(_cuda, "_stream", lambda t: 0)
    monkeypatch.setattr(_prepared, "run_with_workspace", launch)
    monkeypatch.setattr(_cuda, "_checking_values", lambda: False)
    monkeypatch.setattr(_checks, "_check_devices", lambda op, tensors: None)
    q = torch.zeros(2, 1, 4, 64, dtype=BF16)
    cache = torch.zeros(2, 32, 2, 64, dtype=BF16)
    wide = torch.arange(16, dtype=torch.float32).reshape(2, 8)
    slopes = wide[:, ::2]  # (2, 4), head stride 2
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    _cuda.flash_attn_kvcache(
        q, cache, cache, None, None, None, None, 7, None, None, None,
        _checks.AttentionParams(0.125, True, -1, 0, 0.0, False, slopes, sinks), True, 0,
    )  # fmt: skip
    args = captured["args"]
    assert args.alibi_batch_stride == 4 and args.sinks == sinks.data_ptr()
    assert args.dsinks is None and args.attn_mask is None  # forward: no gradient, no mask
    assert captured["slopes"] == slopes.reshape(-1).tolist()


def test_kvcache_values_are_checked_before_the_launch(monkeypatch):
    monkeypatch.setattr(_prepared, "run_with_workspace", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setattr(_cuda, "_stream", lambda t: 0)
    monkeypatch.setattr(_checks, "_check_devices", lambda op, tensors: None)
    q = torch.zeros(2, 1, 8, 64, dtype=F16)
    cache = torch.zeros(10, 16, 2, 64, dtype=F16)
    table = torch.tensor([[0, 1], [2, 10]], dtype=I32)
    lens = torch.tensor([3, 20], dtype=I32)  # sequence 1 uses both its pages
    monkeypatch.setattr(_cuda, "_checking_values", lambda: True)
    with pytest.raises(ValueError, match=r"block_table\[1\]\[1\] = 10 is outside \[0, 10\)"):
        _cuda.flash_attn_kvcache(
            q, cache, cache, None, None, None, None, lens, None, None, table,
            _checks.AttentionParams(1.0, False, -1, -1, 0.0), True, 0,
        )  # fmt: skip


def test_prepared_kvcache_calls(monkeypatch):
    """A decode step whose signature ran before skips the argument checks and writes its own
    pointers (every optional tensor's), but still checks its integer values; an int
    cache_seqlens is a new tensor every call and stays one signature whatever its value;
    copies (a strided new k) and other scalars are never served from a cached struct. CPU
    tensors stand in for CUDA ones (the device check and the launch are replaced)."""
    launched = []

    def launch(function, size_function, args, like, expected=False, known_bytes=0):
        launched.append(_lib.AttentionArgs.from_buffer_copy(args))
        return 0

    def launch_prepared(function, args):
        launch(function, None, args, None)
        return True

    checked, values = [], []
    check, check_values = _checks.kvcache, _checks.kvcache_values
    monkeypatch.setattr(_cuda, "_stream", lambda t: 0x5000)
    monkeypatch.setattr(_prepared, "run_with_workspace", launch)
    monkeypatch.setattr(_prepared, "call_without_workspace", launch_prepared)
    monkeypatch.setattr(_cuda, "_checking_values", lambda: True)
    monkeypatch.setattr(_checks, "_check_devices", lambda op, tensors: None)
    monkeypatch.setattr(_checks, "kvcache", lambda *a: checked.append(1) or check(*a))
    monkeypatch.setattr(
        _checks, "kvcache_values", lambda *a: values.append(a[2]) or check_values(*a)
    )

    def step(lens, want_lse=True, num_splits=0, strided_k=False):
        q = torch.zeros(2, 1, 8, 64, dtype=BF16)
        k_cache, v_cache = (torch.zeros(10, 32, 2, 64, dtype=BF16) for _ in "kv")
        k = torch.zeros(2, 1, 2, 64 + (4 if strided_k else 0), dtype=BF16)[..., :64]
        v = torch.zeros(2, 1, 2, 64, dtype=BF16)
        cos, sin = (torch.zeros(96, 16, dtype=BF16) for _ in "cs")
        table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=I32)
        out, lse = _cuda.flash_attn_kvcache(
            q, k_cache, v_cache, k, v, cos, sin, lens, None, None, table,
            _checks.AttentionParams(0.125, True, -1, 0, 0.0), True, num_splits, want_lse=want_lse,
        )  # fmt: skip
        args = launched[-1]
        pointers = (q, k_cache, v_cache, out, k, v, cos, sin, table)
        fields = ("q", "k", "v", "o", "k_new", "v_new", "rotary_cos", "rotary_sin", "block_table")
        expected = [t.data_ptr() for t in pointers]
        if strided_k:  # read through a contiguous copy
            expected[4] = args.k_new
        assert [getattr(args, f) for f in fields] == expected
        assert args.lse == (lse.data_ptr() if lse is not None else None)
        assert (args.stream, args.seqlen_new, args.rotary_dim, args.page_size) == (
            0x5000,
            1,
            32,
            32,
        )
        if isinstance(lens, torch.Tensor):
            assert args.seqused_k == lens.data_ptr()
        return args, lse

    step(torch.tensor([5, 40], dtype=I32))
    assert len(checked) == 1 and len(_cuda._KVCACHE.entries) == 1
    _, lse = step(torch.tensor([6, 41], dtype=I32), want_lse=False)
    assert len(checked) == 1 and lse is None  # prepared: no argument checks, no lse
    assert values[-1] == [6, 41]  # the values are checked all the same
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 96 plus the 1 new rows exceeds"):
        step(torch.tensor([6, 96], dtype=I32))
    step(7)
    assert len(checked) == 2 and len(_cuda._KVCACHE.entries) == 2
    args, _ = step(8)
    assert len(checked) == 2 and values[-1] == [8, 8] and args.seqused_k  # a new tensor
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 96 plus the 1 new rows"):
        step(96)  # left to the full path, which says what is wrong
    assert len(checked) == 3
    step(7, num_splits=3)
    assert launched[-1].num_splits == 3 and len(_cuda._KVCACHE.entries) == 3
    for _ in range(2):
        step(7, strided_k=True)  # rows of 68 elements: read through a copy, never cached
    assert len(checked) == 6 and len(_cuda._KVCACHE.entries) == 3


# ---------------------------------------------------------- torch.compile ----
def decode_step(q, k_cache, v_cache, k, v, lens, table):
    out, lse = samattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens=lens, block_table=table, causal=True,
        return_softmax_lse=True,
    )  # fmt: skip
    return out * 2, lse


def _decode_inputs():
    return (
        meta(B, 1, H, D),
        meta(10, 16, HK, D),
        meta(10, 16, HK, D),
        *new_kv().values(),
        ints(B),
        ints(B, 3),
    )


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_decode_step(backend):
    torch._dynamo.reset()
    out, lse = torch.compile(decode_step, fullgraph=True, backend=backend)(*_decode_inputs())
    assert out.shape == (B, 1, H, D) and lse.shape == (B, H, 1)


def test_decode_step_has_no_graph_break():
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(decode_step)(*_decode_inputs())
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


@pytest.mark.parametrize("terms", [False, True], ids=["plain", "alibi and sinks"])
def test_opcheck_kvcache(terms):
    tensors = (meta(B, 1, H, D), meta(4, 256, HK, D), meta(4, 256, HK, D), *new_kv().values())
    args = (*tensors, *rotary().values(), ints(B), None, None, None, 0.1, True, -1, 0, 0.0, True, 0)
    if terms:
        args += (meta(B, H, dtype=torch.float32), meta(H, dtype=torch.float32))
    torch.library.opcheck(torch.ops.samattn.flash_attn_with_kvcache.default, args)


def decode_step_with_terms(q, k_cache, v_cache, k, v, lens, table, slopes, sinks):
    return samattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens=lens, block_table=table, causal=True,
        alibi_slopes=slopes, sinks=sinks,
    )  # fmt: skip


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_decode_step_with_score_terms(backend):
    torch._dynamo.reset()
    terms = (meta(H, dtype=torch.float32), meta(H, dtype=torch.float32))
    step = torch.compile(decode_step_with_terms, fullgraph=True, backend=backend)
    assert step(*_decode_inputs(), *terms).shape == (B, 1, H, D)
