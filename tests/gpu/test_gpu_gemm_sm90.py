"""The sm90 GEMM family (TMA + wgmma) on a Hopper GPU: every instantiation, the shapes its
tiles and stream-K split, the hand-over to sm80 for what TMA cannot describe, CUDA graphs
and torch.compile. test_gpu_gemm.py runs the general suite with sm90 forced as well.
"""

from __future__ import annotations

import pytest
import torch
from gpu_checks import (
    GEMM_MODES,
    assert_close_to_reference,
    call_forced,
    capture_graph,
    gemm_floor,
    poison_allocator,
    randn,
    runnable_families,
)
from reference import tf32_matmul

import samattn

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or "sm90" not in runnable_families(),
    reason="needs the sm90 family and a compute capability 9.0 GPU",
)

TILES = ["128x256_c2x1", "128x128_c1x2", "128x64_streamk", "128x64_swap_ab"]
MODES = {mode: GEMM_MODES[mode] for mode in ("f16", "bf16", "tf32")}


def _operand(rows: int, cols: int, dtype: torch.dtype, layout: str, batch: int = 0):
    """A (batch, rows, cols) operand, row-major or column-major (a transposed view)."""
    lead = (batch,) if batch else ()
    if layout == "row":
        return randn(*lead, rows, cols, dtype=dtype)
    return randn(*lead, cols, rows, dtype=dtype).mT


