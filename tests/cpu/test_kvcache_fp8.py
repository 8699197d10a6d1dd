"""fp8 KV caches without a GPU: flash_attn_with_kvcache's and paged prefill's fp8 caches and
their k_scale / v_scale, validated on "meta" tensors (the public functions' checks and the
ops' fake implementations, which share _checks.kv_cache_fp8), the C struct's fp8 fields as
the eager path packs them (CPU tensors stand in for CUDA ones, the launch replaced), the
prepared calls' handling of the scales, and the ops under torch.compile.
"""

from __future__ import annotations

import ctypes
import math
import warnings

import pytest
import torch

import samattn
from samattn import _checks, _cuda, _lib, _prepared

F16, BF16, F32, I32 = torch.float16, torch.bfloat16, torch.float32, torch.int32
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
OP = "samattn.flash_attn_with_kvcache"
VARLEN = "samattn.flash_attn_varlen_func"


def meta(*shape: int, dtype: torch.dtype = F16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def ints(*shape: int) -> torch.Tensor:
    return meta(*shape, dtype=I32)


def scale(*shape: int, dtype: torch.dtype = F32) -> torch.Tensor:
    return meta(*shape, dtype=dtype)


@pytest.fixture(autouse=True)
def _no_prepared_kvcache_calls():
    """Tests that replace the launch must not leave prepared entries to the next test."""
    _cuda._KVCACHE.clear()
    yield
    _cuda._KVCACHE.clear()


# A decode problem: batch 2, 8 query heads over 2 kv heads, d 128, caches of 4 x 256 rows.
B, H, HK, D = 2, 8, 2, 128


def caches(dtype=E4M3, d=D, shape=(4, 256)) -> dict:
    return dict(k_cache=meta(*shape, HK, d, dtype=dtype), v_cache=meta(*shape, HK, d, dtype=dtype))


def new_kv(s: int = 1, dtype: torch.dtype = F16) -> dict:
    return dict(k=meta(B, s, HK, D, dtype=dtype), v=meta(B, s, HK, D, dtype=dtype))


def call(**changes):
    """flash_attn_with_kvcache on valid meta inputs with e4m3 caches, with `changes`."""
    args = dict(q=meta(B, 1, H, D), **caches())
    args.update(changes)
    return samattn.flash_attn_with_kvcache(**args)


def op_inputs(**changes) -> tuple:
    """The op's inputs for call(**changes)'s problem (positional, scales at the end)."""
    args = dict(q=meta(B, 1, H, D), **caches(), k=None, v=None)
    args.update(changes)
    k_scale, v_scale = args.pop("k_scale", None), args.pop("v_scale", None)
    tensors = tuple(
        args[n] for n in ("q", "k_cache", "v_cache", "k", "v")
    )  # rotary, lens, batch_idx, leftpad, block_table, then the scalars
    lens = args.get("cache_seqlens")
    if isinstance(lens, int):  # the op takes a tensor (the public function makes one)
        lens = ints(B)
    scalars = (None, None, lens, None, None, args.get("block_table"))
    scalars += (D**-0.5, True, -1, -1, 0.0, True, 0, None, None)
    scale_inputs = tuple(s if isinstance(s, torch.Tensor) else None for s in (k_scale, v_scale))
    scale_inputs += tuple(
        None if s is None or isinstance(s, torch.Tensor) else s for s in (k_scale, v_scale)
    )
    return (*tensors, *scalars, *scale_inputs)


# --------------------------------------------------------- valid calls ----
VALID = {
    "e4m3, no scales (1.0)": dict(),
    "e5m2, float scales": dict(**caches(E5M2), k_scale=0.5, v_scale=2.0),
    "int scales": dict(k_scale=2, v_scale=1),
    "k_scale only": dict(k_scale=0.25),
    "v_scale only, a tensor of one element": dict(v_scale=scale(1)),
    "0-dim tensor scales": dict(k_scale=scale(), v_scale=scale()),
    "per-head tensor scales": dict(k_scale=scale(HK), v_scale=scale(HK)),
    "per-head k tensor, v float": dict(k_scale=scale(HK), v_scale=3.0),
    "append": dict(cache_seqlens=ints(B), k_scale=scale(HK), v_scale=scale(HK), **new_kv()),
    "append, rotary, causal": dict(
        cache_seqlens=ints(B),
        rotary_cos=meta(256, D // 2),
        rotary_sin=meta(256, D // 2),
        causal=True,
        k_scale=0.5,
        v_scale=0.5,
        **new_kv(4),
    ),
    "paged 16": dict(
        **caches(shape=(10, 16)), block_table=ints(B, 3), cache_seqlens=ints(B), k_scale=1.5
    ),
    "paged 256, append": dict(
        **caches(E5M2, shape=(5, 256)),
        block_table=ints(B, 2),
        cache_seqlens=ints(B),
        k_scale=scale(HK),
        v_scale=scale(HK),
        **new_kv(),
    ),
    "bf16 q": dict(q=meta(B, 4, H, D, dtype=BF16), k_scale=0.5),
    "MQA, one scale per KV head": dict(
        k_cache=meta(4, 256, 1, D, dtype=E4M3),
        v_cache=meta(4, 256, 1, D, dtype=E4M3),
        k_scale=scale(1),
        v_scale=scale(1),
    ),
    "head dim 64, cache_batch_idx, leftpad": dict(
        q=meta(B, 1, H, 64),
        **caches(d=64),
        cache_batch_idx=ints(B),
        cache_leftpad=ints(B),
        cache_seqlens=ints(B),
        k_scale=0.5,
    ),
    "head dim 16": dict(q=meta(B, 1, H, 16), **caches(d=16)),
    "strides of 16 bytes": dict(
        k_cache=meta(4, 256, HK, D + 16, dtype=E4M3)[..., :D],
        v_cache=meta(4, 256, HK, D + 16, dtype=E4M3)[..., :D],
    ),
    "alibi, sinks, softcap, window": dict(
        alibi_slopes=scale(H), sinks=scale(H), softcap=20.0, window_size=(64, 0), k_scale=2.0
    ),
}


@pytest.mark.parametrize("case", VALID)
def test_valid_fp8_calls_give_shapes(case):
    changes = VALID[case]
    q = changes.get("q", meta(B, 1, H, D))
    out, lse = call(return_softmax_lse=True, **changes)
    assert out.shape == q.shape and out.dtype == q.dtype  # q's dtype, not the caches'
    assert lse.shape == (B, H, q.shape[1]) and lse.dtype == F32


# --------------------------------------------------------- bad arguments ----
BAD = {
    "scale with fp16 caches": (
        dict(**caches(F16), k_scale=0.5),
        ValueError,
        "k_scale is given, but k_cache has dtype torch.float16; k_scale and v_scale apply to "
        "fp8 KV caches only",
    ),
    "scale of 1.0 with bf16 caches": (
        dict(q=meta(B, 1, H, D, dtype=BF16), **caches(BF16), v_scale=1.0),
        ValueError,
        "v_scale is given, but k_cache has dtype torch.bfloat16",
    ),
    "tensor scale with fp16 caches": (
        dict(**caches(F16), k_scale=scale(HK)),
        ValueError,
        "k_scale is given, but k_cache has dtype torch.float16",
    ),
    "e4m3 k_cache, e5m2 v_cache": (
        dict(v_cache=meta(4, 256, HK, D, dtype=E5M2)),
        TypeError,
        "k_cache has dtype torch.float8_e4m3fn but v_cache has torch.float8_e5m2; fp8 KV "
        "caches must both have one fp8 dtype",
    ),
    "fp8 k_cache, fp16 v_cache": (
        dict(v_cache=meta(4, 256, HK, D)),
        TypeError,
        "k_cache has dtype torch.float8_e4m3fn but v_cache has torch.float16",
    ),
    "fp16 k_cache, fp8 v_cache": (
        dict(k_cache=meta(4, 256, HK, D)),
        TypeError,
        "k_cache has dtype torch.float16 but v_cache has torch.float8_e4m3fn",
    ),
    "fp8 new k": (
        dict(cache_seqlens=3, **new_kv(dtype=E4M3)),
        TypeError,
        "k has dtype torch.float8_e4m3fn; the new keys and values have q's dtype (torch.float16)",
    ),
    "fp8 q": (
        dict(q=meta(B, 1, H, D, dtype=E4M3)),
        TypeError,
        "q has dtype torch.float8_e4m3fn; samattn attention supports torch.float16",
    ),
    "head dim 72 (a multiple of 8, not of 16)": (
        dict(q=meta(B, 1, H, 72), **caches(d=72)),
        ValueError,
        "fp8 KV caches need a head dim that is a multiple of 16 (rows of 16-byte vectors), "
        "got 72; unlike 16-bit caches they are never run on padded copies",
    ),
    "head dim 59 (never padded)": (
        dict(q=meta(B, 1, H, 59), **caches(d=59), k_scale=0.5),
        ValueError,
        "fp8 KV caches need a head dim that is a multiple of 16",
    ),
    "row stride of 8 elements": (
        dict(k_cache=meta(4, 256, HK, D + 8, dtype=E4M3)[..., :D]),
        ValueError,
        "k_cache has strides (69632, 272, 136, 1); a KV cache is used in place, so its "
        "head dim must be contiguous and its other strides multiples of 16 elements",
    ),
    "head dim not contiguous": (
        dict(v_cache=meta(4, 256, D, HK, dtype=E4M3).transpose(2, 3)),
        ValueError,
        "v_cache has strides",
    ),
    "scale float64 tensor": (
        dict(k_scale=scale(HK, dtype=torch.float64)),
        TypeError,
        "k_scale must be a float or a torch.float32 tensor, got dtype torch.float64; convert "
        "it with k_scale.float()",
    ),
    "scale bf16 tensor": (dict(v_scale=scale(1, dtype=BF16)), TypeError, "v_scale must be a"),
    "scale per query head": (
        dict(k_scale=scale(H)),
        ValueError,
        f"k_scale must have shape () or (1,) (one scale for every KV head) or (nheads_k,) = "
        f"({HK},) (one per KV head), got ({H},)",
    ),
    "scale (1, nheads_k)": (dict(v_scale=scale(1, HK)), ValueError, "v_scale must have shape"),
    "scale not contiguous": (
        dict(k_scale=scale(2 * HK)[::2]),
        ValueError,
        "k_scale must be contiguous (the kernels read it in place), got stride 2",
    ),
    "scale requires grad": (
        dict(v_scale=scale(HK).requires_grad_(True)),
        ValueError,
        "v_scale requires grad, but fp8 KV caches are forward only",
    ),
    "scale tensors of different lengths": (
        dict(k_scale=scale(HK), v_scale=scale(1)),
        ValueError,
        "k_scale has 2 elements but v_scale has 1",
    ),
    "negative scale": (dict(k_scale=-0.5), ValueError, "k_scale must be positive and finite"),
    "zero scale": (dict(v_scale=0.0), ValueError, "v_scale must be positive and finite, got 0.0"),
    "infinite scale": (dict(k_scale=math.inf), ValueError, "k_scale must be positive and finite"),
    "nan scale": (dict(k_scale=math.nan), ValueError, "k_scale must be positive and finite"),
    "bool scale": (dict(k_scale=True), TypeError, "k_scale must be None, a float or a"),
    "string scale": (dict(v_scale="1"), TypeError, "got str"),
    "list scale": (dict(k_scale=[1.0, 2.0]), TypeError, "got list"),
    "scale on the cpu": (
        dict(k_scale=torch.ones(HK)),
        ValueError,
        "samattn ops need CUDA tensors, but k_scale is on cpu",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_fp8_arguments_raise_naming_them(case):
    changes, error, fragment = BAD[case]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no padded-copy warning on the way to the error
        with pytest.raises(error) as info:
            call(**changes)
    message = str(info.value)
    assert fragment in message and message.startswith(OP), message
    if error is ValueError:  # also a RuntimeError, which flash-attn's checks raise
        assert isinstance(info.value, samattn.ArgumentError), type(info.value)


# What the op's schema cannot take (a scale that is neither a tensor nor a float) is the
# public function's to refuse.
NOT_OP_INPUTS = ("bool scale", "string scale", "list scale")


@pytest.mark.parametrize("case", [c for c in BAD if c not in NOT_OP_INPUTS])
def test_the_fake_raises_what_eager_raises(case):
    """The op's fake implementation (what torch.compile runs) checks the same rules with
    the same messages: the scales reach it as its tensor or float inputs."""
    changes, error, fragment = BAD[case]
    inputs = op_inputs(**changes)
    with pytest.raises(error) as info:
        torch.ops.samattn.flash_attn_with_kvcache(*inputs)
    assert fragment in str(info.value), str(info.value)


def test_scales_of_the_op():
    """The op takes a tensor where given, else the float value; both given: the tensor."""
    inputs = op_inputs(k_scale=scale(HK), v_scale=0.5)
    assert inputs[-4].shape == (HK,) and inputs[-3:] == (None, None, 0.5)
    out, lse = torch.ops.samattn.flash_attn_with_kvcache(*inputs)
    assert out.shape == (B, 1, H, D) and lse.shape == (B, H, 1)
    # A float value of a 16-bit cache's scale is refused by the fake as by eager.
    with pytest.raises(ValueError, match="v_scale is given, but k_cache has dtype"):
        torch.ops.samattn.flash_attn_with_kvcache(*op_inputs(**caches(F16), v_scale=1.0))


# ------------------------------------------------------ paged prefill ----
def varlen_paged(**changes):
    args = dict(
        q=meta(40, H, 64),
        k=meta(10, 16, HK, 64, dtype=E4M3),
        v=meta(10, 16, HK, 64, dtype=E4M3),
        cu_seqlens_q=ints(3),
        cu_seqlens_k=ints(3),
        max_seqlen_q=30,
        max_seqlen_k=48,
        block_table=ints(2, 3),
    )
    args.update(changes)
    return samattn.flash_attn_varlen_func(**args)


@pytest.mark.parametrize(
    "scales",
    [
        dict(),
        dict(k_scale=0.5, v_scale=4.0),
        dict(k_scale=scale(HK), v_scale=scale(HK)),
        dict(k_scale=scale(), v_scale=0.5),
    ],
    ids=["none", "floats", "per-head tensors", "0-dim tensor and float"],
)
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_paged_prefill_with_fp8_caches(dtype, scales):
    k, v = meta(10, 256, HK, 64, dtype=dtype), meta(10, 256, HK, 64, dtype=dtype)
    out, lse, _ = varlen_paged(k=k, v=v, causal=True, return_attn_probs=True, **scales)
    assert out.shape == (40, H, 64) and out.dtype == F16 and lse.shape == (H, 40)


BAD_PAGED = {
    "scale with fp16 pages": (
        dict(k=meta(10, 16, HK, 64), v=meta(10, 16, HK, 64), v_scale=2.0),
        ValueError,
        "v_scale is given, but k has dtype torch.float16; k_scale and v_scale apply to fp8 KV "
        "caches only",
    ),
    "scale without block_table": (
        dict(k=meta(50, HK, 64), v=meta(50, HK, 64), block_table=None, k_scale=0.5),
        ValueError,
        "k_scale is given without block_table; k_scale and v_scale apply to fp8 KV caches, "
        "which flash_attn_varlen_func reads only as paged caches (block_table)",
    ),
    "fp8 packed k and v": (
        dict(k=meta(50, HK, 64, dtype=E4M3), v=meta(50, HK, 64, dtype=E4M3), block_table=None),
        TypeError,
        "k has dtype torch.float8_e4m3fn; fp8 keys and values are read only from KV caches",
    ),
    "pages of two fp8 dtypes": (
        dict(v=meta(10, 16, HK, 64, dtype=E5M2)),
        TypeError,
        "k has dtype torch.float8_e4m3fn but v has torch.float8_e5m2",
    ),
    "head dim 40": (
        dict(
            q=meta(40, H, 40),
            k=meta(10, 16, HK, 40, dtype=E4M3),
            v=meta(10, 16, HK, 40, dtype=E4M3),
        ),
        ValueError,
        "fp8 KV caches need a head dim that is a multiple of 16 (rows of 16-byte vectors), got 40",
    ),
    "scale per query head": (dict(k_scale=scale(H)), ValueError, "k_scale must have shape"),
    "scale tensor on the cpu": (dict(v_scale=torch.ones(1)), ValueError, "v_scale is on cpu"),
    "scale int64 tensor": (dict(k_scale=scale(1, dtype=torch.int64)), TypeError, "k_scale"),
}


@pytest.mark.parametrize("case", BAD_PAGED)
def test_paged_prefill_rejects_bad_fp8_arguments(case):
    changes, error, fragment = BAD_PAGED[case]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(error) as info:
            varlen_paged(**changes)
    message = str(info.value)
    assert fragment in message and message.startswith(VARLEN), message


def test_fp8_keys_are_refused_by_flash_attn_func():
    q, k = meta(2, 16, 4, 64), meta(2, 32, 4, 64, dtype=E4M3)
    with pytest.raises(TypeError, match=r"k has dtype torch\.float8_e4m3fn; fp8 keys and values"):
        samattn.flash_attn_func(q, k, k)


PAGED_BACKWARD = r"no backward through a paged KV cache \(block_table\)"


def test_paged_fp8_prefill_runs_under_autograd_without_a_backward():
    q = meta(40, H, 64).requires_grad_(True)
    out = varlen_paged(q=q, k_scale=scale(HK), v_scale=0.5)
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match=PAGED_BACKWARD):
        out.sum().backward()


def test_the_forward_op_takes_the_scales():
    """samattn::flash_attn_forward's fake checks the scales of paged caches (and refuses
    them without block_table), as the public function does."""
    tensors = (meta(40, H, 64), meta(10, 16, HK, 64, dtype=E5M2), meta(10, 16, HK, 64, dtype=E5M2))
    head = (*tensors, ints(3), ints(3), 30, 48, 0.125, True, -1, -1, 0.0, False)
    out, _ = torch.ops.samattn.flash_attn_forward(
        *head, ints(2, 3), None, None, 0.0, None, scale(HK), None, None, 2.0
    )
    assert out.shape == (40, H, 64) and out.dtype == F16
    with pytest.raises(ValueError, match=r"k_scale must be positive and finite, got -2\.0"):
        torch.ops.samattn.flash_attn_forward(*head, ints(2, 3), None, None, 0.0, None,
                                             None, None, -2.0)  # fmt: skip
    packed = (meta(40, H, 64), meta(50, HK, 64), meta(50, HK, 64), ints(3), ints(3), 30, 48)
    with pytest.raises(ValueError, match="k_scale is given without block_table"):
        torch.ops.samattn.flash_attn_forward(
            *packed, 0.125, True, -1, -1, 0.0, False, None, None, None, 0.0, None, None, None, 1.0
        )


# ---------------------------------------------- the C struct's fp8 fields ----
@pytest.fixture
def launched(monkeypatch) -> list[_lib.AttentionArgs]:
    """The struct of every launch (a copy), the launch and the device check replaced: CPU
    tensors stand in for CUDA ones."""
    structs: list[_lib.AttentionArgs] = []

    def launch(function, size_function, args, like, expected=False, known_bytes=0):
        structs.append(_lib.AttentionArgs.from_buffer_copy(args))
        return 0

    def launch_prepared(function, args):
        structs.append(_lib.AttentionArgs.from_buffer_copy(args))
        return True

    monkeypatch.setattr(_cuda, "_stream", lambda t: 0x5000)
    monkeypatch.setattr(_prepared, "run_with_workspace", launch)
    monkeypatch.setattr(_prepared, "call_without_workspace", launch_prepared)
    monkeypatch.setattr(_cuda, "_checking_values", lambda: False)
    monkeypatch.setattr(_checks, "_check_devices", lambda op, tensors: None)
    return structs


def _fp8_fields(args: _lib.AttentionArgs) -> tuple:
    names = ("kv_fp8", "kv_fp8_reserved", "k_scale_ptr", "v_scale_ptr", "kv_scale_head_stride",
             "k_scale_value", "v_scale_value")  # fmt: skip
    return tuple(getattr(args, name) for name in names)


def _decode(k_scale=None, v_scale=None, dtype=E4M3, paged=False, append=False, lens=None):
    """A CPU decode step through the eager CUDA implementation: (out, caches)."""
    q = torch.zeros(2, 1, 8, 64, dtype=BF16)
    shape = (10, 16, 2, 64) if paged else (2, 32, 2, 64)
    k_cache, v_cache = (torch.zeros(shape, dtype=dtype) for _ in "kv")
    table = torch.tensor([[0, 1], [2, 3]], dtype=I32) if paged else None
    k = v = None
    if append:
        k, v = (torch.zeros(2, 1, 2, 64, dtype=BF16) for _ in "kv")
    lens = torch.tensor([3, 7], dtype=I32) if lens is None else lens
    out, _ = _cuda.flash_attn_kvcache(
        q, k_cache, v_cache, k, v, None, None, lens, None, None, table,
        _checks.AttentionParams(0.125, True, -1, 0, 0.0), True, 0, OP, True, k_scale, v_scale,
    )  # fmt: skip
    return out, k_cache


def test_fp8_fields_of_float_scales(launched):
    out, k_cache = _decode(0.5, 3.0, append=True)
    args = launched[-1]
    assert out.dtype == BF16 and args.dtype == _lib.BF16  # q's dtype
    assert _fp8_fields(args) == (_lib.F8_E4M3, 0, None, None, 0, 0.5, 3.0)
    # Strides of an fp8 cache count its 1-byte elements.
    assert (args.k_batch_stride, args.k_seq_stride, args.k_head_stride) == (32 * 128, 128, 64)
    assert args.k == k_cache.data_ptr() and args.k_new is not None


def test_fp8_fields_of_tensor_scales(launched):
    per_head, one = torch.tensor([0.5, 2.0]), torch.tensor(4.0)
    _decode(per_head, 0.25, dtype=E5M2, paged=True)
    assert _fp8_fields(launched[-1]) == (_lib.F8_E5M2, 0, per_head.data_ptr(), None, 1, 1.0, 0.25)
    _decode(one, one.reshape(1))
    assert _fp8_fields(launched[-1]) == (_lib.F8_E4M3, 0, one.data_ptr(), one.data_ptr(), 0,
                                         1.0, 1.0)  # fmt: skip
    _decode(None, per_head)  # v per head, k 1.0
    assert _fp8_fields(launched[-1]) == (_lib.F8_E4M3, 0, None, per_head.data_ptr(), 1, 1.0, 1.0)


def test_fp8_fields_without_scales_and_of_16_bit_caches(launched):
    _decode()
    assert _fp8_fields(launched[-1]) == (_lib.F8_E4M3, 0, None, None, 0, 1.0, 1.0)
    _decode(dtype=BF16)
    assert _fp8_fields(launched[-1]) == (0, 0, None, None, 0, 1.0, 1.0)


def test_fp8_fields_of_paged_prefill(launched, monkeypatch):
    q = torch.zeros(40, 8, 64, dtype=F16)
    k_cache, v_cache = (torch.zeros(10, 16, 2, 64, dtype=E5M2) for _ in "kv")
    per_head = torch.tensor([1.5, 0.5])
    out, _ = _cuda.flash_attn_forward(
        q, k_cache, v_cache, _checks.AttentionParams(0.125, True, -1, 0, 0.0),
        torch.tensor([0, 20, 40], dtype=I32), torch.tensor([0, 30, 48], dtype=I32), 30, 48,
        VARLEN, torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=I32), k_scale=0.75, v_scale=per_head,
    )  # fmt: skip
    args = launched[-1]
    assert out.dtype == F16 and args.page_size == 16 and args.kv_cache_batch == 10
    assert _fp8_fields(args) == (_lib.F8_E5M2, 0, None, per_head.data_ptr(), 1, 0.75, 1.0)
    assert (args.k_batch_stride, args.k_seq_stride, args.k_head_stride) == (16 * 128, 128, 64)
    # 16-bit pages: no fp8 fields.
    _cuda.flash_attn_forward(
        q, k_cache.to(F16), v_cache.to(F16), _checks.AttentionParams(0.125, True, -1, 0, 0.0),
        torch.tensor([0, 20, 40], dtype=I32), torch.tensor([0, 30, 48], dtype=I32), 30, 48,
        VARLEN, torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=I32),
    )  # fmt: skip
    assert _fp8_fields(launched[-1]) == (0, 0, None, None, 0, 1.0, 1.0)


# ------------------------------------------------------- prepared calls ----
def test_prepared_calls_refresh_the_scales(launched, monkeypatch):
    """A signature that ran before (its key: the caches' dtype and each scale's kind) is
    served from its struct with this call's scale value or pointer; another kind, another
    fp8 dtype or a 16-bit cache is another signature; a float the checks would refuse goes
    to the full path, which raises."""
    checked = []
    check = _checks.kvcache
    monkeypatch.setattr(_checks, "kvcache", lambda *a: checked.append(1) or check(*a))
    _decode(0.5, 2.0)
    assert len(checked) == 1 and len(_cuda._KVCACHE.entries) == 1
    _decode(0.25, 8.0)
    assert len(checked) == 1  # prepared
    assert _fp8_fields(launched[-1]) == (_lib.F8_E4M3, 0, None, None, 0, 0.25, 8.0)
    first, second = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    _decode(first, 2.0)
    assert len(checked) == 2 and len(_cuda._KVCACHE.entries) == 2  # another kind
    _decode(second, 6.0)
    assert len(checked) == 2
    assert _fp8_fields(launched[-1]) == (_lib.F8_E4M3, 0, second.data_ptr(), None, 1, 1.0, 6.0)
    _decode(0.5, 2.0, dtype=E5M2)  # another fp8 dtype
    assert len(checked) == 3 and launched[-1].kv_fp8 == _lib.F8_E5M2
    _decode(None, None)  # no scales: a signature of its own
    assert len(checked) == 4 and _fp8_fields(launched[-1])[5:] == (1.0, 1.0)
    for bad in (-1.0, math.nan, math.inf, 0.0):
        with pytest.raises(ValueError, match="k_scale must be positive and finite"):
            _decode(bad, 2.0)
    assert len(checked) == 8 and len(launched) == 6  # refused before any launch
    # An int is converted by the full path every call (public functions pass floats).
    _decode(2, 2.0)
    assert len(checked) == 9 and _fp8_fields(launched[-1])[5:] == (2.0, 2.0)
    # A scale that requires grad is not the signature of one that does not.
    with pytest.raises(ValueError, match="k_scale requires grad"):
        _decode(first.clone().requires_grad_(True), 2.0)


# ---------------------------------------------------------- torch.compile ----
def decode_step(q, k_cache, v_cache, k, v, lens, table, k_scale, v_scale):
    out, lse = samattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens=lens, block_table=table, causal=True,
        return_softmax_lse=True, k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip
    return out * 2, lse


SCALES = {
    "none": (None, None),
    "floats": (0.5, 2.0),
    "per-head tensors": (scale(HK), scale(HK)),
    "tensor and float": (scale(1), 4.0),
}


def _decode_inputs(dtype=E4M3):
    return (
        meta(B, 1, H, D),
        meta(10, 16, HK, D, dtype=dtype),
        meta(10, 16, HK, D, dtype=dtype),
        *new_kv().values(),
        ints(B),
        ints(B, 3),
    )


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_fp8_decode_step(backend, dtype, scales):
    torch._dynamo.reset()
    step = torch.compile(decode_step, fullgraph=True, backend=backend)
    out, lse = step(*_decode_inputs(dtype), *SCALES[scales])
    assert out.shape == (B, 1, H, D) and out.dtype == F16 and lse.shape == (B, H, 1)
    torch._dynamo.reset()


@pytest.mark.parametrize("scales", ["floats", "per-head tensors"])
def test_fp8_decode_step_has_no_graph_break(scales):
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(decode_step)(*_decode_inputs(), *SCALES[scales])
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()


def test_compiled_step_raises_the_eager_error():
    torch._dynamo.reset()
    step = torch.compile(decode_step, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="k_scale must have shape") as info:
        step(*_decode_inputs(), scale(H), None)
    # Under torch.compile the fake's error may arrive wrapped; the message is the same.
    assert "k_scale must have shape" in str(info.value)
    torch._dynamo.reset()


@pytest.mark.parametrize("scales", ["none", "floats", "per-head tensors"])
def test_opcheck_fp8_kvcache(scales):
    k_scale, v_scale = SCALES[scales]
    tensors = (meta(B, 1, H, D), *caches().values(), *new_kv().values())
    args = (*tensors, None, None, ints(B), None, None, None, 0.1, True, -1, 0, 0.0, True, 0)
    args += (None, None, *op_inputs(k_scale=k_scale, v_scale=v_scale)[-4:])
    torch.library.opcheck(torch.ops.samattn.flash_attn_with_kvcache.default, args)


def paged_prefill(q, k_cache, v_cache, cu_q, cu_k, table, k_scale, v_scale):
    return samattn.flash_attn_varlen_func(
        q, k_cache, v_cache, cu_q, cu_k, 30, 48, causal=True, block_table=table,
        k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip


@pytest.mark.parametrize("scales", ["floats", "per-head tensors"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_fp8_paged_prefill(backend, scales):
    torch._dynamo.reset()
    step = torch.compile(paged_prefill, fullgraph=True, backend=backend)
    k_cache, v_cache = (meta(10, 16, HK, 64, dtype=E4M3) for _ in "kv")
    out = step(meta(40, H, 64), k_cache, v_cache, ints(3), ints(3), ints(2, 3), *SCALES[scales])
    assert out.shape == (40, H, 64) and out.dtype == F16
    torch._dynamo.reset()


# ------------------------------------------------------------ constants ----
def test_fp8_constants():
    assert _checks.FP8_CODES == {E4M3: _lib.F8_E4M3, E5M2: _lib.F8_E5M2}
    for dtype, largest in _checks.FP8_MAX.items():
        assert largest == torch.finfo(dtype).max
    assert ctypes.sizeof(_lib.AttentionArgs) == _lib.ATTENTION_PACKER.size
