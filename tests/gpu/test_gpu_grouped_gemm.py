"""Grouped GEMM (mixture of experts) on the GPU: samattn.grouped_gemm against fp64
per-expert references, every forced family, skewed and empty experts, both weight
layouts, rows after the last offset, gradients, torch.compile and CUDA graphs, and
offsets that are wrong (clamped: no access outside the tensors).
"""

from __future__ import annotations

import math

import pytest
import torch
from gpu_checks import (
    UNIT_ROUNDOFF,
    assert_close_to_reference,
    assert_cuda_healthy,
    call_forced,
    capture_graph,
    gemm_floor,
    poison_allocator,
    randn,
)

import samattn

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}

# Rows per expert: skewed loads, empty experts, one expert, odd counts, and many experts.
LOADS = {
    "skewed": [700, 3, 0, 129, 64, 1, 0, 300],
    "one": [517],
    "empty_first_last": [0, 130, 0, 77, 0],
    "odd": [1, 2, 3, 5, 8, 13, 21, 34, 55],
    "many": [(e * 37) % 23 for e in range(64)],
}


def _expected(family: str, dtype: torch.dtype, aligned: bool = True) -> str | None:
    """The family that runs a grouped GEMM with `family` forced; None: refused (Turing's
    bf16 runs on FMA units, which have no grouped kernel). sm90's grouped kernel takes
    K and N of whole 16 bytes (TMA) and hands other sizes to sm80."""
    if family == "sm90":
        return "sm90" if aligned else "sm80"
    if family == "sm75" and dtype != torch.float16:
        return None
    return family


def _offsets(loads: list[int], device="cuda") -> torch.Tensor:
    return torch.tensor(loads, dtype=torch.int32).cumsum(0).int().to(device)


def _reference(x: torch.Tensor, w: torch.Tensor, loads: list[int], tokens: int) -> torch.Tensor:
    out = torch.zeros(tokens, w.shape[2], dtype=torch.float64, device=x.device)
    begin = 0
    for e, count in enumerate(loads):
        out[begin : begin + count] = x[begin : begin + count].double() @ w[e].double()
        begin += count
    return out


def _torch_loop(x: torch.Tensor, w: torch.Tensor, loads: list[int], tokens: int) -> torch.Tensor:
    """What a user writes without a grouped GEMM: a loop of torch.mm, in x's dtype."""
    out = torch.zeros(tokens, w.shape[2], dtype=x.dtype, device=x.device)
    begin = 0
    for e, count in enumerate(loads):
        out[begin : begin + count] = x[begin : begin + count] @ w[e]
        begin += count
    return out


