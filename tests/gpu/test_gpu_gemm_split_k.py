"""Split-K GEMMs on the GPU: samattn.gemm(split_k=, split_k_mode=) in every forced family
against fp64 references, bit-identical replays of a fixed split, CUDA graphs,
torch.compile, and the splits no family runs.

The sm90 family splits serially on its stream-K tiles (CUTLASS's scheduler), and in
parallel as a batched GEMM of the K ranges into fp32 partial sums; the sm80 and sm75
families write such partials from their own kernel. A second kernel adds them up
(cpp/src/gemm/tensor_core/split_k_reduce.cuh).
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
    expected_gemm_family,
    gemm_floor,
    poison_allocator,
    randn,
)
from reference import tf32_matmul

import samattn

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}
MODES = ["auto", "serial", "parallel"]

# (M, N, K): the shape class (small output, long K), odd sizes whose K is no
# multiple of the split granule (64), and a K shorter than one granule (no split).
SHAPES = {
    "long_k": (256, 256, 8192),
    "odd": (77, 45, 1000),
    "decode": (16, 512, 4096),
    "short_k": (96, 80, 40),
}


def _precision(mode: str) -> None:
    torch.set_float32_matmul_precision("high" if mode == "tf32" else "highest")


def _split_family(family, mode, split_k, split_mode, a, b, c=None, alpha=1.0, beta=0.0, **epi):
    """The family that must run a split GEMM with `family` forced, or None when the
    families must refuse it: the family of the unsplit problem (sm90 hands over what TMA
    cannot describe), except that only tensor cores split (not Turing's bf16 and fp32),
    only sm90 splits serially, and sm90 hands parallel splits to sm80."""
    base = expected_gemm_family(family, a, b, c, alpha, beta, **epi)
    if split_k < 2:
        return base
    if base == "sm75" and mode != "f16":
        return None
    if split_mode == "serial":
        return base if base == "sm90" else None
    if split_mode == "parallel" and base == "sm90":
        # sm90 runs it when K is equal ranges and its batched GEMM fits its kernels
        # (tests/cpu/test_gemm_plan.py pins the rule); sm80 otherwise.
        return ("sm90", "sm80")
    return base


def _run(family, expected, fn):
    """fn() with `family` forced, run by `expected`; or refused when expected is None."""
    if expected is None:
        with pytest.raises(samattn.UnsupportedError, match="split"), samattn.use_family(family):
            fn()
        return None
    return call_forced(family, fn, expected=expected)


def _check(family, mode, shape, split_k, split_mode, *, bias=False, activation=None, c=False):
    dtype = DTYPES[mode]
    _precision(mode)
    m, n, k = shape
    a = randn(m, k, dtype=dtype, scale=1 / math.sqrt(k))
    b = randn(k, n, dtype=dtype)
    bias_t = randn(n, dtype=dtype) if bias else None
    c_t, alpha, beta = (randn(m, n, dtype=dtype), 0.5, -1.5) if c else (None, 1.0, 0.0)
    epilogue = dict(bias=bias_t, activation=activation)
    split = dict(split_k=split_k, split_k_mode=split_mode)
    # Partial sums and output both come from poisoned blocks (NaN where never written).
    poison_allocator((split_k, m, n), torch.float32)
    poison_allocator((m, n), dtype)
    expected = _split_family(family, mode, split_k, split_mode, a, b, c_t, alpha, beta, **epilogue)
    got = _run(
        family,
        expected,
        lambda: samattn.gemm(a, b, c_t, alpha=alpha, beta=beta, **epilogue, **split),
    )
    if got is None:
        return
    z = alpha * (a.double() @ b.double())
    base = alpha * (tf32_matmul(a, b) if mode == "tf32" else torch.matmul(a, b))
    if c_t is not None:
        z, base = z + beta * c_t.double(), base + beta * c_t
    if bias_t is not None:
        z, base = z + bias_t.double(), base + bias_t
    if activation == "gelu":
        z, base = torch.nn.functional.gelu(z), torch.nn.functional.gelu(base)
    floor = gemm_floor(dtype, k, tf32=mode == "tf32") + 16 * UNIT_ROUNDOFF[torch.float32]
    what = f"{family} {mode} {shape} split_k={split_k} {split_mode}"
    assert_close_to_reference(got, z, base, floor, what)


@pytest.mark.parametrize("mode", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("split_k", [1, 2, 3, 7, 16])
@pytest.mark.parametrize("split_mode", MODES)
def test_split_k_matches_the_reference(family, mode, shape, split_k, split_mode):
    _check(family, mode, SHAPES[shape], split_k, split_mode)


@pytest.mark.parametrize("split_mode", MODES)
def test_split_k_with_epilogue_and_c(family, split_mode):
    _check(family, "bf16", (200, 136, 3000), 5, split_mode, bias=True, activation="gelu", c=True)


@pytest.mark.parametrize("split_mode", ["auto", "parallel"])
def test_batched_and_strided_operands(family, split_mode):
    """A batch of 3 with a transposed B and a column-slice A (element-wise loads)."""
    _precision("bf16")
    a = randn(3, 70, 2050, dtype=torch.bfloat16)[:, :, 1:]  # K = 2049, unaligned
    b = randn(3, 40, 2049, dtype=torch.bfloat16).mT
    expected = _split_family(family, "bf16", 6, split_mode, a, b)
    got = _run(family, expected, lambda: samattn.gemm(a, b, split_k=6, split_k_mode=split_mode))
    if got is None:
        return
    ref = a.double() @ b.double()
    floor = gemm_floor(torch.bfloat16, 2049, tf32=False)
    assert_close_to_reference(got, ref, torch.matmul(a, b), floor, f"{family} batched split")


@pytest.mark.parametrize("split_mode", MODES)
@pytest.mark.parametrize("split_k", [2, 9])
def test_a_fixed_split_is_bit_reproducible(family, split_mode, split_k):
    _precision("bf16")
    a = randn(128, 16384, dtype=torch.bfloat16)
    b = randn(16384, 192, dtype=torch.bfloat16)

    def run():
        return samattn.gemm(a, b, split_k=split_k, split_k_mode=split_mode)

    expected = _split_family(family, "bf16", split_k, split_mode, a, b)
    first = _run(family, expected, run)
    if first is None:
        return
    for _ in range(3):
        again = call_forced(family, run, expected=expected)
        assert torch.equal(again, first), "a fixed split gave different bits"


def test_graph_replay_and_compile(family):
    _precision("f16")
    a = randn(64, 12288, dtype=torch.float16)
    b = randn(12288, 64, dtype=torch.float16)
    ref = a.double() @ b.double()
    floor = gemm_floor(torch.float16, 12288, tf32=False)
    with samattn.use_family(family):
        eager = samattn.gemm(a, b, split_k=8)
        graph, captured = capture_graph(lambda: samattn.gemm(a, b, split_k=8))
        a.copy_(randn(64, 12288, dtype=torch.float16))
        graph.replay()
        assert torch.equal(captured, samattn.gemm(a, b, split_k=8))
        compiled = torch.compile(
            lambda x, y: samattn.gemm(x, y, split_k=8, split_k_mode="parallel"), fullgraph=True
        )
        got = compiled(a, b)
    assert_close_to_reference(eager, ref, torch.matmul(a, b), floor, "eager before the graph")
    assert_close_to_reference(
        got, a.double() @ b.double(), torch.matmul(a, b), floor, "compiled parallel split"
    )


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("layout", ["b_row_major", "b_column_major"])
def test_sm90_parallel_split(dtype, layout):
    """The issue's shape class on sm90's parallel split, bit-reproducible, with the
    epilogue in the reduction."""
    torch_dtype = DTYPES[dtype]
    m, n, k = 256, 264, 16384
    a = randn(m, k, dtype=torch_dtype, scale=1 / math.sqrt(k))
    b = randn(k, n, dtype=torch_dtype)
    if layout == "b_column_major":
        b = b.mT.contiguous().mT
    c, bias = randn(m, n, dtype=torch_dtype), randn(n, dtype=torch_dtype)
    poison_allocator((16, m, n), torch.float32)
    poison_allocator((m, n), torch_dtype)

    def run():
        return samattn.gemm(
            a, b, c, alpha=0.5, beta=2.0, bias=bias, activation="silu", split_k=16,
            split_k_mode="parallel",
        )  # fmt: skip

    first = call_forced("sm90", run, expected="sm90")
    assert torch.equal(call_forced("sm90", run, expected="sm90"), first)
    z = torch.nn.functional.silu(0.5 * (a.double() @ b.double()) + 2.0 * c.double() + bias)
    base = torch.nn.functional.silu(0.5 * torch.matmul(a, b) + 2.0 * c + bias)
    floor = gemm_floor(torch_dtype, k, tf32=False) + 16 * UNIT_ROUNDOFF[torch.float32]
    assert_close_to_reference(first, z, base, floor, f"sm90 parallel {dtype} {layout}")


def test_fma_paths_do_not_split(family):
    """Exact fp32 (and Turing's bf16) run on FMA units, which never split: a forced split
    is an error that says so, not a silent single pass. (sm90 forced has no exact fp32 at
    all: the error says that instead.)"""
    torch.set_float32_matmul_precision("highest")
    a, b = randn(64, 4096, dtype=torch.float32), randn(4096, 64, dtype=torch.float32)
    text = "has no exact float32" if family == "sm90" else "split_k runs on tensor cores"
    refused = pytest.raises(samattn.UnsupportedError, match=text)
    with refused, samattn.use_family(family):
        samattn.gemm(a, b, split_k=4)
    assert torch.equal(samattn.gemm(a, b, split_k=1), samattn.gemm(a, b))
    assert_cuda_healthy()


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        (dict(split_k=0), ValueError, "split_k must be 'auto' or 1..64, got 0"),
        (dict(split_k=65), ValueError, "split_k must be 'auto' or 1..64, got 65"),
        (dict(split_k=2.0), TypeError, "split_k must be 'auto' or an int"),
        (dict(split_k=True), TypeError, "split_k must be 'auto' or an int"),
        (dict(split_k_mode="turnstile"), ValueError, "split_k_mode must be one of"),
    ],
)
def test_bad_split_arguments(kwargs, error, text):
    a = randn(8, 8, dtype=torch.float16)
    with pytest.raises(error, match=text):
        samattn.gemm(a, a, **kwargs)
