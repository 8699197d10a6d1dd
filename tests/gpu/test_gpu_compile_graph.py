"""samattn under torch.compile(fullgraph=True) and CUDA graph capture.

The kernels are opaque custom ops to both, so compiled and replayed results
must match eager samattn (to the dtype's default tolerance: inductor may fuse
the elementwise ops between them differently).
"""

from __future__ import annotations

import pytest
import torch
from gpu_checks import COMPLETE_FAMILIES, call_forced, capture_graph, has_triton, randn

import samattn


def attention_like(q, k, v, bias):
    """gemm -> scale -> softmax -> gemm, with a broadcast C on the first gemm."""
    scores = samattn.gemm(q, k.mT, bias, alpha=0.125, beta=1.0)
    return samattn.gemm(samattn.softmax(scores.float(), dim=-1).to(q.dtype), v)


def _inputs(batch, seq, dim, dtype, requires_grad=False):
    q, k, v = (randn(batch, seq, dim, dtype=dtype) for _ in range(3))
    bias = randn(seq, dtype=dtype)  # one row, broadcast over queries and batches
    return [t.requires_grad_(requires_grad) for t in (q, k, v, bias)]


BACKENDS = [
    "aot_eager",
    pytest.param("inductor", marks=pytest.mark.skipif(not has_triton(), reason="no triton")),
]


@pytest.fixture(autouse=True)
def _complete_family_only(request):
    """These mix gemm and softmax; a family without softmax (sm90) has its own compile and
    graph tests (test_gpu_gemm_sm90.py)."""
    family = (
        request.node.callspec.params.get("family") if hasattr(request.node, "callspec") else None
    )
    if family is not None and family not in COMPLETE_FAMILIES:
        pytest.skip(f"{family} runs gemm only: see test_gpu_gemm_sm90.py")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_compile_fullgraph_matches_eager(family, backend, dtype):
    compiled = torch.compile(attention_like, backend=backend, fullgraph=True)
    inputs = _inputs(4, 129, 64, dtype)
    with samattn.use_family(family):
        eager = attention_like(*inputs)
    got = call_forced(family, lambda: compiled(*inputs))
    assert got.shape == eager.shape and got.dtype == eager.dtype
    torch.testing.assert_close(got, eager)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_backward_matches_eager(family, backend):
    compiled = torch.compile(attention_like, backend=backend, fullgraph=True)
    inputs = _inputs(2, 65, 32, torch.float32, requires_grad=True)
    grad_out = randn(2, 65, 32, dtype=torch.float32)

    def grads(fn):
        with samattn.use_family(family):
            out = fn(*inputs)
            return torch.autograd.grad(out, inputs, grad_out)

    for got, want in zip(grads(compiled), grads(attention_like)):
        torch.testing.assert_close(got, want)


def test_compile_dynamic_shapes(family):
    """The fake implementations must follow symbolic shapes: two sizes, one graph."""
    compiled = torch.compile(attention_like, backend="aot_eager", fullgraph=True, dynamic=True)
    for seq in (33, 200):
        inputs = _inputs(2, seq, 16, torch.float16)
        with samattn.use_family(family):
            eager = attention_like(*inputs)
        got = call_forced(family, lambda inputs=inputs: compiled(*inputs))
        torch.testing.assert_close(got, eager)


def test_cuda_graph_replay(family):
    a, b = randn(3, 127, 65, dtype=torch.float16), randn(65, 200, dtype=torch.float16)
    c = randn(200, dtype=torch.float16)
    x = randn(64, 1000, dtype=torch.float32)

    def step():
        return samattn.gemm(a, b, c, alpha=0.5, beta=2.0), samattn.softmax(x, dim=-1)

    with samattn.use_family(family):
        graph, (gemm_out, softmax_out) = capture_graph(step)

        for _ in range(2):  # new inputs each replay
            for t in (a, b, c, x):
                t.copy_(torch.randn_like(t, dtype=torch.float32))
            graph.replay()
            want_gemm, want_softmax = call_forced(family, step)
            torch.cuda.synchronize()
            torch.testing.assert_close(gemm_out, want_gemm)
            torch.testing.assert_close(softmax_out, want_softmax)
            torch.testing.assert_close(
                softmax_out.double(), torch.softmax(x.double(), -1), rtol=1e-5, atol=1e-6
            )
