"""What the routines of samattn.bench share: inputs, dtypes, comparisons, SDPA helpers."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch

import samattn

from .. import _checks

# Where the routines allocate their inputs (the CPU tests run them on "cpu").
DEVICE = "cuda"

# dtype name -> (torch dtype, torch fp32 matmul precision): "f32" is exact fp32
# ("highest"), "tf32" lets fp32 GEMMs use tf32 tensor cores ("high").
DTYPES = {
    "f16": (torch.float16, "highest"),
    "bf16": (torch.bfloat16, "highest"),
    "f32": (torch.float32, "highest"),
    "tf32": (torch.float32, "high"),
}

# samattn's output may differ from torch's by rounding, not by more.
AGREEMENT_LIMIT = 2e-2

# torch's SDPA backends an attention record is compared with: the flash backend
# (FlashAttention-2; `baseline`, `ratio`) and cuDNN (`cudnn`, `ratio_to_cudnn`).
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


def element_size(dtype_name: str) -> int:
    return torch.empty((), dtype=DTYPES[dtype_name][0]).element_size()


def randn(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Random normal data of `shape` in `dtype` on DEVICE (drawn in float32)."""
    return torch.randn(tuple(shape), device=DEVICE, dtype=torch.float32).to(dtype)


def normal(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Random normal data made in place in `dtype`: a 32 GiB bf16 cache needs no fp32 copy."""
    return torch.empty(tuple(shape), device=DEVICE, dtype=dtype).normal_()


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def relative_difference(x: torch.Tensor, y: torch.Tensor) -> float:
    """||x - y|| / ||y|| (Frobenius), in fp64 a slice at a time: the largest outputs
    (a weight gradient of 64 experts: 3.8 G elements) do not fit the GPU twice in fp64."""
    squares = [0.0, 0.0]
    for xs, ys in zip(x.reshape(-1).split(1 << 26), y.reshape(-1).split(1 << 26)):
        yd = ys.double()
        squares[0] += (xs.double() - yd).square().sum().item()
        squares[1] += yd.square().sum().item()
    return math.sqrt(squares[0]) / max(math.sqrt(squares[1]), 1e-30)


def shape_text(shape: Sequence[int]) -> str:
    return "x".join(str(s) for s in shape)


def try_call(fn: Callable[..., object], *args: object) -> str | None:
    """Runs fn(*args) once; returns None if it worked, else why not (torch's SDPA raises
    RuntimeError when a forced backend refuses a case, with the reasons in warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn(*args)
            return None
        except (RuntimeError, NotImplementedError, ValueError) as error:
            reasons = [str(w.message).splitlines()[0] for w in caught]
            first_line = (str(error).splitlines() or [type(error).__name__])[0]
            return "; ".join(dict.fromkeys([first_line, *reasons]))


def alibi_slopes(heads: int, device: torch.device | str) -> torch.Tensor:
    """ALiBi's geometric slopes, 2 ** (-8 (h + 1) / heads), float32 (heads,)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=device)


def padding_mask(batch: int, seqlen: int, device: torch.device | str) -> torch.Tensor:
    """A bool (batch, 1, seqlen, seqlen) keep-mask of key padding: batch entry b keeps its
    first n_b keys, n_b random in [seqlen / 2, seqlen]; contiguous, as a model that builds
    its mask per query row makes it."""
    lengths = torch.randint(seqlen // 2, seqlen + 1, (batch,), device=device)
    keep = torch.arange(seqlen, device=device)[None, :] < lengths[:, None]
    return keep[:, None, None, :].expand(batch, 1, seqlen, seqlen).contiguous()


def sdpa_with_backend(
    backend_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """torch's scaled_dot_product_attention forced to SDPBackend.<backend_name>, on
    (batch, heads, seq, d) tensors with attn_mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name, None)
    if backend is None:
        raise RuntimeError(f"torch {torch.__version__} has no SDPBackend.{backend_name}")
    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def free_memory_bytes() -> int:
    """Free GPU memory, torch's cached blocks released first."""
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


@contextlib.contextmanager
def value_checks(enabled: bool) -> Iterator[None]:
    """samattn.set_value_checks(enabled) inside the block, the previous setting after. The
    check copies cache_seqlens / block_table to the host once per call and synchronizes:
    GPU timings turn it off, as a serving loop would."""
    setter = getattr(samattn, "set_value_checks", None)
    if setter is None:  # a library without the switch
        yield
        return
    getter = getattr(samattn, "value_checks_enabled", None) or getattr(
        _checks, "value_checks_enabled", None
    )
    previous = bool(getter()) if getter is not None else True
    setter(enabled)
    try:
        yield
    finally:
        setter(previous)
