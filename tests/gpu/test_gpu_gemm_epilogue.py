"""The GEMM epilogue on the GPU: bias, activation and fp32 output of samattn.gemm and
samattn.linear, every forced family, against fp64 references; gradients; torch.compile.

Shapes reach every sm90 tile (128x256, 128x128, stream-K, swap_ab) and sizes TMA cannot
describe (sm90 hands those to sm80).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from gpu_checks import (
    UNIT_ROUNDOFF,
    assert_close_to_reference,
    call_forced,
    capture_graph,
    expected_gemm_family,
    gemm_floor,
    poison_allocator,
    randn,
)
from reference import tf32_matmul

import samattn

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}

# (M, N, K): one shape per sm90 tile, a decode-like M, and odd sizes.
SHAPES = {
    "128x256": (2048, 4096, 256),
    "128x128": (1536, 1536, 512),
    "streamk": (256, 1024, 2048),
    "swap_ab": (16, 1024, 512),
    "odd": (127, 65, 33),
}


def activate64(z: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return z
    if activation == "relu":
        return torch.relu(z)
    if activation == "silu":
        return F.silu(z)
    return F.gelu(z, approximate="tanh" if activation == "gelu_tanh" else "none")


def operand_b(k: int, n: int, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """(K, N): row-major, or a linear layer's weight (N, K) seen transposed."""
    return randn(k, n, dtype=dtype) if layout == "row" else randn(n, k, dtype=dtype).mT


def check_epilogue(family, mode, shape, activation, with_bias, out_dtype, b_layout, c_kind=None):
    dtype = DTYPES[mode]
    torch.set_float32_matmul_precision("high" if mode == "tf32" else "highest")
    m, n, k = shape
    a = randn(m, k, dtype=dtype, scale=1 / math.sqrt(k))
    b = operand_b(k, n, dtype, b_layout)
    bias = randn(n, dtype=dtype) if with_bias else None
    out = out_dtype or dtype
    alpha, beta, c = 1.0, 0.0, None
    if c_kind is not None:
        alpha, beta = 0.75, -0.5
        c = randn(m, n, dtype=out) if c_kind == "full" else randn(n, dtype=out)
    poison_allocator((m, n), out)
    epilogue = dict(bias=bias, activation=activation, out_dtype=out_dtype)
    expected = expected_gemm_family(family, a, b, c, alpha, beta, **epilogue)
    got = call_forced(
        family,
        lambda: samattn.gemm(
            a, b, c, alpha=alpha, beta=beta, bias=bias, activation=activation, out_dtype=out_dtype
        ),
        expected=expected,
    )
    assert got.shape == (m, n) and got.dtype == out and got.is_contiguous()

    z = alpha * (a.double() @ b.double())
    if c is not None:
        z = z + beta * c.double()
    if bias is not None:
        z = z + bias.double()
    ref = activate64(z, activation)
    # torch in the same dtype: matmul, then the epilogue's steps, each rounded.
    if mode == "tf32":
        base = tf32_matmul(a, b)  # cuBLAS may run small problems in exact fp32
    else:
        base = torch.matmul(a, b) if out is dtype else torch.matmul(a.float(), b.float())
    base = alpha * base
    if c is not None:
        base = base + beta * c
    if bias is not None:
        base = base + bias.to(out)
    base = activate64(base, activation)
    floor = gemm_floor(out, k, tf32=mode == "tf32") + 16 * UNIT_ROUNDOFF[torch.float32]
    if out_dtype is torch.float32:
        # fp32 sums of exact 16-bit products: the summation order (sm75 adds k in steps of
        # 8) is the whole error; allow twice the sqrt(K) estimate.
        floor += UNIT_ROUNDOFF[torch.float32] * math.sqrt(k)
    what = f"{family} {mode} {shape} {activation} bias={with_bias} out={out_dtype} b={b_layout}"
    assert_close_to_reference(got, ref, base, floor, what)


