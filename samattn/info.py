"""``python -m samattn.info``: print what samattn will run on this machine.

A script, not an API: ``samattn.info`` is the function ``samattn.info()`` (samattn/_info.py).
``python -m`` runs this file without importing it as ``samattn.info``, so the function stays
in place; a plain ``import samattn.info`` would replace the package's ``info`` attribute with
this module, so it is refused.
"""

from __future__ import annotations

import sys

if __name__ != "__main__":
    raise ImportError(
        "samattn.info is a function: call samattn.info(), or run `python -m samattn.info`"
    )

from samattn._info import main

sys.exit(main())
