"""Kernel family override: ``samattn.use_family`` and ``samattn.built_families``."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from . import _lib


class _ThreadState(threading.local):
    """The family code each thread forces; the class attribute is a thread's default, so
    that reading it raises no AttributeError to catch (every eager call reads it)."""

    family: int = _lib.FAMILY_AUTO


_state = _ThreadState()
# The same, for the attention ops' prepared-call keys: `thread_state.family` reads what
# requested_family() returns without a Python call.
thread_state = _state


def requested_family() -> int:
    """The family code this thread forces (FAMILY_AUTO when none: the library decides)."""
    return _state.family


class use_family:
    """Force a kernel family for samattn ops run by this thread inside the block.

    ``name`` is ``"sm75"``, ``"sm80"``, ``"sm90"`` or ``None`` (automatic: the library picks
    the family from the GPU, or from the ``SAMATTN_FAMILY`` environment variable). Blocks
    nest and restore the outer choice on exit; other threads are not affected. A family that
    is not built, cannot run on the GPU, or lacks the op/dtype raises ``UnsupportedError``
    when an op runs. Autograd backward runs with the family of its forward (eager mode).

    Example::

        with samattn.use_family("sm75"):
            y = samattn.gemm(a, b)
    """

    def __init__(self, name: str | None) -> None:
        if name is None:
            self._code = _lib.FAMILY_AUTO
        elif isinstance(name, str) and name in _lib.FAMILY_CODES:
            self._code = _lib.FAMILY_CODES[name]
        else:
            allowed = ", ".join(repr(n) for n in _lib.FAMILY_CODES)
            raise _lib.ArgumentError(
                f"samattn.use_family: unknown family {name!r}; use {allowed} or None (automatic)"
            )
        self._saved: list[int] = []

    def __enter__(self) -> None:
        self._saved.append(requested_family())
        _state.family = self._code

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        _state.family = self._saved.pop()


class _forced_code:
    """Like use_family, from a family code (the backward pass replays its forward's choice)."""

    def __init__(self, code: int) -> None:
        self._code = code
        self._saved = _lib.FAMILY_AUTO

    def __enter__(self) -> None:
        self._saved = requested_family()
        _state.family = self._code

    def __exit__(self, *exc_info: object) -> None:
        _state.family = self._saved


def replays_family(backward: Callable[..., Any]) -> Callable[..., Any]:
    """An autograd backward that runs with its forward's family (``ctx.family``, a code)
    forced, as autograd runs it on a thread of its own; no context to enter when that
    thread already asks for that family (the usual case: none forced)."""

    @functools.wraps(backward)
    def run(ctx: Any, *grads: Any) -> Any:
        code = ctx.family
        if code == _state.family:
            return backward(ctx, *grads)
        with _forced_code(code):
            return backward(ctx, *grads)

    return run


def built_families() -> list[str]:
    """Kernel families compiled into the loaded library, oldest first, e.g. ``["sm75", "sm80"]``."""
    return _lib.built_families()
