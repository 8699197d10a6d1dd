"""samattn: GEMM and softmax (later FlashAttention) CUDA kernels written with CUTLASS CuTe.

The kernels live in one C-ABI library, ``samattn/lib/libsamattn.so``, loaded with ctypes
on first use; the ops are registered with ``torch.library`` as ``torch.ops.samattn.*`` and
work with autograd and ``torch.compile``.
"""

from ._family import built_families, use_family
from ._info import info
from ._lib import UnsupportedError
from ._version import __version__
from .ops import gemm, softmax

__all__ = [
    "UnsupportedError",
    "__version__",
    "built_families",
    "gemm",
    "info",
    "softmax",
    "use_family",
]
