"""The op x family registry without a GPU: argument structs that carry their own size
(C ABI 6), plans that decline a problem and automatic selection falling through to the next
family, and the attention window as the kernels get it (samattn_attention_plan)."""

from __future__ import annotations

import ctypes

import pytest
from cpu_helpers import attention_args, gemm_args, softmax_args

import samattn
from samattn import _lib

SM80 = (8, 0)
BIG_SMEM = 227 * 1024
PADDED_HEAD_DIMS = (32, 64, 96, 128, 192, 256)


def call_sized(function, args: ctypes.Structure, size: int, tail: bytes = b"", *rest):
    """Calls function(args as a struct of `size` bytes, *rest): a caller built against a
    header whose struct is `size` bytes long, with `tail` after this library's fields."""
    # The library reads past its own fields only up to a plausible struct_size.
    buffer = ctypes.create_string_buffer(ctypes.sizeof(args) + len(tail))
    ctypes.memmove(buffer, ctypes.byref(args), ctypes.sizeof(args))
    ctypes.memmove(ctypes.addressof(buffer) + ctypes.sizeof(args), tail, len(tail))
    ctypes.c_int64.from_buffer(buffer).value = size
    pointer = ctypes.cast(buffer, ctypes.POINTER(type(args)))
    return function(pointer, *rest), _lib.last_error()


def gemm_plan_raw(pointer, *_):
    family, text = ctypes.c_int32(), ctypes.create_string_buffer(256)
    return _lib.lib().samattn_gemm_plan(pointer, 9, 0, 132, ctypes.byref(family), text, 256)


def softmax_forward_raw(pointer, *_):
    return _lib.lib().samattn_softmax_forward(pointer, None)


def attention_plan_raw(pointer, *_):
    family, text = ctypes.c_int32(), ctypes.create_string_buffer(128)
    return _lib.lib().samattn_attention_plan(
        pointer, 0, 8, 0, BIG_SMEM, ctypes.byref(family), text, 128
    )


# Each with arguments a CPU can answer: two pure queries and an empty softmax (returns
# before any device access).
SIZED_CALLS = {
    "gemm": (gemm_plan_raw, lambda: gemm_args(m=4096, n=4096, k=4096), "samattn_gemm_args"),
    "softmax": (softmax_forward_raw, lambda: softmax_args(outer=0), "samattn_softmax_args"),
    "attention": (attention_plan_raw, attention_args, "samattn_attention_args"),
}


def test_abi_version():
    assert _lib.ABI_VERSION == 6 == _lib.lib().samattn_abi_version()


@pytest.mark.parametrize("op", SIZED_CALLS)
def test_struct_size_is_set_by_the_python_mirror(op):
    args = SIZED_CALLS[op][1]()
    assert args.struct_size == ctypes.sizeof(args)


@pytest.mark.parametrize("op", SIZED_CALLS)
def test_struct_of_an_older_abi_is_refused(op):
    function, make, struct = SIZED_CALLS[op]
    if op == "attention" and "attention" not in _lib.built_ops():
        pytest.skip("attention not built")
    args = make()
    for size in (0, 8, ctypes.sizeof(args) - 8, 2**40):
        status, message = call_sized(function, args, size)
        assert status == _lib.INVALID_ARGUMENT, (size, message)
        assert f"struct_size is {size}" in message and "older" in message and struct in message


@pytest.mark.parametrize("op", SIZED_CALLS)
def test_struct_of_a_newer_abi_with_unused_fields_is_accepted(op):
    function, make, _ = SIZED_CALLS[op]
    if op == "attention" and "attention" not in _lib.built_ops():
        pytest.skip("attention not built")
    args = make()
    status, message = call_sized(function, args, ctypes.sizeof(args) + 24, bytes(24))
    assert status == _lib.OK, message


@pytest.mark.parametrize("op", SIZED_CALLS)
def test_struct_of_a_newer_abi_with_a_field_set_is_refused(op):
    function, make, struct = SIZED_CALLS[op]
    args = make()
    size = ctypes.sizeof(args)
    status, message = call_sized(function, args, size + 24, bytes(9) + b"\x01" + bytes(14))
    assert status == _lib.INVALID_ARGUMENT, message
    assert f"byte {size + 9}" in message and struct in message and "newer" in message


# ------------------------------------------------------ attention plans ----
needs_attention = pytest.mark.skipif(
    "attention" not in _lib.built_ops() or not {"sm75", "sm80"} <= set(samattn.built_families()),
    reason="needs the attention ops of the sm75 and sm80 families",
)


def plan(backward=False, cc=SM80, smem=BIG_SMEM, **changes):
    return _lib.attention_plan(attention_args(**changes), backward, cc, smem)


def plan_error(backward=False, cc=SM80, smem=BIG_SMEM, **changes):
    with pytest.raises((ValueError, _lib.UnsupportedError)) as raised:
        plan(backward, cc, smem, **changes)
    return raised.value


@needs_attention
@pytest.mark.parametrize("backward", [False, True])
def test_newest_family_runs_what_it_can(backward):
    assert plan(backward)[0] == "sm80"
    assert plan(backward, cc=(7, 5), smem=64 * 1024)[0] == "sm75"


