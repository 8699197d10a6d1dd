"""A stand-in for the flash-attn 2 package that routes to samattn, for running flash-attn's
own ``tests/test_flash_attn.py`` against samattn (``run_flash_attn_tests.py`` beside this
package puts it first on ``sys.path``). Not for users: samattn itself is the drop-in
(``from samattn import flash_attn_func``); this package only gives the test file the
module names it imports, written for samattn (no flash-attn code).
"""

from .flash_attn_interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__version__ = "2.8.3+samattn"

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]
