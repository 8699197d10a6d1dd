"""samattn: GEMM, softmax and FlashAttention CUDA kernels written with CUTLASS CuTe.

The kernels live in one C-ABI library, ``samattn/lib/libsamattn.so``, loaded with ctypes
on first use; the ops are registered with ``torch.library`` as ``torch.ops.samattn.*`` and
work with autograd and ``torch.compile``. Inference: ``flash_attn_with_kvcache`` (KV
caches, paged or not, with append and rotary embedding) and paged prefill through
``flash_attn_varlen_func(block_table=...)``; ``set_value_checks`` turns off the eager
checks of their integer arguments' values for latency-critical serving.
"""

from ._variant import check_single_variant

# Before anything else: two variant wheels in one environment overwrite each other.
check_single_variant()

from ._checks import set_value_checks  # noqa: E402
from ._family import built_families, use_family  # noqa: E402
from ._info import info  # noqa: E402
from ._lib import ArgumentError, UnsupportedError  # noqa: E402
from ._version import __version__  # noqa: E402
from .attention import (  # noqa: E402
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
    scaled_dot_product_attention,
)
from .ops import gemm, grouped_gemm, grouped_gemm_list, linear, softmax  # noqa: E402

__all__ = [
    "ArgumentError",
    "UnsupportedError",
    "__version__",
    "built_families",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "gemm",
    "grouped_gemm",
    "grouped_gemm_list",
    "info",
    "linear",
    "scaled_dot_product_attention",
    "set_value_checks",
    "softmax",
    "use_family",
]
