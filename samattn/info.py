"""``python -m samattn.info``: print what samattn will run on this machine (see _info.py).

The package does not import this module (``samattn.info`` is the function from _info.py), so
that ``python -m`` runs it fresh. Importing it explicitly rebinds ``samattn.info`` to this
module, which is therefore callable too.
"""

from __future__ import annotations

import sys
import types
from typing import Any, TextIO

from ._info import collect, format_report, info, main

__all__ = ["collect", "format_report", "info", "main"]


class _CallableModule(types.ModuleType):
    def __call__(self, file: TextIO | None = None) -> dict[str, Any]:
        return info(file)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
