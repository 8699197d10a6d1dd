"""Helpers shared by the GPU tests: forcing a family, poisoning outputs, and
comparing results with an fp64 reference the way flash-attn does.

Accuracy rule. For every check there are three results: samattn's, torch's
own in the same dtype and precision (the baseline), and an fp64 reference
computed on the GPU from the same inputs. samattn passes when its error
against the reference is at most twice the baseline's error plus a small
floor (about one rounding of the output), measured both as the relative
Frobenius norm and as the largest absolute error. A single wrong element
hardly moves the Frobenius norm but dominates the max-abs error; poisoned
(NaN) outputs that were never written fail the finiteness check.

Poisoning. samattn allocates its outputs with torch's caching allocator, so
before each call `poison_allocator` allocates a block of the output's size,
fills it with NaN bytes (0xFF is NaN in fp16, bf16 and fp32) and frees it:
the allocator's best-fit search usually hands that block to the next
allocation of the same size. This is best effort (a temporary allocated
first would take the block); test_gpu_capi.py is the exact check: it calls
the C ABI on output buffers that the test fills with NaN itself, with guard
elements around them that must stay untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import pytest
import torch

import samattn

DEVICE = "cuda"

# Families whose kernels cover every op and dtype (docs/design.md section 2): an
# UnsupportedError from them is a failure. Others (sm90 while its kernels are
# being written) skip the cases they cannot run.
COMPLETE_FAMILIES = ("sm75", "sm80")

# The first compute capability each family runs on; sm90 (sm_90a) runs on 9.0 only.
_FAMILY_MIN_CC = {"sm75": (7, 5), "sm80": (8, 0), "sm90": (9, 0)}

# The family a forced family hands the problems its plan declines to (its registrations'
# forced_fallback, cpp/src/common/registry.h): sm90 runs on sm80 the GEMMs TMA cannot
# describe, the attention forward calls its plan declines, and every attention backward.
FORCED_FALLBACK = {"sm90": "sm80"}

# Unit roundoff of the arithmetic each dtype mode ends in.
UNIT_ROUNDOFF = {
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
    torch.float32: 2.0**-24,
}
TF32_UNIT_ROUNDOFF = 2.0**-11

# GEMM dtype mode -> (dtype, torch fp32 matmul precision). "f32" is exact fp32
# ("highest": FMA kernels), "tf32" lets fp32 use tf32 tensor cores ("high").
GEMM_MODES = {
    "f16": (torch.float16, "highest"),
    "bf16": (torch.bfloat16, "highest"),
    "f32": (torch.float32, "highest"),
    "tf32": (torch.float32, "high"),
}

T = TypeVar("T")


def runnable_families() -> list[str]:
    """Families compiled into the library that this GPU can run."""
    major, minor = torch.cuda.get_device_capability()
    families = []
    for family in samattn.built_families():
        lowest = _FAMILY_MIN_CC.get(family)
        if lowest is None:
            continue
        if family == "sm90" and (major, minor) != (9, 0):
            continue
        if (major, minor) >= lowest:
            families.append(family)
    return families


def need_family(family: str) -> None:
    """Skip the test unless `family` is built and this GPU runs it."""
    if family not in runnable_families():
        pytest.skip(f"{family} is not built or cannot run on this GPU")


def expected_gemm_family(family: str, a, b, c=None, alpha=1.0, beta=0.0, **epilogue) -> str:
    """The family samattn.gemm(a, b, c, ..., **epilogue) must run with `family` forced:
    itself, except that sm90 hands what TMA cannot describe, and epilogues in layouts it has
    no kernel for, to sm80 (samattn_gemm_plan decides). epilogue: bias, activation,
    out_dtype."""
    if family != "sm90":
        return family
    try:
        with samattn.use_family(family):
            return samattn._cuda.gemm_plan(a, b, c, alpha, beta, **epilogue)[0]
    except samattn.UnsupportedError:
        return family  # e.g. exact fp32: samattn.gemm raises too, and call_forced skips


def forced_runs(family: str) -> tuple[str, ...]:
    """The families that may run an op with `family` forced: itself, and the family it hands
    what its plan declines to (FORCED_FALLBACK). For call_forced(expected=...) where the test
    does not ask the library which (as expected_gemm_family does)."""
    fallback = FORCED_FALLBACK.get(family)
    return (family,) if fallback is None else (family, fallback)


def call_forced(
    family: str,
    fn: Callable[[], T],
    may_launch_nothing: bool = False,
    expected: str | tuple[str, ...] | None = None,
) -> T:
    """Run fn() with `family` forced and check that this family ran the op.

    may_launch_nothing: an empty output needs no kernel, so no family runs.
    expected: the family that must run, when not `family` (see expected_gemm_family), or
    the families that may (see forced_runs).
    """
    samattn._lib.set_last_family(samattn._lib.FAMILY_AUTO)  # forget the previous op
    try:
        with samattn.use_family(family):
            result = fn()
    except samattn.UnsupportedError as error:
        if family in COMPLETE_FAMILIES:
            raise
        pytest.skip(f"{family}: {error}")
    last = samattn._lib.last_family()
    expected = expected or family
    allowed = (expected,) if isinstance(expected, str) else tuple(expected)
    if not (may_launch_nothing and last is None):
        assert last in allowed, f"forced {family}, expected {expected}, but {last} ran the op"
    return result


def capture_graph(step: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
    """Warm step() up on a side stream (as torch.cuda.graph's documentation asks), then
    capture one call of it; returns the graph and the captured call's outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # On a stream of the current device: torch.cuda.graph's default capture stream is made
    # once per process, on the device current at its first capture.
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        outputs = step()
    return graph, outputs


def poison_allocator(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> None:
    """Leave a NaN-filled free block of this size in the caching allocator."""
    numel = math.prod(shape)
    if numel == 0:
        return
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    block = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    block.fill_(0xFF)
    del block


def _summary(x: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(relative Frobenius error, max abs error) of x against ref, both fp64."""
    diff = x.double() - ref
    ref_norm = ref.norm().item()
    rel = diff.norm().item() / ref_norm if ref_norm > 0 else diff.norm().item()
    return rel, diff.abs().max().item()


def assert_close_to_reference(
    out: torch.Tensor,
    ref: torch.Tensor,
    baseline: torch.Tensor,
    floor: float,
    what: str = "",
    magnitude: float | None = None,
    frobenius: bool = True,
) -> None:
    """Check out against the fp64 reference, allowing 2x the baseline's error + floor.

    out and baseline: the same shape as ref (fp64), any floating dtype.
    floor is relative: to the reference's norm (Frobenius) and to its largest
    magnitude (max-abs). NaN in the reference (e.g. a softmax row of -inf)
    must be NaN in out at exactly the same positions; every other element
    must be finite. magnitude: what the max-abs floor is relative to, when not the
    reference's own largest magnitude (a gradient that is exactly 0 in the reference is
    still computed from terms of the size of the others). frobenius=False checks the
    max-abs bound only: for a result that is a sum of terms that cancel (its exact value
    ~0), whose relative error compares two roundings' noise with each other.
    """
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    ref_nan = ref.isnan()
    out_nan = out.isnan()
    assert torch.equal(out_nan, ref_nan), (
        f"{what}: NaN at {int((out_nan & ~ref_nan).sum())} positions where the reference "
        f"has none, and missing at {int((ref_nan & ~out_nan).sum())} where it has NaN"
    )
    finite = torch.isfinite(ref)
    bad = finite & ~torch.isfinite(out)
    assert not bad.any(), f"{what}: {int(bad.sum())} non-finite outputs where the reference isn't"
    if ref.numel() == 0:
        return
    if not finite.all():
        # Compare the finite part; +-inf must match exactly.
        assert torch.equal(out[~finite & ~ref_nan].double(), ref[~finite & ~ref_nan]), what
        out, ref, baseline = out[finite], ref[finite], baseline[finite]
    if ref.numel() == 0:
        return
    rel, max_abs = _summary(out, ref)
    base_rel, base_max_abs = _summary(baseline, ref)
    ref_max = ref.abs().max().item() if magnitude is None else magnitude
    rel_bound = 2 * base_rel + floor
    abs_bound = 2 * base_max_abs + floor * ref_max
    if not frobenius:
        rel_bound = math.inf
    assert rel <= rel_bound and max_abs <= abs_bound, (
        f"{what}: relative error {rel:.3g} (bound {rel_bound:.3g}, torch {base_rel:.3g}), "
        f"max abs error {max_abs:.3g} (bound {abs_bound:.3g}, torch {base_max_abs:.3g})"
    )


# Element-wise softmax bound |out - ref| <= atol + rtol * |ref|: fp32 as the
# spec asks; fp16 and bf16 one unit in the last place (an fp32 computation
# rounded once is within half of one), atol at fp16's subnormal spacing.
SOFTMAX_ELEMENTWISE = {
    torch.float32: (1e-5, 1e-6),
    torch.float16: (2.0**-10, 2.0**-24),
    torch.bfloat16: (2.0**-7, 1e-37),
}


def assert_softmax_close(
    out: torch.Tensor, ref: torch.Tensor, baseline: torch.Tensor, what: str = ""
) -> None:
    """A softmax forward output: element-wise bound, and for fp16/bf16 also the 2x-torch rule."""
    if out.dtype != torch.float32:
        floor = 0.25 * UNIT_ROUNDOFF[out.dtype]
        assert_close_to_reference(out, ref, baseline, floor, what)
    assert torch.equal(out.isnan(), ref.isnan()), f"{what}: NaN positions differ"
    rtol, atol = SOFTMAX_ELEMENTWISE[out.dtype]
    ok = ~ref.isnan()
    err = (out.double() - ref).abs()[ok]
    excess = err - (atol + rtol * ref.abs()[ok])
    if err.numel() and excess.max() > 0:
        worst = excess.argmax()
        raise AssertionError(
            f"{what}: {int((excess > 0).sum())} elements beyond {rtol:.3g} * |ref| + {atol:.3g}; "
            f"worst: {out[ok][worst].item():.6g} for {ref[ok][worst].item():.6g}"
        )


def gemm_floor(dtype: torch.dtype, k: int, tf32: bool) -> float:
    """Error floor for a GEMM output: one output rounding plus fp32 accumulation."""
    if dtype == torch.float32:
        if tf32:
            # Rounding vs. truncating inputs to tf32 differ by up to 2x.
            return TF32_UNIT_ROUNDOFF
        return UNIT_ROUNDOFF[torch.float32] * (4 + math.sqrt(k))
    return 0.5 * UNIT_ROUNDOFF[dtype] + UNIT_ROUNDOFF[torch.float32] * math.sqrt(k)


def has_triton() -> bool:
    """Whether torch's inductor can compile for this machine (triton installed and usable)."""
    try:
        from torch.utils._triton import has_triton as usable
    except ImportError:
        return False
    return usable()


def randn(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Normal random values on the GPU, rounded to dtype."""
    return (torch.randn(*shape, device=DEVICE, dtype=torch.float32) * scale).to(dtype)


def assert_cuda_healthy() -> None:
    """No sticky CUDA error was left behind (an illegal access would surface here)."""
    torch.cuda.synchronize()
    torch.empty(1, device=DEVICE).fill_(1.0).item()
