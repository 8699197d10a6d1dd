"""Fake implementations and autograd under torch.compile, without a GPU.

Meta tensors and FakeTensors (which may claim a CUDA device here) run only the fake
implementations. The autograd formulas are checked with gradcheck by swapping the CUDA
implementations for float64 CPU references, so that only the wiring is under test.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import samattn
from samattn import _cuda, _family, ops

# Fake CUDA tensors on a second device need no GPU, but on a machine with one GPU torch
# checks the ordinal and refuses cuda:1.
needs_fake_cuda1 = pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2,
    reason="fake cuda:1 tensors are refused where exactly one GPU is visible",
)


def meta(*shape: int, dtype: torch.dtype = torch.float16, grad: bool = False) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)


def model(a, b, c):
    return samattn.softmax(samattn.gemm(a, b, c, alpha=0.5, beta=2.0), dim=1)


GEMM_SHAPES = [
    # a, b, c -> output
    ((4, 5), (5, 6), (4, 6), (4, 6)),
    ((3, 4, 5), (5, 6), (6,), (3, 4, 6)),
    ((1, 4, 5), (3, 5, 6), (4, 1), (3, 4, 6)),
    ((4, 5), (3, 5, 6), (3, 1, 6), (3, 4, 6)),
    ((3, 4, 5), (3, 5, 6), (), (3, 4, 6)),
]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("shapes", GEMM_SHAPES, ids=str)
def test_compiled_shapes_and_gradients(backend, shapes):
    a_shape, b_shape, c_shape, out_shape = shapes
    torch._dynamo.reset()
    a, b, c = (meta(*s, dtype=torch.bfloat16, grad=True) for s in (a_shape, b_shape, c_shape))
    out = torch.compile(model, fullgraph=True, backend=backend)(a, b, c)
    assert out.shape == out_shape and out.dtype == torch.bfloat16 and out.device.type == "meta"
    out.sum().backward()
    assert (a.grad.shape, b.grad.shape, c.grad.shape) == (a.shape, b.shape, c.shape)
    assert a.grad.dtype == b.grad.dtype == c.grad.dtype == torch.bfloat16


def test_no_graph_break():
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(meta(2, 4, 5), meta(5, 6), meta(6))
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1


@needs_fake_cuda1
def test_fake_cuda_tensors_keep_device_and_dtype():
    with FakeTensorMode():
        a = torch.empty(2, 8, 16, dtype=torch.float16, device="cuda")
        b = torch.empty(16, 4, dtype=torch.float16, device="cuda")
        out = samattn.gemm(a, b)
        assert out.shape == (2, 8, 4) and out.device.type == "cuda"
        y = samattn.softmax(torch.empty(3, 5, 7, dtype=torch.float32, device="cuda:1"), dim=0)
        assert y.shape == (3, 5, 7) and y.device == torch.device("cuda:1")
        dx = torch.ops.samattn.softmax_backward(y, torch.empty_like(y), 0)
        assert dx.shape == y.shape and dx.device == y.device


@pytest.mark.parametrize(
    "op, args",
    [
        ("gemm", (meta(4, 5), meta(2, 5, 6), meta(6), 1.0, 1.0)),
        ("gemm", (meta(4, 5), meta(5, 6), None, 2.0, 0.0)),
        ("softmax", (meta(3, 7), 0)),
        ("softmax_backward", (meta(3, 7), meta(3, 7), -1)),
    ],
)
def test_opcheck(op, args):
    torch.library.opcheck(getattr(torch.ops.samattn, op).default, args)


# ---------------------------------------------------- autograd formulas ----
class References:
    """float64 CPU stand-ins for the CUDA implementations; records what they were given."""

    def __init__(self) -> None:
        self.gemm_calls: list[dict] = []
        self.softmax_families: list[int] = []
        self.list_calls: list[list[tuple]] = []

    def gemm(
        self,
        a,
        b,
        c,
        alpha,
        beta,
        bias=None,
        activation=None,
        out_dtype=None,
        split_k="auto",
        split_k_mode="auto",
    ):
        self.gemm_calls.append(
            {
                "a": a,
                "b": b,
                "family": _family.requested_family(),
                "activation": activation,
                "split_k": (split_k, split_k_mode),
            }
        )
        out = alpha * torch.matmul(a, b)
        if c is not None and beta != 0.0:
            out = out + beta * c
        if bias is not None:
            out = out + bias
        if activation is not None:
            out = ops._activate(out, activation)
        return out.contiguous()

    def softmax(self, x, dim):
        return torch.softmax(x, dim)

    @staticmethod
    def _groups(offsets):
        ends = offsets.tolist()
        return zip([0, *ends[:-1]], ends)

    def grouped_gemm(self, x, w, offsets):
        out = torch.zeros(x.shape[0], w.shape[2], dtype=x.dtype)
        for e, (begin, end) in enumerate(self._groups(offsets)):
            out[begin:end] = x[begin:end] @ w[e]
        return out

    def grouped_gemm_k(self, a, b, offsets):
        return torch.stack([a[:, begin:end] @ b[begin:end] for begin, end in self._groups(offsets)])

    def grouped_gemm_list(self, as_, bs):
        self.list_calls.append([(tuple(a.shape), tuple(b.shape)) for a, b in zip(as_, bs)])
        return [(a @ b).contiguous() for a, b in zip(as_, bs)]

    def softmax_backward(self, y, dy, dim):
        self.softmax_families.append(_family.requested_family())
        return y * (dy - (dy * y).sum(dim, keepdim=True))


@pytest.fixture
def references(monkeypatch) -> References:
    refs = References()
    names = ("gemm", "softmax", "softmax_backward", "grouped_gemm", "grouped_gemm_k")
    for name in (*names, "grouped_gemm_list"):
        monkeypatch.setattr(_cuda, name, getattr(refs, name))
    return refs


def double(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("shapes", GEMM_SHAPES, ids=str)
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, 2.0), (-1.5, 1.0)])
def test_gemm_gradients(references, shapes, alpha, beta):
    a_shape, b_shape, c_shape, _ = shapes
    a, b, c = double(*a_shape), double(*b_shape), double(*c_shape)
    assert torch.autograd.gradcheck(
        lambda a, b, c: samattn.gemm(a, b, c, alpha=alpha, beta=beta), (a, b, c)
    )


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_gemm_epilogue_gradients(references, activation):
    """Training with an activation: the GEMM gives the pre-activation (with its bias), torch's
    activation does the rest; no call fuses the activation."""
    a, b, c, bias = double(3, 4, 5), double(5, 6), double(4, 6), double(6)
    assert torch.autograd.gradcheck(
        lambda a, b, c, bias: samattn.gemm(
            a, b, c, alpha=0.5, beta=2.0, bias=bias, activation=activation
        ),
        (a, b, c, bias),
    )
    assert all(call["activation"] is None for call in references.gemm_calls)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_gemm_op_with_activation_recomputes_in_backward(references, activation):
    a, b, bias = double(7, 5), double(5, 3), double(3)
    assert torch.autograd.gradcheck(
        lambda a, b, bias: torch.ops.samattn.gemm(a, b, None, 1.0, 0.0, bias, activation),
        (a, b, bias),
    )
    with torch.no_grad():
        samattn.gemm(a, b, bias=bias, activation=activation)
    assert references.gemm_calls[-1]["activation"] == activation  # inference: fused


def test_eager_autograd_function_gradients(references):
    """The eager route's autograd.Function (CUDA tensors take it), with and without the
    epilogue's inputs: the same gradients as the op's registered autograd."""
    a, b, bias = double(7, 5), double(5, 3), double(3)
    assert torch.autograd.gradcheck(
        lambda a, b: ops._GemmFunction.apply(a, b, None, 2.0, 0.0), (a, b)
    )
    assert torch.autograd.gradcheck(
        lambda a, b, bias: ops._GemmFunction.apply(a, b, None, 1.0, 0.0, bias, "gelu", None),
        (a, b, bias),
    )


def test_split_k_reaches_the_implementation(references):
    """split_k and split_k_mode travel through every route: the public function (the
    eager autograd.Function for tensors that need gradients), the op, and the backward's
    recomputation of the pre-activation."""
    a, b, bias = double(7, 5), double(5, 3), double(3)
    assert torch.autograd.gradcheck(
        lambda a, b: samattn.gemm(a, b, split_k=4, split_k_mode="parallel"), (a, b)
    )
    assert references.gemm_calls[0]["split_k"] == (4, "parallel")
    references.gemm_calls.clear()
    out = torch.ops.samattn.gemm(a, b, None, 1.0, 0.0, bias, "gelu", None, 8, "serial")
    out.sum().backward()
    assert [call["split_k"] for call in references.gemm_calls[:2]] == [(8, "serial")] * 2
    references.gemm_calls.clear()
    torch.ops.samattn.gemm(a, b, None, 1.0, 0.0)
    assert references.gemm_calls[0]["split_k"] == ("auto", "auto")


@pytest.mark.parametrize(
    "counts", [(3, 0, 5, 1), (9,), (0, 0, 4), (2, 2, 0)], ids=["skewed", "one", "empty", "tail"]
)
def test_grouped_gemm_gradients(references, counts):
    """The grouped GEMM's backward: dx by a rows-grouped GEMM against w^T, dw by the
    K-grouped one; rows after the last end (the "tail" case has 2) get no gradient."""
    tokens = sum(counts) + (2 if counts == (2, 2, 0) else 0)
    x, w = double(tokens, 4), double(len(counts), 4, 3)
    offsets = torch.tensor(counts, dtype=torch.int32).cumsum(0).int()
    assert torch.autograd.gradcheck(lambda x, w: samattn.grouped_gemm(x, w, offsets), (x, w))


def test_grouped_gemm_under_compile():
    torch._dynamo.reset()
    x, w = meta(10, 8, grad=True), meta(4, 8, 6, grad=True)
    offsets = torch.empty(4, dtype=torch.int32, device="meta")
    out = torch.compile(samattn.grouped_gemm, fullgraph=True, backend="aot_eager")(x, w, offsets)
    assert out.shape == (10, 6) and out.device.type == "meta"
    out.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


def test_grouped_gemm_list_gradients(references):
    """da[i] = dout[i] @ b[i]^T and db[i] = a[i]^T @ dout[i], each one list call; a GEMM
    with K = 0 has empty gradients."""
    as_ = [double(3, 4), double(1, 2), double(2, 0)]
    bs = [double(4, 5), double(2, 1), double(0, 3)]

    def call(*tensors):
        return tuple(samattn.grouped_gemm_list(tensors[:3], tensors[3:]))

    assert torch.autograd.gradcheck(call, (*as_, *bs))
    references.list_calls.clear()
    sum(out.sum() for out in call(*as_, *bs)).backward()
    _forward, grad_as, grad_bs = references.list_calls
    assert grad_as == [((3, 5), (5, 4)), ((1, 1), (1, 2)), ((2, 3), (3, 0))]
    assert grad_bs == [((4, 3), (3, 5)), ((2, 1), (1, 1)), ((0, 2), (2, 3))]


def test_grouped_gemm_list_under_compile():
    torch._dynamo.reset()
    as_ = [meta(10, 8, grad=True), meta(3, 16, grad=True)]
    bs = [meta(8, 6, grad=True), meta(16, 24, grad=True)]
    outs = torch.compile(samattn.grouped_gemm_list, fullgraph=True, backend="aot_eager")(as_, bs)
    assert [o.shape for o in outs] == [(10, 6), (3, 24)]
    sum(o.sum() for o in outs).backward()
    assert all(t.grad.shape == t.shape for t in (*as_, *bs))


def test_linear_gradients(references):
    x, weight, bias = double(2, 3, 5), double(4, 5), double(4)
    assert torch.autograd.gradcheck(
        lambda x, w, b: samattn.linear(x, w, b, activation="silu"), (x, weight, bias)
    )
    out = samattn.linear(x, weight, bias)
    assert out.shape == (2, 3, 4)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, weight, bias))


def test_gemm_backward_uses_transposed_views(references):
    a, b = double(7, 5), double(5, 3)
    samattn.gemm(a, b).sum().backward()
    _forward, grad_a, grad_b = references.gemm_calls
    assert grad_a["b"].data_ptr() == b.data_ptr() and grad_a["b"].shape == (3, 5)
    assert grad_b["a"].data_ptr() == a.data_ptr() and grad_b["a"].shape == (5, 7)


def test_gemm_backward_skips_unneeded_gradients(references):
    a, b = double(7, 5), torch.randn(5, 3, dtype=torch.float64)
    samattn.gemm(a, b).sum().backward()
    assert len(references.gemm_calls) == 2  # forward and dA only


@pytest.mark.parametrize("shape, dim", [((6,), 0), ((4, 5), 1), ((2, 3, 4), 1), ((3, 4), -2)])
def test_softmax_gradients(references, shape, dim):
    assert torch.autograd.gradcheck(lambda x: samattn.softmax(x, dim), (double(*shape),))


def test_backward_replays_the_forward_family(references):
    a, b, x = double(3, 4), double(4, 2), double(3, 5)
    with samattn.use_family("sm75"):
        out = samattn.gemm(a, b).sum() + samattn.softmax(x).sum()
    out.backward()
    assert [call["family"] for call in references.gemm_calls] == [75, 75, 75]
    assert references.softmax_families == [75]
    assert _family.requested_family() == 0