def _check(mode, a, b, c=None, alpha=1.0, beta=0.0, expected="sm90", what=""):
    dtype, precision = MODES[mode]
    torch.set_float32_matmul_precision(precision)
    out_shape = (*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    poison_allocator(out_shape, dtype)
    out = call_forced(
        "sm90", lambda: samattn.gemm(a, b, c, alpha=alpha, beta=beta), expected=expected
    )
    ref = alpha * (a.double() @ b.double())
    if c is not None and beta != 0.0:
        ref = ref + beta * c.double()
    base = tf32_matmul(a, b) if mode == "tf32" else torch.matmul(a, b)
    base = alpha * base.float()
    if c is not None and beta != 0.0:
        base = base + beta * c.float()
    floor = gemm_floor(dtype, a.shape[-1], tf32=mode == "tf32")
    assert_close_to_reference(out, ref, base.to(dtype), floor, f"sm90 {mode} {what}")
    return out


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("a_layout", ["row", "col"])
@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_every_instantiation(monkeypatch, tile, mode, a_layout, b_layout):
    """Each (dtype, layout, tile) kernel, forced, on a batched problem with partial edge
    tiles in M, N and K, alpha and beta."""
    monkeypatch.setenv("SAMATTN_SM90_GEMM_TILE", tile)
    dtype, precision = MODES[mode]
    torch.set_float32_matmul_precision(precision)
    batch, m, n, k = 3, 264, 392, 200
    a = _operand(m, k, dtype, a_layout, batch)
    b = _operand(k, n, dtype, b_layout, batch)
    c = randn(batch, m, n, dtype=dtype)
    with samattn.use_family("sm90"):
        plan = samattn._cuda.gemm_plan(a, b, c, 0.75, -0.5)
    # tf32 has no swap_ab kernel; the plan takes plain stream-K instead.
    ran = "128x64_streamk" if (mode, tile) == ("tf32", "128x64_swap_ab") else tile
    assert plan[0] == "sm90" and f"tile={ran}" in plan[1], plan
    _check(mode, a, b, c, alpha=0.75, beta=-0.5, what=f"{tile} A {a_layout} B {b_layout}")


SHAPES = [
    (8, 8, 8),
    (1, 4096, 1024),  # decode-like: swap_ab
    (16, 8192, 1024),
    (72, 8192, 1024),
    (256, 8192, 1024),  # stream-K
    (64, 4096, 4096),
    (128, 1024, 8192),
    (1000, 1000, 1000),
    (2048, 2048, 2048),  # the big tile, one wave
    (4104, 520, 1032),
    (136, 4096, 64),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_shapes(mode, shape):
    m, n, k = shape
    dtype = MODES[mode][0]
    _check(mode, randn(m, k, dtype=dtype), randn(k, n, dtype=dtype), what=str(shape))


@pytest.mark.parametrize("mode", ["bf16", "tf32"])
def test_linear_layer_batch_is_folded(mode):
    """(batch, m, k) @ (k, n) with one shared B runs as one tall sm90 GEMM."""
    dtype = MODES[mode][0]
    _check(mode, randn(8, 48, 256, dtype=dtype), randn(256, 520, dtype=dtype), what="folded")


def test_c_laid_out_unlike_d_runs_on_sm80():
    """The TMA epilogue reads C in D's (row-major) layout; a column-major C goes to sm80."""
    a, b = randn(256, 128, dtype=torch.bfloat16), randn(128, 512, dtype=torch.bfloat16)
    c = randn(512, 256, dtype=torch.bfloat16).mT  # column-major C: falls back
    _check("bf16", a, b, c, beta=1.0, expected="sm80", what="column-major C")


FALLBACKS = {
    # name: (a, b) makers; each breaks one TMA rule
    "odd_k": lambda t: (randn(256, 1001, dtype=t), randn(1001, 256, dtype=t)),
    "odd_leading_dim": lambda t: (randn(256, 259, dtype=t)[:, :256], randn(256, 256, dtype=t)),
    "unaligned_pointer": lambda t: (
        randn(256 * 256 + 1, dtype=t)[1:].view(256, 256),
        randn(256, 256, dtype=t),
    ),
    "broadcast_a": lambda t: (randn(256, 256, dtype=t), randn(4, 256, 256, dtype=t)),
}


@pytest.mark.parametrize("mode", ["f16", "bf16", "tf32"])
@pytest.mark.parametrize("case", FALLBACKS)
def test_what_tma_cannot_describe_runs_on_sm80(mode, case):
    a, b = FALLBACKS[case](MODES[mode][0])
    with samattn.use_family("sm90"):
        torch.set_float32_matmul_precision(MODES[mode][1])
        family, why = samattn._cuda.gemm_plan(a, b)
    assert family == "sm80" and why.startswith("sm90 cannot run it"), why
    _check(mode, a, b, expected="sm80", what=case)


def test_exact_fp32_is_not_an_sm90_op():
    torch.set_float32_matmul_precision("highest")
    a, b = randn(256, 256, dtype=torch.float32), randn(256, 256, dtype=torch.float32)
    with samattn.use_family("sm90"), pytest.raises(samattn.UnsupportedError, match="exact float32"):
        samattn.gemm(a, b)
    # Automatic selection runs it exactly, on sm80's FMA kernel.
    samattn.gemm(a, b)
    assert samattn._lib.last_family() == "sm80"


def test_tma_descriptors_follow_each_calls_tensors():
    """The library keeps the TMA descriptors of recent shapes and re-points them at each
    call's tensors: calls of one shape on new tensors, more shapes than it keeps (64), and
    a shape seen again after it was replaced, each match their own inputs' product."""
    shapes = [(64 + 8 * i, 72, 136) for i in range(70)]
    alive = []  # earlier inputs stay allocated: every call's tensors sit at new addresses
    for round_ in range(2):
        for m, k, n in shapes[:: 1 if round_ == 0 else 7]:
            for _ in range(2):
                a, b = randn(m, k, dtype=torch.bfloat16), randn(k, n, dtype=torch.bfloat16)
                _check("bf16", a, b, what=f"{m}x{k}x{n} round {round_}")
                alive = [*alive[-3:], (a, b)]


@pytest.mark.parametrize("tile", TILES)
def test_cuda_graph_replay(monkeypatch, tile):
    """Captured sm90 GEMMs replay on new inputs, bit for bit like eager calls (stream-K
    reduces in a fixed order); stream-K's workspace comes from the graph's memory pool."""
    monkeypatch.setenv("SAMATTN_SM90_GEMM_TILE", tile)
    a, b = randn(2, 200, 512, dtype=torch.bfloat16), randn(2, 512, 392, dtype=torch.bfloat16)
    c = randn(2, 200, 392, dtype=torch.bfloat16)

    def step():
        return samattn.gemm(a, b, c, alpha=0.5, beta=2.0)

    with samattn.use_family("sm90"):
        graph, out = capture_graph(step)
        for _ in range(2):
            for t in (a, b, c):
                t.copy_(torch.randn_like(t, dtype=torch.float32))
            out.fill_(float("nan"))
            graph.replay()
            want = call_forced("sm90", step)
            torch.cuda.synchronize()
            torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph(backend):
    """A two-layer MLP of sm90 GEMMs under torch.compile(fullgraph=True), forward and backward."""
    if backend == "inductor":
        from torch.utils._triton import has_triton

        if not has_triton():
            pytest.skip("no triton")
    torch._dynamo.reset()
    w1 = randn(512, 1024, dtype=torch.bfloat16).requires_grad_()
    w2 = randn(1024, 256, dtype=torch.bfloat16).requires_grad_()
    x = randn(4, 64, 512, dtype=torch.bfloat16)

    def mlp(x):
        return samattn.gemm(torch.relu(samattn.gemm(x, w1)), w2)

    compiled = torch.compile(mlp, backend=backend, fullgraph=True)
    with samattn.use_family("sm90"):
        eager = mlp(x)
        eager_grads = torch.autograd.grad(eager.float().sum(), (w1, w2))
        got = call_forced("sm90", lambda: compiled(x))
        got_grads = torch.autograd.grad(got.float().sum(), (w1, w2))
    torch.testing.assert_close(got, eager)
    for g, e in zip(got_grads, eager_grads):
        torch.testing.assert_close(g, e)
    torch._dynamo.reset()
