"""flash-attn's functions, served by samattn, with S_dmask in flash-attn's test format.

samattn's functions take flash-attn's arguments and return what flash-attn returns, with
one difference that flash-attn's tests see: S_dmask (``return_attn_probs=True`` with
dropout). samattn's holds the attention probabilities exp(s - lse), negated where dropout
dropped them; flash-attn's kernel writes them unnormalized, exp(s - m) with m the running
row maximum at each key block, and its tests normalize them back per block of
``_get_block_size_n`` keys. Here every key is in one block (``_get_block_size_n`` is
larger than any sequence) and S_dmask is divided by its row maximum in float32, which
is exp(s - m) for m the row's largest score: the tests' normalization then gives
samattn's probabilities back, and the sign (the dropout mask) is kept.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

import samattn

# flash-attn's flag for its ROCm build; the tests skip CUDA-extension-only checks on it.
USE_TRITON_ROCM = False

# One key block for every sequence (see the module docstring).
_ONE_BLOCK = 1 << 30


def _get_block_size_n(device: Any, head_dim: int, is_dropout: bool, is_causal: bool) -> int:
    """The key block of S_dmask's normalization in flash-attn's tests: one block."""
    return _ONE_BLOCK


def unnormalized_s_dmask(s_dmask: torch.Tensor) -> torch.Tensor:
    """samattn's S_dmask, each row divided by its largest magnitude (rows of zeros stay 0),
    float32: flash-attn's unnormalized S of one key block, signs kept."""
    s = s_dmask.float()
    row_max = s.abs().amax(dim=-1, keepdim=True)
    return s / torch.where(row_max > 0, row_max, torch.ones_like(row_max))


def _with_flash_attn_s_dmask(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        if isinstance(result, tuple) and len(result) == 3 and result[2] is not None:
            out, lse, s_dmask = result
            return out, lse, unnormalized_s_dmask(s_dmask)
        return result

    return call


flash_attn_func = _with_flash_attn_s_dmask(samattn.flash_attn_func)
flash_attn_kvpacked_func = _with_flash_attn_s_dmask(samattn.flash_attn_kvpacked_func)
flash_attn_qkvpacked_func = _with_flash_attn_s_dmask(samattn.flash_attn_qkvpacked_func)
flash_attn_varlen_func = _with_flash_attn_s_dmask(samattn.flash_attn_varlen_func)
flash_attn_varlen_kvpacked_func = _with_flash_attn_s_dmask(samattn.flash_attn_varlen_kvpacked_func)
flash_attn_varlen_qkvpacked_func = _with_flash_attn_s_dmask(
    samattn.flash_attn_varlen_qkvpacked_func
)
flash_attn_with_kvcache = samattn.flash_attn_with_kvcache