@needs_attention
def test_a_declined_problem_falls_through_to_the_next_family():
    # d=128: the smallest sm80 forward tile needs 64 KB, sm75's 32 KB.
    args = dict(headdim=128, q_head_stride=128, k_head_stride=128, v_head_stride=128)
    assert plan(smem=40 * 1024, **args)[0] == "sm75"
    assert plan(smem=64 * 1024, **args)[0] == "sm80"


@needs_attention
def test_a_forced_family_that_declines_says_why():
    args = dict(family=_lib.FAMILY_CODES["sm80"], headdim=128)
    error = plan_error(smem=40 * 1024, **args)
    assert isinstance(error, _lib.UnsupportedError)
    message = str(error)
    assert message.startswith("samattn attention_plan (float16): family sm80 cannot run this")
    assert "no kernel for head dim 128 that fits the 40960 bytes of shared memory" in message


@needs_attention
def test_forced_family_from_the_environment_declines(monkeypatch):
    monkeypatch.setenv("SAMATTN_FAMILY", "sm80")
    message = str(plan_error(smem=1024))
    assert "family sm80 (from SAMATTN_FAMILY) cannot run this problem" in message


@needs_attention
def test_nothing_fits_names_every_family():
    message = str(plan_error(smem=1024))
    assert "no family built into this library runs this problem" in message
    assert "family sm80: no kernel for head dim 64 that fits the 1024 bytes" in message
    assert "family sm75: no kernel for head dim 64" in message


@needs_attention
@pytest.mark.parametrize("backward", [False, True])
def test_head_dims_left_out_of_the_build_are_declined(backward):
    left_out = []
    for d in PADDED_HEAD_DIMS:
        try:
            plan(backward, headdim=d)
        except _lib.UnsupportedError as error:
            if "which this build left out" in str(error):
                left_out.append(d)
    if not left_out:
        pytest.skip("this build has every head dim")
    forced = plan_error(backward, family=_lib.FAMILY_CODES["sm80"], headdim=left_out[0])
    assert f"head dim {left_out[0]} runs in the {left_out[0]} kernels" in str(forced)
    assert "SAMATTN_ATTENTION_HEAD_DIMS = " in str(forced)


@needs_attention
def test_the_size_checks_come_first():
    assert "headdim must be in 1..256" in str(plan_error(headdim=300))


# ------------------------------------------------ the sm90 attention ----
HOPPER = (9, 0)
needs_sm90_attention = pytest.mark.skipif(
    "attention" not in _lib.built_ops() or not {"sm80", "sm90"} <= set(samattn.built_families()),
    reason="needs the attention ops of the sm80 and sm90 families",
)
SM90 = _lib.FAMILY_CODES["sm90"]


def hopper_plan(backward=False, **changes):
    # A d = 128 prefill (not decode-shaped: 128 queries x 2 heads per KV head), contiguous
    # and 16-byte aligned: what the sm90 forward is for.
    d, h, hk, sq, sk = 128, 4, 2, 128, 256
    sizes = dict(seqlen_q=sq, seqlen_k=sk, lse_batch_stride=h * sq, lse_head_stride=sq,
                 headdim=d, q_head_stride=d, k_head_stride=d, v_head_stride=d, o_head_stride=d,
                 q_seq_stride=h * d, k_seq_stride=hk * d, v_seq_stride=hk * d, o_seq_stride=h * d,
                 q_batch_stride=sq * h * d, k_batch_stride=sk * hk * d,
                 v_batch_stride=sk * hk * d, o_batch_stride=sq * h * d)  # fmt: skip
    if backward:
        # The gradients laid out as their inputs (dout as out).
        for grad, like in (("dout", "o"), ("dq", "q"), ("dk", "k"), ("dv", "v")):
            for stride in ("batch", "seq", "head"):
                sizes[f"{grad}_{stride}_stride"] = sizes[f"{like}_{stride}_stride"]
    return plan(backward, cc=HOPPER, **{**sizes, **changes})[0]