def _run(family: str, dtype: torch.dtype, fn, expected: str | tuple[str, ...] | None = None):
    expected = expected or _expected(family, dtype)
    if expected is None:
        refused = pytest.raises(samattn.UnsupportedError, match="grouped GEMMs run on tensor")
        with refused, samattn.use_family(family):
            fn()
        return None
    return call_forced(family, fn, expected=expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loads", LOADS)
@pytest.mark.parametrize("layout", ["ekn", "enk"])
@pytest.mark.parametrize("tail", [0, 37], ids=["no_tail", "tail"])
def test_grouped_gemm_matches_the_reference(family, dtype, loads, layout, tail):
    dtype_ = DTYPES[dtype]
    counts = LOADS[loads]
    experts, k, n = len(counts), 264, 200
    tokens = sum(counts) + tail
    x = randn(tokens, k, dtype=dtype_, scale=1 / math.sqrt(k))
    w = randn(experts, k, n, dtype=dtype_)
    if layout == "enk":  # stored (experts, N, K), as nn.Linear keeps weights
        w = w.mT.contiguous().mT
    offsets = _offsets(counts)
    poison_allocator((tokens, n), dtype_)
    got = _run(family, dtype_, lambda: samattn.grouped_gemm(x, w, offsets))
    if got is None:
        return
    ref = _reference(x, w, counts, tokens)
    floor = gemm_floor(dtype_, k, tf32=False) + 16 * UNIT_ROUNDOFF[torch.float32]
    what = f"{family} {dtype} {loads} {layout} tail={tail}"
    assert_close_to_reference(got, ref, _torch_loop(x, w, counts, tokens), floor, what)
    assert torch.all(got[sum(counts) :] == 0), "rows after the last offset must be zeros"


@pytest.mark.parametrize(("k", "n"), [(264, 202), (100, 200), (72, 24)])
def test_sizes_and_strides_each_family_takes(family, k, n):
    """x as a view with a row stride wider than K; sizes that are not whole 16 bytes
    along K or N (sm90's TMA cannot describe them: sm80 runs them)."""
    counts = [130, 0, 257, 9]
    tokens = sum(counts) + 3
    x = randn(tokens, k + 24, dtype=torch.bfloat16, scale=1 / math.sqrt(k))[:, 8 : 8 + k]
    w = randn(len(counts), k, n, dtype=torch.bfloat16)
    aligned = k % 8 == 0 and n % 8 == 0
    expected = _expected(family, torch.bfloat16, aligned)
    poison_allocator((tokens, n), torch.bfloat16)
    got = _run(
        family,
        torch.bfloat16,
        lambda: samattn.grouped_gemm(x, w, _offsets(counts)),
        expected=expected,
    )
    if got is None:
        return
    ref = _reference(x, w, counts, tokens)
    floor = gemm_floor(torch.bfloat16, k, tf32=False) + 16 * UNIT_ROUNDOFF[torch.float32]
    assert_close_to_reference(got, ref, _torch_loop(x, w, counts, tokens), floor, f"{k}x{n}")
    assert torch.all(got[sum(counts) :] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_gemm_gradients(family, dtype):
    dtype_ = DTYPES[dtype]
    counts = [90, 0, 33, 200, 1]
    tokens, k, n = sum(counts) + 5, 136, 72
    x = randn(tokens, k, dtype=dtype_).requires_grad_()
    w = randn(len(counts), k, n, dtype=dtype_, scale=1 / math.sqrt(k)).requires_grad_()
    offsets = _offsets(counts)
    dy = randn(tokens, n, dtype=dtype_)

    def step():
        out = samattn.grouped_gemm(x, w, offsets)
        return torch.autograd.grad(out, (x, w), dy)

    # The weight gradient (K-grouped) runs on sm80 whatever is forced from sm90 up.
    expected = ("sm90", "sm80") if family == "sm90" else None
    grads = _run(family, dtype_, step, expected=expected)
    if grads is None:
        return
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    ref = _reference(x64, w64, counts, tokens)
    ref_dx, ref_dw = torch.autograd.grad(ref, (x64, w64), dy.double())
    base_dx, base_dw = torch.autograd.grad(_torch_loop(x, w, counts, tokens), (x, w), dy)
    assert_close_to_reference(
        grads[0], ref_dx, base_dx, gemm_floor(dtype_, n, tf32=False), f"{family} dx"
    )
    # dw reduces over an expert's rows (up to 200).
    assert_close_to_reference(
        grads[1], ref_dw, base_dw, gemm_floor(dtype_, 200, tf32=False), f"{family} dw"
    )
    assert torch.all(grads[0][sum(counts) :] == 0) and torch.all(grads[1][1] == 0)


def test_grouped_gemm_under_compile_and_graphs(family):
    counts = [64, 0, 100, 3]
    tokens, k, n = sum(counts), 128, 96
    x = randn(tokens, k, dtype=torch.bfloat16)
    w = randn(len(counts), k, n, dtype=torch.bfloat16)
    offsets = _offsets(counts)
    expected = _expected(family, torch.bfloat16)
    if expected is None:
        pytest.skip(f"{family} has no bf16 tensor cores")
    with samattn.use_family(family):
        eager = samattn.grouped_gemm(x, w, offsets)
        compiled = torch.compile(samattn.grouped_gemm, fullgraph=True)(x, w, offsets)
        graph, captured = capture_graph(lambda: samattn.grouped_gemm(x, w, offsets))
        # New routing, same shapes: the graph reads the offsets on the device.
        offsets.copy_(_offsets([10, 150, 0, 7]))
        graph.replay()
        after = samattn.grouped_gemm(x, w, offsets)
    assert torch.equal(compiled, eager)
    assert torch.equal(captured, after)


def test_bad_offsets_stay_inside_the_tensors(family):
    """Offsets on the GPU are not checked (that would synchronize); the kernels clamp them,
    so decreasing, negative or too large ends give undefined rows but no bad access."""
    x = randn(100, 64, dtype=torch.float16)
    w = randn(4, 64, 32, dtype=torch.float16)
    for bad in ([50, 20, 90, 100], [-5, 10, 1000, 2**31 - 1], [200, 200, 200, 200]):
        offsets = torch.tensor(bad, dtype=torch.int32, device="cuda")
        # fp16 runs on every family's tensor cores.
        with samattn.use_family(family):
            samattn.grouped_gemm(x, w, offsets)
        assert_cuda_healthy()


def test_offsets_on_the_cpu_are_checked():
    x = randn(10, 8, dtype=torch.float16)
    w = randn(2, 8, 4, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"offsets\[1\] = 3 follows 5"):
        samattn.grouped_gemm(x, w, torch.tensor([5, 3], dtype=torch.int32))
    got = samattn.grouped_gemm(x, w, torch.tensor([4, 10], dtype=torch.int32))
    ref = _reference(x, w, [4, 6], 10)
    assert_close_to_reference(
        got, ref, _torch_loop(x, w, [4, 6], 10), gemm_floor(torch.float16, 8, False), "cpu ends"
    )
