"""Prepared eager calls: the C arguments of a call signature seen before, reused.

Everything an eager call does before its launch but allocate outputs and read pointers
depends only on its signature: the shapes, strides, dtypes and devices of its tensors, its
scalars, the family it forces. So once a call has gone the full way (``_checks``, then the
argument packing of ``_cuda``) and the library has run it, its argument struct is kept,
with the output shapes and the workspace the library asked for. A later call of the same
signature makes one C call: for gemm and softmax the op's ``*_with_pointers`` form, given
the kept struct's address and the call's pointers (the library copies the struct and
writes them in: on the H100 machine such a call of a stub took 1.0 us, against 2.3 us
with the struct copied and filled in Python first); for the others a Python copy of the
struct with its pointers, stream and workspace written in. No Python validation (its
signature passed it) and no refused call to learn the workspace size.

What makes this safe:

- A key holds every input the validation and the packing read: the scalars as the public
  function converted them (a ``True`` where a float is expected is refused before any key
  is made, so it never matches a cached ``1.0``). Calls with optional tensors (gemm's c,
  score terms, masks, varlen offsets) take the full path, except KV-cache calls, whose
  key holds the layout of every optional tensor (present or None); their integer values
  are checked as on the full path.
- Only signatures whose tensors were used in place are cached, so the cached strides are
  the tensors' own; what the kernels choose from pointers (16-byte vectors) the library
  decides on every call, as it does on the full path.
- The library validates and plans every call again; where the family it picks now (a
  changed ``SAMATTN_FAMILY``) needs a larger workspace, it says so and the call falls back
  to asking for the size, then updates the entry.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

import torch

from . import _lib

ArgsT = TypeVar("ArgsT", bound=ctypes.Structure)

# Signatures kept per op before the cache starts over: enough for every layer shape of a
# model, small enough that a sweep over shapes cannot grow it without bound.
MAX_ENTRIES = 512


# One empty tensor per (device, dtype): `new_empty` on it allocates an output of another
# dtype than the inputs' a few microseconds cheaper than `new_empty(shape, dtype=...)`,
# whose keyword costs more to parse than the allocation.
_PROTOTYPES: dict[tuple[int, torch.dtype], torch.Tensor] = {}


def empty(like: torch.Tensor, shape: tuple[int, ...] | int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor of `shape` and `dtype` on like's (CUDA) device, from torch's
    caching allocator."""
    key = (like.get_device(), dtype)
    prototype = _PROTOTYPES.get(key)
    if prototype is None:
        prototype = _PROTOTYPES[key] = like.new_empty(0, dtype=dtype)
    return prototype.new_empty(shape)


def run_with_workspace(
    function_name: str,
    size_function_name: str | None,
    args: ctypes.Structure,
    like: torch.Tensor,
    expected: bool = False,
    known_bytes: int = 0,
) -> int:
    """Call an op of the library that may answer NEEDS_WORKSPACE (nothing launched), and
    return the workspace bytes the call ran with. Most calls need none, so by default the
    size is asked only then and the call made again with one; `expected` (calls that
    usually need one: split-KV decode, KV caches) asks first, which saves the refused call;
    `known_bytes` gives the first call that much (a prepared call's last size). The size is
    asked at most once."""
    library = _lib.lib()
    function = getattr(library, function_name)
    args_ref = ctypes.byref(args)
    family = _lib.family_out()
    # The workspace tensor is kept alive until the launch is queued.
    asked = expected and size_function_name is not None
    if asked:
        workspace = _ask(library, size_function_name, args, like)
    else:
        workspace = _give(args, like, known_bytes) if known_bytes else None
    status = function(args_ref, family)
    if status == _lib.NEEDS_WORKSPACE and not asked and size_function_name is not None:
        workspace = _ask(library, size_function_name, args, like)
        status = function(args_ref, family)
    _lib.check(status)
    return args.workspace_bytes if workspace is not None else 0


# The library's functions by name, looked up once.
_BOUND: dict[str, Callable[..., int]] = {}


def bound(function_name: str) -> Callable[..., int]:
    """The library's function of that name (its signature declared by _lib)."""
    function = _BOUND.get(function_name)
    if function is None:
        function = _BOUND[function_name] = getattr(_lib.lib(), function_name)
    return function