@needs_sm90_attention
@pytest.mark.parametrize("dtype", [_lib.F16, _lib.BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("family", [_lib.FAMILY_AUTO, SM90], ids=["auto", "forced"])
def test_hopper_runs_the_sm90_forward(dtype, family):
    assert hopper_plan(dtype=dtype, family=family) == "sm90"


@needs_sm90_attention
@pytest.mark.parametrize("dtype", [_lib.F16, _lib.BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("family", [_lib.FAMILY_AUTO, SM90], ids=["auto", "forced"])
@pytest.mark.parametrize(
    "changes", [{}, dict(deterministic=1), dict(softcap=20.0)], ids=["plain", "det", "softcap"]
)
def test_hopper_runs_the_sm90_backward(dtype, family, changes):
    assert hopper_plan(backward=True, dtype=dtype, family=family, **changes) == "sm90"


@needs_sm90_attention
@pytest.mark.parametrize("d", [200, 256])
def test_hopper_runs_the_sm90_backward_at_head_dim_256(d):
    # Head dims 193-256 run the tile of 64 keys whose consumers split the work by role.
    try:
        assert hopper_plan(backward=True, **dims(d)) == "sm90"
    except _lib.UnsupportedError as error:
        if "which this build left out" not in str(error):
            raise
        pytest.skip("head dim 256 not built")


def dims(d):
    """A head dim with every tensor's head stride to match."""
    names = ("q", "k", "v", "o", "dout", "dq", "dk", "dv")
    return dict(headdim=d, **{f"{name}_head_stride": d for name in names})


@needs_sm90_attention
@pytest.mark.parametrize(
    "changes",
    [dims(96), dims(100), dims(192)],
    ids=["d96", "d100", "d192"],
)
def test_the_backwards_sm90_declines_run_on_sm80(changes):
    # sm90's backward registration names sm80 as its forced fallback, so that these run
    # with sm90 forced too.
    try:
        assert hopper_plan(backward=True, **changes) == "sm80"
    except _lib.UnsupportedError as error:
        if "which this build left out" not in str(error):
            raise
        pytest.skip(f"head dim {changes['headdim']} not built")
    assert hopper_plan(backward=True, family=SM90, **changes) == "sm80"


@needs_sm90_attention
def test_forced_sm90_hands_what_its_forward_declines_to_sm80():
    # A head dim that is not a multiple of 8 has no 16-byte rows for TMA: sm80 runs it.
    odd = dict(headdim=100, q_head_stride=100, k_head_stride=100, v_head_stride=100,
               o_head_stride=100)  # fmt: skip
    assert hopper_plan(**odd) == "sm80"
    assert hopper_plan(family=SM90, **odd) == "sm80"


@needs_sm90_attention
def test_a_forced_sm90_on_another_gpu_says_so():
    error = plan_error(family=SM90, cc=SM80)
    assert isinstance(error, _lib.UnsupportedError)
    assert "family sm90 cannot run on" in str(error)


# ---------------------------------------------------- window normalization ----
def window(sq, sk, left=-1, right=-1, causal=0, **changes):
    return plan(seqlen_q=sq, seqlen_k=sk, window_left=left, window_right=right, causal=causal,
                **changes)[1]  # fmt: skip


@needs_attention
@pytest.mark.parametrize(
    "sq, sk, left, right, causal, expected",
    [
        (16, 32, -1, -1, 0, (-1, -1)),
        (16, 32, -5, -7, 0, (-1, -1)),  # any negative bound is unbounded
        # Right bound: unbounded exactly when row 0 reaches the last key (right >= sq - 1).
        (16, 32, -1, 15, 0, (-1, -1)),
        (16, 32, -1, 14, 0, (-1, 14)),
        # More queries than keys: flash-attn would drop a right bound >= sk; samattn keeps it
        # while some row is still limited by it.
        (64, 16, -1, 16, 0, (-1, 16)),
        (64, 16, -1, 62, 0, (-1, 62)),
        (64, 16, -1, 63, 0, (-1, -1)),
        # Left bound: unbounded exactly when the last row reaches key 0 (left >= sk - 1).
        (16, 32, 31, -1, 0, (-1, -1)),
        (16, 32, 30, -1, 0, (30, -1)),
        (64, 16, 15, -1, 0, (-1, -1)),
        (64, 16, 14, -1, 0, (14, -1)),
        # Causal is right = 0, unbounded only for a single query row.
        (16, 32, -1, -1, 1, (-1, 0)),
        (16, 32, 3, 9, 1, (3, 0)),
        (1, 32, -1, -1, 1, (-1, -1)),
        (64, 16, -1, -1, 1, (-1, 0)),
    ],
)
def test_window_normalization(sq, sk, left, right, causal, expected):
    # The plan checks sizes, not pointers or strides.
    assert window(sq, sk, left, right, causal) == expected


@needs_attention
def test_varlen_windows_use_the_longest_sequences():
    varlen = dict(cu_seqlens_q=0x10000, cu_seqlens_k=0x10000, max_seqlen_q=10, max_seqlen_k=20)
    assert window(100, 200, 19, 9, **varlen) == (-1, -1)
    assert window(100, 200, 18, 8, **varlen) == (18, 8)


# ------------------------------------------------------------ gemm plans ----
def test_forced_sm90_gemm_hands_what_tma_cannot_describe_to_sm80():
    # The sm90 GEMM's registration names sm80 as its forced fallback (so that forcing sm90
    # runs any shape), as sm90's attention does (test_forced_sm90_hands_what_its_forward...);
    # the sm75 and sm80 attention have none (test_a_forced_family_that_declines...).
    odd = dict(m=4096, n=4096, k=4096, a_row_stride=4097)
    auto_family, auto_text = _lib.gemm_plan(gemm_args(**odd), (9, 0), 132)
    assert auto_family == "sm80" and auto_text.startswith("sm90 cannot run it: ")
    forced = gemm_args(**odd, family=_lib.FAMILY_CODES["sm90"])
    assert _lib.gemm_plan(forced, (9, 0), 132) == (auto_family, auto_text)