@pytest.mark.parametrize("mode", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("b_layout", ["row", "weight"])
def test_epilogue(family, mode, shape, activation, with_bias, b_layout):
    check_epilogue(family, mode, SHAPES[shape], activation, with_bias, None, b_layout)


@pytest.mark.parametrize("mode", ["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("b_layout", ["row", "weight"])
def test_fp32_output(family, mode, shape, activation, b_layout):
    check_epilogue(family, mode, SHAPES[shape], activation, True, torch.float32, b_layout)


@pytest.mark.parametrize("mode", ["bf16", "tf32"])
@pytest.mark.parametrize("shape", ["128x128", "swap_ab", "odd"])
@pytest.mark.parametrize("c_kind", ["full", "row"])
@pytest.mark.parametrize("out_dtype", [None, torch.float32], ids=["out_input", "out_f32"])
def test_epilogue_with_c(family, mode, shape, c_kind, out_dtype):
    if out_dtype is not None and mode == "tf32":
        pytest.skip("fp32 inputs already give an fp32 output")
    check_epilogue(family, mode, SHAPES[shape], "silu", True, out_dtype, "weight", c_kind)


def test_bias_view_and_empty_k(family):
    """A strided bias view (copied), and K = 0: D = act(bias) in every row."""
    a, b = randn(37, 0, dtype=torch.bfloat16), randn(0, 24, dtype=torch.bfloat16)
    bias = randn(48, dtype=torch.bfloat16)[::2]
    got = call_forced(
        family,
        lambda: samattn.gemm(a, b, bias=bias, activation="gelu"),
        expected=family if family != "sm90" else "sm80",  # sm90 declines k == 0
    )
    ref = F.gelu(bias.double()).expand(37, 24)
    assert_close_to_reference(got, ref, ref.to(torch.bfloat16), UNIT_ROUNDOFF[torch.bfloat16])


@pytest.mark.parametrize("mode", ["f16", "bf16", "tf32"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_linear_backward(family, mode, activation, with_bias):
    """Gradients of x, weight and bias through samattn.linear against fp64 autograd."""
    dtype = DTYPES[mode]
    torch.set_float32_matmul_precision("high" if mode == "tf32" else "highest")
    x = randn(3, 41, 96, dtype=dtype)
    weight = randn(72, 96, dtype=dtype, scale=0.1)
    bias = randn(72, dtype=dtype) if with_bias else None
    inputs = [t for t in (x, weight, bias) if t is not None]
    grad_out = randn(3, 41, 72, dtype=dtype)

    def grads(tensors, fn):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        out = fn(*leaves)
        return out, torch.autograd.grad(out, leaves, grad_out.to(out.dtype))

    def torch_linear(x, w, b=None):
        return activate64(F.linear(x, w, b), activation)

    def samattn_linear(x, w, b=None):
        return samattn.linear(x, w, b, activation=activation)

    with samattn.use_family(family):
        out, got = grads(inputs, samattn_linear)
    ref_out, ref = grads([t.double() for t in inputs], torch_linear)
    base_out, base = grads(inputs, torch_linear)
    floor = gemm_floor(dtype, 3 * 41, tf32=mode == "tf32") + 16 * UNIT_ROUNDOFF[torch.float32]
    what = f"{family} {mode} {activation} bias={with_bias}"
    assert_close_to_reference(out, ref_out, base_out, floor, f"{what} out")
    for name, g, r, b0, t in zip(("x", "weight", "bias"), got, ref, base, inputs):
        assert g.shape == t.shape and g.dtype == t.dtype, name
        assert_close_to_reference(g, r, b0, floor, f"{what} grad {name}")


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_op_backward_recomputes_the_pre_activation(family, activation):
    """torch.ops.samattn.gemm with an activation fused, differentiated directly: its
    backward recomputes the pre-activation."""
    a, b = randn(65, 48, dtype=torch.bfloat16), randn(48, 40, dtype=torch.bfloat16)
    bias = randn(40, dtype=torch.bfloat16)
    leaves = [t.clone().requires_grad_() for t in (a, b, bias)]
    grad_out = randn(65, 40, dtype=torch.bfloat16)
    with samattn.use_family(family):
        out = torch.ops.samattn.gemm(leaves[0], leaves[1], None, 1.0, 0.0, leaves[2], activation)
        got = torch.autograd.grad(out, leaves, grad_out)
    ref_leaves = [t.double().requires_grad_() for t in (a, b, bias)]
    ref_out = activate64(ref_leaves[0] @ ref_leaves[1] + ref_leaves[2], activation)
    ref = torch.autograd.grad(ref_out, ref_leaves, grad_out.double())
    floor = gemm_floor(torch.bfloat16, 65, tf32=False) + 16 * UNIT_ROUNDOFF[torch.float32]
    for name, g, r in zip("ab", got, ref):
        assert_close_to_reference(g, r, r.to(torch.bfloat16), 4 * floor, f"grad {name}")
    assert_close_to_reference(got[2], ref[2], ref[2].to(torch.bfloat16), 4 * floor, "grad bias")


def test_linear_under_torch_compile():
    """fullgraph compile of linear + GELU, inference and training, equals eager."""
    x = randn(4, 33, 128, dtype=torch.bfloat16)
    weight = randn(256, 128, dtype=torch.bfloat16, scale=0.1)
    bias = randn(256, dtype=torch.bfloat16)

    def step(x, w, b):
        return samattn.linear(x, w, b, activation="gelu_tanh")

    compiled = torch.compile(step, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x, weight, bias), step(x, weight, bias))
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    eager_leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    compiled(*leaves).float().square().sum().backward()
    step(*eager_leaves).float().square().sum().backward()
    for got, ref in zip(leaves, eager_leaves):
        torch.testing.assert_close(got.grad, ref.grad, rtol=2e-2, atol=2e-2)


def test_epilogue_in_a_cuda_graph():
    """The fused call replays in a CUDA graph with new inputs."""
    a = randn(256, 512, dtype=torch.float16)
    w = randn(384, 512, dtype=torch.float16, scale=0.05)
    bias = randn(384, dtype=torch.float16)
    graph, out = capture_graph(lambda: samattn.linear(a, w, bias, activation="silu"))
    a.copy_(randn(256, 512, dtype=torch.float16))
    graph.replay()
    ref = F.silu(F.linear(a.double(), w.double(), bias.double()))
    assert_close_to_reference(out, ref, ref.to(torch.float16), 4 * UNIT_ROUNDOFF[torch.float16])