def call_without_workspace(function_name: str, args: ctypes.Structure) -> bool:
    """One call of a library op with no workspace: True when it ran, False when it answered
    NEEDS_WORKSPACE (nothing launched); raises like the full path. Most prepared calls
    need none, and this saves run_with_workspace's general path (about 1.5 us, a tenth of
    a small eager call). The function bound before, the family out-parameter and the
    status read without a call each."""
    function = _BOUND.get(function_name) or bound(function_name)
    status = function(ctypes.byref(args), _lib.thread_state.family_ref)
    if status == _lib.OK:
        return True
    if status == _lib.NEEDS_WORKSPACE:
        return False
    _lib.check(status)
    return True


def _give(args: ctypes.Structure, like: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A workspace of nbytes, set in args. From torch's caching allocator: cheap,
    stream-ordered, 512-byte aligned and capturable in CUDA graphs; freed (stream-ordered)
    once the kernels are done."""
    workspace = empty(like, nbytes, torch.uint8)
    args.workspace, args.workspace_bytes = workspace.data_ptr(), nbytes
    return workspace


def _ask(
    library: ctypes.CDLL, size_function_name: str, args: ctypes.Structure, like: torch.Tensor
) -> torch.Tensor | None:
    """The workspace the library asks for these args (None: it needs none)."""
    needed = ctypes.c_int64(0)
    _lib.check(getattr(library, size_function_name)(ctypes.byref(args), ctypes.byref(needed)))
    return _give(args, like, needed.value) if needed.value > 0 else None


class Entry(NamedTuple):
    """A signature's argument struct (its pointers and stream to be overwritten, its
    workspace fields zero) and that struct's address, its output shapes, the workspace
    bytes the library took (0: none) and what else the op's prepared call needs (its
    checked sizes)."""

    template: ctypes.Structure  # never written after put: calls copy it or read it in C
    address: int
    out_shape: tuple[int, ...]
    aux_shape: tuple[int, ...]  # attention: softmax_lse's shape; () otherwise
    workspace: int
    sizes: object = None


class Calls(Generic[ArgsT]):
    """The prepared calls of one library entry point, and of its *_with_pointers form
    (samattn.h) where it has one: `with_pointers` is that function, which takes an
    entry's address and the call's pointers, so a call builds no struct."""

    def __init__(
        self,
        args_type: type[ArgsT],
        function: str,
        size_function: str | None,
        pointers_function: str | None = None,
    ) -> None:
        self.args_type = args_type
        self.function = function
        self.size_function = size_function
        self.pointers_function = pointers_function
        self.entries: dict[tuple, Entry] = {}
        # Bound by the first put (the library is loaded by then): a call that found an
        # entry calls it without a lookup.
        self.with_pointers: Callable[..., int] | None = None

    def get(self, key: tuple) -> Entry | None:
        return self.entries.get(key)

    def put(
        self,
        key: tuple,
        args: ArgsT,
        out_shape: tuple[int, ...],
        aux_shape: tuple[int, ...] = (),
        sizes: object = None,
    ) -> None:
        """Keep the struct of a call that has just run (its workspace fields tell the
        size the library took)."""
        if len(self.entries) >= MAX_ENTRIES:
            self.entries.clear()
        template = self.args_type.from_buffer_copy(args)
        workspace = 0
        if hasattr(template, "workspace"):
            # Never kept: a later call that runs without one must not pass this call's.
            workspace = template.workspace_bytes if template.workspace else 0
            template.workspace, template.workspace_bytes = None, 0
        if self.pointers_function is not None and self.with_pointers is None:
            self.with_pointers = bound(self.pointers_function)
        self.entries[key] = Entry(
            template, ctypes.addressof(template), tuple(out_shape), tuple(aux_shape),
            workspace, sizes,
        )  # fmt: skip

    def args(self, entry: Entry) -> ArgsT:
        """A private copy of the entry's struct, for this call to fill in."""
        return self.args_type.from_buffer_copy(entry.template)

    def run(
        self, key: tuple, entry: Entry, args: ArgsT, like: torch.Tensor, refused: bool = False
    ) -> None:
        """Call the library with `args` (pointers and stream set by the caller), with a
        workspace of the entry's size; keep the size the call ran with. Raises like the
        full path. `refused`: the caller's call without a workspace was answered
        NEEDS_WORKSPACE (e.g. a newly forced family needs one), so ask for its size first."""
        if entry.workspace == 0 and not refused:
            if call_without_workspace(self.function, args):
                return
            refused = True
        used = run_with_workspace(
            self.function, self.size_function, args, like, refused, entry.workspace
        )
        if used != entry.workspace:
            self.entries[key] = entry._replace(workspace=used)

    def clear(self) -> None:
        self.entries.clear()
