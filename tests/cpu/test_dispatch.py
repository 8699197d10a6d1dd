"""Family selection with a mocked compute capability, through the real C function
samattn_select_family. The expectations are written from docs/design.md section 2, not from the
C code, and adapt to the families and op groups this library was built with."""

from __future__ import annotations

import ctypes

import pytest

import samattn
from samattn import _lib

CCS = [(6, 1), (7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]
OPS = ["gemm", "softmax", "attention"]
DTYPES = {"float16": _lib.F16, "bfloat16": _lib.BF16, "float32": _lib.F32}
REQUESTS = [None, "sm75", "sm80", "sm90"]

_ALL = {"float16", "bfloat16", "float32"}
# Dtypes each family runs per op. sm75 runs fp32 exactly (no tf32 on Turing) and bf16 on
# FMA units; sm90 runs GEMM in fp16, bf16 and fp32 as tf32 only ("tf32"), and no softmax.
# Attention: fp16 and bf16 on sm80 and sm90, fp16 only on sm75 (no bf16 mma). The sm90
# attention is a forward on wgmma + TMA; its backward (and what its forward plan declines)
# runs sm80's kernels, which samattn_attention_plan shows (test_registry.py): selection by
# op group, as here, names sm90 for both directions.
HAS = {
    "gemm": {"sm75": _ALL, "sm80": _ALL, "sm90": {"float16", "bfloat16", "tf32"}},
    "softmax": {"sm75": _ALL, "sm80": _ALL, "sm90": set()},
    "attention": {
        "sm75": {"float16"},
        "sm80": {"float16", "bfloat16"},
        "sm90": {"float16", "bfloat16"},
    },
}


def runs(op, family, dtype, allow_tf32):
    dtypes = HAS[op][family]
    return dtype in dtypes or (dtype == "float32" and allow_tf32 and "tf32" in dtypes)


# Automatic choice in order of preference (a family later in the list is the fallback
# when an earlier one is not built or lacks the op/dtype). Newer GPUs run sm80 (its PTX).
AUTO_PREFERENCE = {
    (7, 5): ["sm75"],
    (8, 0): ["sm80", "sm75"],
    (8, 6): ["sm80", "sm75"],
    (8, 9): ["sm80", "sm75"],
    (9, 0): ["sm90", "sm80", "sm75"],
    (10, 0): ["sm80", "sm75"],
    (12, 0): ["sm80", "sm75"],
}
# Compute capabilities each family's code runs on (sm90 is sm_90a: Hopper 9.0 only).
RUNS_ON = {
    "sm75": lambda cc: cc >= (7, 5),
    "sm80": lambda cc: cc >= (8, 0),
    "sm90": lambda cc: cc == (9, 0),
}
NEWEST_FIRST = ["sm90", "sm80", "sm75"]


def select(op, dtype, cc, requested, allow_tf32=True):
    """(status, family or None, message) of samattn_select_family."""
    family = ctypes.c_int32(-1)
    code = _lib.FAMILY_AUTO if requested is None else _lib.FAMILY_CODES[requested]
    status = _lib.lib().samattn_select_family(
        _lib.OP_CODES[op], DTYPES[dtype], cc[0], cc[1], code, int(allow_tf32), ctypes.byref(family)
    )
    if status == _lib.OK:
        return status, _lib.FAMILY_NAMES[family.value], ""
    return status, None, _lib.last_error()


def usable(op, dtype, cc, allow_tf32=True):
    built = samattn.built_families()
    return [
        f for f in NEWEST_FIRST if f in built and RUNS_ON[f](cc) and runs(op, f, dtype, allow_tf32)
    ]


def expected_family(op, dtype, cc, requested, allow_tf32=True):
    """The family that must run, or None when the library must refuse (UNSUPPORTED)."""
    if cc < (7, 5) or op not in _lib.built_ops():
        return None
    if requested is None:
        built = samattn.built_families()
        return next(
            (f for f in AUTO_PREFERENCE[cc] if f in built and runs(op, f, dtype, allow_tf32)),
            None,
        )
    return requested if requested in usable(op, dtype, cc, allow_tf32) else None


def check_refusal(message, op, dtype, cc, family_text):
    for fragment in (f"samattn {op}", dtype, f"compute capability {cc[0]}.{cc[1]}", family_text):
        assert fragment in message, f"{fragment!r} not in {message!r}"


@pytest.mark.usefixtures("no_family_env")
@pytest.mark.parametrize("cc", CCS, ids=lambda cc: f"cc{cc[0]}{cc[1]}")
@pytest.mark.parametrize("requested", REQUESTS, ids=lambda r: r or "auto")
@pytest.mark.parametrize("op", OPS)
def test_selection(op, requested, cc):
    for dtype in DTYPES:
        for allow_tf32 in (True, False):
            status, family, message = select(op, dtype, cc, requested, allow_tf32)
            want = expected_family(op, dtype, cc, requested, allow_tf32)
            case = f"{op} {dtype} cc {cc} requested {requested} tf32 {allow_tf32}"
            if want is not None:
                assert (status, family) == (_lib.OK, want), f"{case}: {message}"
                continue
            assert status == _lib.UNSUPPORTED, f"{case}: status {status}, {family}, {message}"
            check_refusal(message, op, dtype, cc, f"family {requested or 'auto'}")
            if cc < (7, 5):
                assert "Turing (compute capability 7.5)" in message, message
            elif op not in _lib.built_ops():
                assert f"built without the {op} ops" in message, message
            elif requested is not None:
                names = ", ".join(usable(op, dtype, cc, allow_tf32)) or "none in this build"
                assert f"Families that can run it on this GPU: {names}." in message, message


def test_message_for_a_family_too_new_for_the_gpu(no_family_env):
    if not {"sm75", "sm80"} <= set(samattn.built_families()) or "gemm" not in _lib.built_ops():
        pytest.skip("needs sm75, sm80 and gemm in the build")
    status, _, message = select("gemm", "float16", (7, 5), "sm80")
    assert status == _lib.UNSUPPORTED
    assert message == (
        "samattn gemm (float16): family sm80 cannot run on a GPU of compute capability 7.5; "
        "it needs compute capability 8.0 or newer. Families that can run it on this GPU: sm75."
    )


@pytest.mark.parametrize("cc", [(7, 5), (9, 0)], ids=lambda cc: f"cc{cc[0]}{cc[1]}")
@pytest.mark.parametrize("requested", [None, "sm75"], ids=lambda r: r or "auto")
def test_bf16_attention_on_turing_says_it_needs_sm80(no_family_env, cc, requested):
    if "sm75" not in samattn.built_families() or "attention" not in _lib.built_ops():
        pytest.skip("needs sm75 and attention in the build")
    if requested is None and cc >= (8, 0):
        pytest.skip("automatic selection runs bf16 attention on sm80 or sm90 there")
    status, _, message = select("attention", "bfloat16", cc, requested)
    assert status == _lib.UNSUPPORTED
    hint = "bfloat16 attention needs compute capability 8.0 or newer (family sm80)"
    assert hint in message, message


def test_turing_fp32_gemm_is_exact_not_an_error(no_family_env):
    if "sm75" not in samattn.built_families() or "gemm" not in _lib.built_ops():
        pytest.skip("needs sm75 and gemm in the build")
    assert select("gemm", "float32", (7, 5), "sm75", allow_tf32=True)[:2] == (_lib.OK, "sm75")


@pytest.mark.parametrize("env", ["sm75", "sm80", "sm90"])
@pytest.mark.parametrize("cc", [(7, 5), (8, 6), (9, 0), (12, 0)], ids=str)
def test_env_forces_a_family(monkeypatch, env, cc):
    monkeypatch.setenv("SAMATTN_FAMILY", env)
    for op in OPS:
        for dtype in DTYPES:
            status, family, message = select(op, dtype, cc, None)
            want = expected_family(op, dtype, cc, env)
            if want is not None:
                assert (status, family) == (_lib.OK, env), message
            else:
                assert status == _lib.UNSUPPORTED
                check_refusal(message, op, dtype, cc, f"family {env} (from SAMATTN_FAMILY)")


def test_empty_env_means_auto(monkeypatch):
    monkeypatch.setenv("SAMATTN_FAMILY", "")
    for cc in CCS:
        assert select("gemm", "float16", cc, None)[1] == expected_family(
            "gemm", "float16", cc, None
        )


@pytest.mark.parametrize("value", ["sm70", "SM80", "auto", " sm80", "80", "sm80,sm75"])
@pytest.mark.parametrize("cc", [(6, 1), (8, 0)], ids=str)
def test_env_invalid_value(monkeypatch, value, cc):
    monkeypatch.setenv("SAMATTN_FAMILY", value)
    status, _, message = select("softmax", "bfloat16", cc, None)
    assert status == _lib.INVALID_ARGUMENT
    assert f"SAMATTN_FAMILY='{value}'" in message
    assert "sm75, sm80 or sm90" in message


def test_explicit_request_overrides_env(monkeypatch):
    monkeypatch.setenv("SAMATTN_FAMILY", "bogus")
    for requested in ("sm75", "sm80", "sm90"):
        status, family, _ = select("gemm", "float16", (8, 0), requested)
        assert status != _lib.INVALID_ARGUMENT
        assert family == expected_family("gemm", "float16", (8, 0), requested)


def test_python_helper_raises_the_mapped_errors(no_family_env):
    with pytest.raises(samattn.UnsupportedError, match=r"compute capability 6\.1"):
        _lib.select_family("gemm", _lib.F16, (6, 1), _lib.FAMILY_AUTO, True)
    with pytest.raises(ValueError, match="unknown family code 70"):
        _lib.select_family("gemm", _lib.F16, (8, 0), 70, True)
