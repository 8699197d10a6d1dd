"""Prepared eager calls: the C arguments of a call signature seen before, reused.

Everything an eager call does before its launch but allocate outputs and read pointers
depends only on its signature: the shapes, strides, dtypes and devices of its tensors, its
scalars, the family it forces. So once a call has gone the full way (``_checks``, then the
argument packing of ``_cuda``) and the library has run it, its argument struct is kept,
with the output shapes and the workspace the library asked for. A later call of the same
signature copies that struct, writes its own pointers, stream and workspace into it and
makes one C call: no Python validation (its signature passed it) and no refused call to
learn the workspace size.

What makes this safe:

- A key holds every input the validation and the packing read: the scalars as the public
  function converted them (a ``True`` where a float is expected is refused before any key
  is made, so it never matches a cached ``1.0``). Calls with optional tensors (gemm's c,
  score terms, masks, varlen offsets, KV caches) take the full path.
- Only signatures whose tensors were used in place are cached, so the cached strides are
  the tensors' own; what the kernels choose from pointers (16-byte vectors) the library
  decides on every call, as it does on the full path.
- The library validates and plans every call again; where the family it picks now (a
  changed ``SAMATTN_FAMILY``) needs a larger workspace, it says so and the call falls back
  to asking for the size, then updates the entry.
"""

from __future__ import annotations

import ctypes
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


class Entry(NamedTuple):
    """A signature's argument struct (its pointers and stream to be overwritten, its
    workspace fields zero), its output shapes and the workspace bytes the library took
    (0: none)."""

    template: bytes
    out_shape: tuple[int, ...]
    aux_shape: tuple[int, ...]  # attention: softmax_lse's shape; () otherwise
    workspace: int


class Calls(Generic[ArgsT]):
    """The prepared calls of one library entry point."""

    def __init__(self, args_type: type[ArgsT], function: str, size_function: str | None) -> None:
        self.args_type = args_type
        self.function = function
        self.size_function = size_function
        self.entries: dict[tuple, Entry] = {}

    def get(self, key: tuple) -> Entry | None:
        return self.entries.get(key)

    def put(
        self,
        key: tuple,
        args: ArgsT,
        out_shape: tuple[int, ...],
        aux_shape: tuple[int, ...] = (),
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
        self.entries[key] = Entry(bytes(template), tuple(out_shape), tuple(aux_shape), workspace)

    def args(self, entry: Entry) -> ArgsT:
        """A private copy of the entry's struct, for this call to fill in."""
        return self.args_type.from_buffer_copy(entry.template)

    def run(self, key: tuple, entry: Entry, args: ArgsT, like: torch.Tensor) -> None:
        """Call the library with `args` (pointers and stream set by the caller), with a
        workspace of the entry's size from torch's caching allocator. Raises like the full
        path."""
        workspace = None  # alive until the launch is queued
        if entry.workspace:
            workspace = empty(like, entry.workspace, torch.uint8)
            args.workspace, args.workspace_bytes = workspace.data_ptr(), entry.workspace
        library = _lib.lib()
        family = ctypes.c_int32()
        status = getattr(library, self.function)(ctypes.byref(args), ctypes.byref(family))
        if status == _lib.NEEDS_WORKSPACE and self.size_function is not None:
            needed = ctypes.c_int64(0)
            size_query = getattr(library, self.size_function)
            _lib.check(size_query(ctypes.byref(args), ctypes.byref(needed)))
            workspace = empty(like, needed.value, torch.uint8)
            args.workspace, args.workspace_bytes = workspace.data_ptr(), needed.value
            status = getattr(library, self.function)(ctypes.byref(args), ctypes.byref(family))
            if status == _lib.OK:
                self.entries[key] = entry._replace(workspace=needed.value)
        _lib.check(status)
        _lib.set_last_family(family.value)

    def clear(self) -> None:
        self.entries.clear()
