"""ctypes binding of libsamattn, the C-ABI library that holds the kernels.

The library is loaded lazily, by absolute path, from ``samattn/lib/libsamattn.so``
(where the wheel installs it) or from ``$SAMATTN_LIBRARY`` (development builds).
Every struct and signature here mirrors ``cpp/include/samattn/samattn.h``.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from pathlib import Path
from typing import TypeVar

ABI_VERSION = 6

# Status codes.
OK = 0
INVALID_ARGUMENT = 1
UNSUPPORTED = 2
CUDA_ERROR = 3
NEEDS_WORKSPACE = 4

# Element types.
F16 = 0
BF16 = 1
F32 = 2
# fp8 KV caches only (AttentionArgs.kv_fp8): float8_e4m3fn (largest finite 448) and
# float8_e5m2 (largest finite 57344).
F8_E4M3 = 4
F8_E5M2 = 5

# SAMATTN_ACTIVATION_*: the GEMM epilogue's activation.
ACTIVATION_CODES = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}
# SAMATTN_SPLIT_K_*: how a GEMM split along K adds its partial sums.
SPLIT_K_MODE_CODES = {"auto": 0, "serial": 1, "parallel": 2}
MAX_SPLIT_K = 64
# SAMATTN_GROUP_*: how a grouped GEMM's offsets divide it, or a list of GEMMs.
GROUP_NONE, GROUP_ROWS, GROUP_K, GROUP_LIST = 0, 1, 2, 3
BOOL = 3  # attention masks only

# Kernel families.
FAMILY_AUTO = 0
FAMILY_CODES = {"sm75": 75, "sm80": 80, "sm90": 90}
FAMILY_NAMES = {code: name for name, code in FAMILY_CODES.items()}
FAMILY_BITS = {"sm75": 1, "sm80": 2, "sm90": 4}

# Ops, for family selection queries.
OP_GEMM = 0
OP_SOFTMAX = 1
OP_ATTENTION = 2
OP_CODES = {"gemm": OP_GEMM, "softmax": OP_SOFTMAX, "attention": OP_ATTENTION}

LIBRARY_ENV = "SAMATTN_LIBRARY"
PACKAGED_LIBRARY = Path(__file__).resolve().parent / "lib" / "libsamattn.so"


class ArgumentError(ValueError, RuntimeError):
    """An argument's value, shape, stride, device or layout is invalid; the message names it.

    Both a ValueError and a RuntimeError: ``except ValueError`` catches it, and so does
    ``except RuntimeError`` in code written for flash-attn, whose checks raise RuntimeError.
    A wrong type or dtype is a TypeError instead.
    """


class UnsupportedError(RuntimeError):
    """The arguments are valid, but this GPU, kernel family or build cannot run them."""


class LibraryError(ImportError):
    """libsamattn could not be found or loaded."""


class _Args(ctypes.Structure):
    """An argument struct of samattn.h: its first field is its own size, set here, so that
    the library can tell which ABI the caller was built for (see samattn.h)."""

    def __init__(self, *args: object, **fields: object) -> None:
        super().__init__(*args, **fields)
        if "struct_size" not in fields:
            self.struct_size = ctypes.sizeof(self)


class GemmArgs(_Args):
    _fields_ = [
        ("struct_size", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("family", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("allow_tf32", ctypes.c_int32),
        ("batch", ctypes.c_int64),
        ("m", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("a", ctypes.c_void_p),
        ("a_batch_stride", ctypes.c_int64),
        ("a_row_stride", ctypes.c_int64),
        ("a_col_stride", ctypes.c_int64),
        ("b", ctypes.c_void_p),
        ("b_batch_stride", ctypes.c_int64),
        ("b_row_stride", ctypes.c_int64),
        ("b_col_stride", ctypes.c_int64),
        ("c", ctypes.c_void_p),
        ("c_batch_stride", ctypes.c_int64),
        ("c_row_stride", ctypes.c_int64),
        ("c_col_stride", ctypes.c_int64),
        ("d", ctypes.c_void_p),
        ("d_batch_stride", ctypes.c_int64),
        ("d_row_stride", ctypes.c_int64),
        ("d_col_stride", ctypes.c_int64),
        ("alpha", ctypes.c_float),
        ("beta", ctypes.c_float),
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_int64),
        ("bias", ctypes.c_void_p),
        ("activation", ctypes.c_int32),
        ("output_fp32", ctypes.c_int32),
        ("split_k", ctypes.c_int32),
        ("split_k_mode", ctypes.c_int32),
        ("group_offsets", ctypes.c_void_p),
        ("group_mode", ctypes.c_int32),
        ("group_reserved", ctypes.c_int32),
        ("group_list", ctypes.c_void_p),
    ]


class GemmListEntry(ctypes.Structure):
    _fields_ = [
        ("m", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("a", ctypes.c_void_p),
        ("a_row_stride", ctypes.c_int64),
        ("a_col_stride", ctypes.c_int64),
        ("b", ctypes.c_void_p),
        ("b_row_stride", ctypes.c_int64),
        ("b_col_stride", ctypes.c_int64),
        ("d", ctypes.c_void_p),
        ("d_row_stride", ctypes.c_int64),
        ("d_col_stride", ctypes.c_int64),
    ]


class SoftmaxArgs(_Args):
    _fields_ = [
        ("struct_size", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("family", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("outer", ctypes.c_int64),
        ("dim", ctypes.c_int64),
        ("inner", ctypes.c_int64),
        ("x", ctypes.c_void_p),
        ("dy", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),
    ]


class AttentionArgs(_Args):
    """samattn_attention_args; the dout/dq/dk/dv fields and `deterministic` are the
    backward's, the fields after `workspace_bytes` the KV cache's (forward only), then the
    score terms (ALiBi and attention sinks; dsinks is the backward's), the attention
    mask (dmask is the backward's), dropout and the fp8 KV caches' fields.

    Built with the constructor, k_scale_value and v_scale_value default to 1.0 (the
    header's value for calls without fp8 caches); the eager path packs every field itself."""

    _fields_ = [
        ("struct_size", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("family", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("causal", ctypes.c_int32),
        ("batch", ctypes.c_int64),
        ("nheads", ctypes.c_int64),
        ("nheads_k", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("seqlen_k", ctypes.c_int64),
        ("headdim", ctypes.c_int64),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("max_seqlen_q", ctypes.c_int64),
        ("max_seqlen_k", ctypes.c_int64),
        ("q", ctypes.c_void_p),
        ("q_batch_stride", ctypes.c_int64),
        ("q_seq_stride", ctypes.c_int64),
        ("q_head_stride", ctypes.c_int64),
        ("k", ctypes.c_void_p),
        ("k_batch_stride", ctypes.c_int64),
        ("k_seq_stride", ctypes.c_int64),
        ("k_head_stride", ctypes.c_int64),
        ("v", ctypes.c_void_p),
        ("v_batch_stride", ctypes.c_int64),
        ("v_seq_stride", ctypes.c_int64),
        ("v_head_stride", ctypes.c_int64),
        ("o", ctypes.c_void_p),
        ("o_batch_stride", ctypes.c_int64),
        ("o_seq_stride", ctypes.c_int64),
        ("o_head_stride", ctypes.c_int64),
        ("lse", ctypes.c_void_p),
        ("lse_batch_stride", ctypes.c_int64),
        ("lse_head_stride", ctypes.c_int64),
        ("lse_seq_stride", ctypes.c_int64),
        ("softmax_scale", ctypes.c_float),
        ("softcap", ctypes.c_float),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("dout", ctypes.c_void_p),
        ("dout_batch_stride", ctypes.c_int64),
        ("dout_seq_stride", ctypes.c_int64),
        ("dout_head_stride", ctypes.c_int64),
        ("dq", ctypes.c_void_p),
        ("dq_batch_stride", ctypes.c_int64),
        ("dq_seq_stride", ctypes.c_int64),
        ("dq_head_stride", ctypes.c_int64),
        ("dk", ctypes.c_void_p),
        ("dk_batch_stride", ctypes.c_int64),
        ("dk_seq_stride", ctypes.c_int64),
        ("dk_head_stride", ctypes.c_int64),
        ("dv", ctypes.c_void_p),
        ("dv_batch_stride", ctypes.c_int64),
        ("dv_seq_stride", ctypes.c_int64),
        ("dv_head_stride", ctypes.c_int64),
        ("deterministic", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_int64),
        # Inference (ABI 5): the KV cache, forward only; all NULL / 0 = off.
        ("seqused_k", ctypes.c_void_p),
        ("leftpad_k", ctypes.c_void_p),
        ("kv_batch_idx", ctypes.c_void_p),
        ("block_table", ctypes.c_void_p),
        ("block_table_batch_stride", ctypes.c_int64),
        ("block_table_width", ctypes.c_int64),
        ("page_size", ctypes.c_int64),
        ("kv_cache_batch", ctypes.c_int64),
        ("k_new", ctypes.c_void_p),
        ("k_new_batch_stride", ctypes.c_int64),
        ("k_new_seq_stride", ctypes.c_int64),
        ("k_new_head_stride", ctypes.c_int64),
        ("v_new", ctypes.c_void_p),
        ("v_new_batch_stride", ctypes.c_int64),
        ("v_new_seq_stride", ctypes.c_int64),
        ("v_new_head_stride", ctypes.c_int64),
        ("seqlen_new", ctypes.c_int64),
        ("rotary_cos", ctypes.c_void_p),
        ("rotary_sin", ctypes.c_void_p),
        ("rotary_dim", ctypes.c_int64),
        ("rotary_seqlen", ctypes.c_int64),
        ("rotary_interleaved", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
        # Score terms (ABI 6), forward and backward; NULL = off.
        ("alibi_slopes", ctypes.c_void_p),
        ("alibi_batch_stride", ctypes.c_int64),
        ("sinks", ctypes.c_void_p),
        ("dsinks", ctypes.c_void_p),
        # attn_mask (ABI 6), fixed length only; NULL = no mask (the other fields ignored).
        ("attn_mask", ctypes.c_void_p),
        ("mask_dtype", ctypes.c_int32),
        ("mask_reserved", ctypes.c_int32),
        ("mask_batch_stride", ctypes.c_int64),
        ("mask_head_stride", ctypes.c_int64),
        ("mask_q_stride", ctypes.c_int64),
        ("mask_k_stride", ctypes.c_int64),
        ("dmask", ctypes.c_void_p),
        # Dropout (appended to ABI 6): dropout_p in [0, 1), 0 = off; dropout_seed the
        # device pointer of the call's 64-bit seed.
        ("dropout_p", ctypes.c_float),
        ("dropout_reserved", ctypes.c_int32),
        ("dropout_seed", ctypes.c_void_p),
        # fp8 KV caches (appended to ABI 6): kv_fp8 0, or F8_E4M3 / F8_E5M2 for caches of
        # that dtype; each scale read from its fp32 device pointer (element
        # h * kv_scale_head_stride for KV head h), or from its value where the pointer is
        # NULL. Calls without fp8 caches: 0, NULL, values 1.0.
        ("kv_fp8", ctypes.c_int32),
        ("kv_fp8_reserved", ctypes.c_int32),
        ("k_scale_ptr", ctypes.c_void_p),
        ("v_scale_ptr", ctypes.c_void_p),
        ("kv_scale_head_stride", ctypes.c_int64),
        ("k_scale_value", ctypes.c_float),
        ("v_scale_value", ctypes.c_float),
    ]

    def __init__(self, *args: object, **fields: object) -> None:
        super().__init__(*args, **fields)
        for name in ("k_scale_value", "v_scale_value"):
            if name not in fields:
                setattr(self, name, 1.0)


ArgsT = TypeVar("ArgsT", bound=ctypes.Structure)


def blank(cls: type[ArgsT]) -> ArgsT:
    """A zeroed argument struct, skipping the constructor: for the eager path, which packs
    every field itself (struct_size included) and counts every microsecond."""
    return cls.__new__(cls)


_STRUCT_CODES = {
    ctypes.c_int32: "i",
    ctypes.c_int64: "q",
    ctypes.c_void_p: "P",
    ctypes.c_float: "f",
}


def packer(cls: type[ctypes.Structure]) -> struct.Struct:
    """A packer that writes every field of `cls` in one call, in field order, with the C
    layout (native alignment): several times cheaper per call than setting the fields
    one by one, which matters on the eager path."""
    layout = struct.Struct("@" + "".join(_STRUCT_CODES[ctype] for _, ctype in cls._fields_))
    assert layout.size <= ctypes.sizeof(cls), cls
    return layout


GEMM_PACKER = packer(GemmArgs)
SOFTMAX_PACKER = packer(SoftmaxArgs)
ATTENTION_PACKER = packer(AttentionArgs)
LIST_ENTRY_PACKER = packer(GemmListEntry)

_i32 = ctypes.c_int32
_i32_p = ctypes.POINTER(ctypes.c_int32)
_ptr = ctypes.c_void_p

# name -> (restype, argtypes), one entry per function of samattn.h.
SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "samattn_gemm": (ctypes.c_int, [ctypes.POINTER(GemmArgs), _i32_p]),
    "samattn_gemm_workspace_size": (
        ctypes.c_int,
        [ctypes.POINTER(GemmArgs), ctypes.POINTER(ctypes.c_int64)],
    ),
    "samattn_gemm_plan": (
        ctypes.c_int,
        [ctypes.POINTER(GemmArgs), _i32, _i32, _i32, _i32_p, ctypes.c_char_p, _i32],
    ),
    "samattn_softmax_forward": (ctypes.c_int, [ctypes.POINTER(SoftmaxArgs), _i32_p]),
    "samattn_softmax_backward": (ctypes.c_int, [ctypes.POINTER(SoftmaxArgs), _i32_p]),
    # The repeated calls take a prepared struct's address and pointers as integers.
    "samattn_gemm_with_pointers": (ctypes.c_int, [_ptr] * 7 + [ctypes.c_int64, _i32_p]),
    "samattn_softmax_forward_with_pointers": (ctypes.c_int, [_ptr] * 5 + [_i32_p]),
    "samattn_softmax_backward_with_pointers": (ctypes.c_int, [_ptr] * 5 + [_i32_p]),
    "samattn_attention_forward": (ctypes.c_int, [ctypes.POINTER(AttentionArgs), _i32_p]),
    "samattn_attention_forward_workspace_size": (
        ctypes.c_int,
        [ctypes.POINTER(AttentionArgs), ctypes.POINTER(ctypes.c_int64)],
    ),
    "samattn_attention_backward": (ctypes.c_int, [ctypes.POINTER(AttentionArgs), _i32_p]),
    "samattn_attention_backward_workspace_size": (
        ctypes.c_int,
        [ctypes.POINTER(AttentionArgs), ctypes.POINTER(ctypes.c_int64)],
    ),
    "samattn_attention_plan": (
        ctypes.c_int,
        [ctypes.POINTER(AttentionArgs), _i32, _i32, _i32, _i32, _i32_p, ctypes.c_char_p, _i32],
    ),
    "samattn_last_error": (ctypes.c_char_p, []),
    "samattn_version": (ctypes.c_char_p, []),
    "samattn_abi_version": (_i32, []),
    "samattn_built_families": (_i32, []),
    "samattn_built_ops": (_i32, []),
    "samattn_select_family": (ctypes.c_int, [_i32, _i32, _i32, _i32, _i32, _i32, _i32_p]),
    "samattn_device_properties": (
        ctypes.c_int,
        [_i32, ctypes.c_char_p, _i32, _i32_p, _i32_p, _i32_p],
    ),
    "samattn_cuda_versions": (ctypes.c_int, [_i32_p, _i32_p]),
}

_load_lock = threading.Lock()
_library: ctypes.CDLL | None = None


class _ThreadState(threading.local):
    """Each thread's out-parameter for the family an op ran. The library writes it on every
    op call (FAMILY_AUTO when nothing ran), so it is also the thread's last family."""

    def __init__(self) -> None:
        self.family = ctypes.c_int32(FAMILY_AUTO)
        self.family_ref = ctypes.byref(self.family)


_thread_state = _ThreadState()
# The same, for the prepared calls' hot path: `thread_state.family_ref` without a call.
thread_state = _thread_state


def family_out():  # a ctypes byref, which has no public type
    """This thread's family out-parameter, for the `family_used` of an op call."""
    return _thread_state.family_ref


def library_path() -> Path:
    """The absolute path libsamattn is loaded from ($SAMATTN_LIBRARY or the package's copy)."""
    override = os.environ.get(LIBRARY_ENV, "")
    return Path(override).resolve() if override else PACKAGED_LIBRARY


def lib() -> ctypes.CDLL:
    """The loaded library, with every signature declared; raises LibraryError if unusable."""
    global _library
    if _library is not None:
        return _library
    with _load_lock:
        if _library is None:
            _library = _load(library_path())
    return _library


def _load(path: Path) -> ctypes.CDLL:
    how_to_build = (
        "Build it from a clone of samattn: `./setup.sh && .venv/bin/nox -s tests` builds a "
        "wheel and installs it into .venv (see the README), or build the library alone "
        "(cmake -S . -B build -G Ninja && ninja -C build) and set "
        f"{LIBRARY_ENV}=/abs/path/to/build/libsamattn.so. Prebuilt wheels (samattn-cu124 to "
        "samattn-cu130) are not published yet."
    )
    if not path.is_file():
        raise LibraryError(f"samattn: the library {path} does not exist. {how_to_build}")
    try:
        handle = ctypes.CDLL(str(path))
    except OSError as error:
        raise LibraryError(f"samattn: cannot load {path}: {error}. {how_to_build}") from error
    for name, (restype, argtypes) in SIGNATURES.items():
        try:
            function = getattr(handle, name)
        except AttributeError as error:
            raise LibraryError(
                f"samattn: {path} does not export {name}; it is not a matching libsamattn. "
                f"{how_to_build}"
            ) from error
        function.restype = restype
        function.argtypes = argtypes
    abi = handle.samattn_abi_version()
    if abi != ABI_VERSION:
        raise LibraryError(
            f"samattn: {path} has C ABI version {abi}, this Python package needs {ABI_VERSION}. "
            f"{how_to_build}"
        )
    return handle


def last_error() -> str:
    """The library's message for the last failure on this thread."""
    message = lib().samattn_last_error()
    return message.decode("utf-8", "replace") if message else ""


def check(status: int) -> None:
    """Raise ArgumentError, UnsupportedError or RuntimeError for a failed library status."""
    if status == OK:
        return
    message = last_error() or f"samattn: the library returned status {status}"
    if status in (INVALID_ARGUMENT, NEEDS_WORKSPACE):
        raise ArgumentError(message)
    if status == UNSUPPORTED:
        raise UnsupportedError(message)
    raise RuntimeError(message)


def set_last_family(code: int) -> None:
    _thread_state.family.value = code


def last_family() -> str | None:
    """The family ("sm75", "sm80", "sm90") that ran this thread's last op call, or None (no
    call yet, the call launched nothing, or it failed)."""
    return FAMILY_NAMES.get(_thread_state.family.value)


def version() -> str:
    return lib().samattn_version().decode()


def built_families() -> list[str]:
    mask = lib().samattn_built_families()
    return [name for name, bit in FAMILY_BITS.items() if mask & bit]


def built_ops() -> list[str]:
    mask = lib().samattn_built_ops()
    return [name for name, code in OP_CODES.items() if mask & (1 << code)]


def select_family(
    op: str, dtype_code: int, cc: tuple[int, int], requested: int, allow_tf32: bool
) -> str:
    """The family that would run `op` on a GPU of compute capability `cc` (raises if none)."""
    family = ctypes.c_int32(0)
    status = lib().samattn_select_family(
        OP_CODES[op], dtype_code, cc[0], cc[1], requested, int(allow_tf32), ctypes.byref(family)
    )
    check(status)
    return FAMILY_NAMES[family.value]


def gemm_plan(args: GemmArgs, cc: tuple[int, int], sm_count: int) -> tuple[str, str]:
    """(family, configuration) samattn_gemm would use for `args` on such a GPU; no GPU needed.

    The configuration reads "tile=... swizzle=... transposed=..." for the sm90 family
    (then " split_k=N serial" for a forced split), "sm90 cannot run it: <reason>" when
    sm90 handed the problem to sm80, and "split_k=N parallel" when the sm80 or sm75
    family splits K (after a "; " when both); else "".
    """
    family = ctypes.c_int32(0)
    text = ctypes.create_string_buffer(512)
    status = lib().samattn_gemm_plan(
        ctypes.byref(args), cc[0], cc[1], sm_count, ctypes.byref(family), text, len(text)
    )
    check(status)
    return FAMILY_NAMES[family.value], text.value.decode()


def attention_plan(
    args: AttentionArgs, backward: bool, cc: tuple[int, int], smem_per_block: int
) -> tuple[str, tuple[int, int]]:
    """(family, (window_left, window_right)) of an attention call on such a GPU; no GPU needed.

    The family is the one that would run after families whose plan declines the problem
    (head dim not built, no tile in `smem_per_block` bytes) fell through; the window is the
    one the kernels get after normalization, -1 meaning unbounded.
    """
    family = ctypes.c_int32(0)
    text = ctypes.create_string_buffer(128)
    status = lib().samattn_attention_plan(
        ctypes.byref(args), int(backward), cc[0], cc[1], smem_per_block,
        ctypes.byref(family), text, len(text),
    )  # fmt: skip
    check(status)
    fields = dict(item.split("=") for item in text.value.decode().split())
    return FAMILY_NAMES[family.value], (int(fields["window_left"]), int(fields["window_right"]))


def device_properties(device: int) -> dict[str, object]:
    """Name, compute capability and SM count of a CUDA ordinal (raises without a GPU)."""
    name = ctypes.create_string_buffer(256)
    major, minor, sms = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32()
    status = lib().samattn_device_properties(
        device, name, len(name), ctypes.byref(major), ctypes.byref(minor), ctypes.byref(sms)
    )
    check(status)
    return {
        "name": name.value.decode("utf-8", "replace"),
        "compute_capability": (major.value, minor.value),
        "sm_count": sms.value,
    }


def cuda_versions() -> tuple[int, int]:
    """(runtime, driver) as CUDA encodes them (12040 = 12.4); driver 0 means none installed."""
    runtime, driver = ctypes.c_int32(), ctypes.c_int32()
    check(lib().samattn_cuda_versions(ctypes.byref(runtime), ctypes.byref(driver)))
    return runtime.value, driver.value
