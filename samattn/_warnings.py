"""Warnings shown once per process: samattn's fallbacks to torch (samattn.attention,
samattn.integrations) say so once, not on every call."""

from __future__ import annotations

import threading
import warnings

_warned_messages: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(message: str, stacklevel: int) -> None:
    """warnings.warn(message) the first time this process sees it; stacklevel counts from
    the caller, as for warnings.warn."""
    with _warned_lock:
        if message in _warned_messages:
            return
        _warned_messages.add(message)
    warnings.warn(message, stacklevel=stacklevel + 1)
