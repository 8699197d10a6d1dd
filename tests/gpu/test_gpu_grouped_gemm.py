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

    grads = _run(family, dtype_, step)
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


def _weight_gradient_reference(a: torch.Tensor, b: torch.Tensor, loads: list[int]) -> torch.Tensor:
    """out[g] = a[:, ks] @ b[ks, :] over group g's K range ks, in fp64."""
    out = torch.zeros(len(loads), a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
    begin = 0
    for g, count in enumerate(loads):
        out[g] = a[:, begin : begin + count].double() @ b[begin : begin + count].double()
        begin += count
    return out


def _weight_gradient_loop(a: torch.Tensor, b: torch.Tensor, loads: list[int]) -> torch.Tensor:
    out = torch.zeros(len(loads), a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    begin = 0
    for g, count in enumerate(loads):
        out[g] = a[:, begin : begin + count] @ b[begin : begin + count]
        begin += count
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loads", LOADS)
@pytest.mark.parametrize("tail", [0, 37], ids=["no_tail", "tail"])
def test_weight_gradient_matches_the_reference(family, dtype, loads, tail):
    """The K-grouped GEMM (grad_w = x_g^T dy_g per expert) called directly, so that the
    family that ran it is this thread's: x.mT (unit stride along M) against dy; experts
    with no rows get a zero gradient; rows after the last end take no part."""
    dtype_ = DTYPES[dtype]
    counts = LOADS[loads]
    hidden, n = 136, 200
    tokens = sum(counts) + tail
    x = randn(tokens, hidden, dtype=dtype_)
    dy = randn(tokens, n, dtype=dtype_, scale=1 / math.sqrt(max(max(counts), 1)))
    offsets = _offsets(counts)
    poison_allocator((len(counts), hidden, n), dtype_)
    got = _run(family, dtype_, lambda: torch.ops.samattn.grouped_gemm_k(x.mT, dy, offsets))
    if got is None:
        return
    ref = _weight_gradient_reference(x.mT, dy, counts)
    floor = gemm_floor(dtype_, max(max(counts), 1), tf32=False)
    what = f"{family} {dtype} {loads} tail={tail} weight gradient"
    assert_close_to_reference(got, ref, _weight_gradient_loop(x.mT, dy, counts), floor, what)
    for g, count in enumerate(counts):
        if count == 0:
            assert torch.all(got[g] == 0), f"{what}: expert {g} has no rows, so a zero gradient"


@pytest.mark.parametrize(
    ("hidden", "n", "row_stride", "aligned"),
    [(136, 200, 136, True), (128, 64, 160, True), (100, 64, 100, False), (128, 60, 128, False)],
)
def test_weight_gradient_sizes_and_strides(family, hidden, n, row_stride, aligned):
    """x as a view with a wider row stride; a hidden size or N that is not whole 16 bytes
    goes to sm80 (TMA cannot step the groups' K ranges)."""
    counts = [0, 300, 1, 64, 0]
    tokens = sum(counts) + 5
    x = randn(tokens, row_stride, dtype=torch.bfloat16)[:, :hidden]
    dy = randn(tokens, n, dtype=torch.bfloat16, scale=0.1)
    expected = _expected(family, torch.bfloat16, aligned)
    got = _run(
        family,
        torch.bfloat16,
        lambda: torch.ops.samattn.grouped_gemm_k(x.mT, dy, _offsets(counts)),
        expected=expected,
    )
    if got is None:
        return
    ref = _weight_gradient_reference(x.mT, dy, counts)
    floor = gemm_floor(torch.bfloat16, 300, tf32=False)
    loop = _weight_gradient_loop(x.mT, dy, counts)
    assert_close_to_reference(got, ref, loop, floor, f"{family} {hidden}x{n} stride {row_stride}")
    assert torch.all(got[0] == 0) and torch.all(got[4] == 0)


def test_weight_gradient_under_graphs_and_bad_offsets(family):
    """A captured weight gradient follows new routing on replay; wrong ends are clamped
    (no access outside the tensors)."""
    counts = [64, 0, 100, 3]
    tokens, hidden, n = sum(counts), 128, 96
    x = randn(tokens, hidden, dtype=torch.float16)
    dy = randn(tokens, n, dtype=torch.float16)
    offsets = _offsets(counts)
    with samattn.use_family(family):
        graph, captured = capture_graph(lambda: torch.ops.samattn.grouped_gemm_k(x.mT, dy, offsets))
        offsets.copy_(_offsets([0, 150, 10, 7]))
        graph.replay()
        after = torch.ops.samattn.grouped_gemm_k(x.mT, dy, offsets)
        assert torch.equal(captured, after)
        for bad in ([50, 20, 90, 100], [-5, 10, 1000, 2**31 - 1]):
            offsets.copy_(torch.tensor(bad, dtype=torch.int32))
            torch.ops.samattn.grouped_gemm_k(x.mT, dy, offsets)
            assert_cuda_healthy()


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


# ------------------------------------------------------------ GEMM lists ----
# (M, N, K) of independent GEMMs: odd M, one row, no K (zeros), no rows, a long K.
LIST_SIZES = [(130, 200, 264), (1, 8, 16), (77, 64, 0), (0, 24, 40), (300, 136, 72), (5, 40, 1000)]


def _list_operands(sizes, dtype, layout: str):
    """as_ (M, K) row-major; bs (K, N) row-major ("kn"), as transposed views of (N, K)
    ("nk"), or alternating ("mixed")."""
    as_ = [randn(m, k, dtype=dtype, scale=1 / math.sqrt(max(k, 1))) for m, _, k in sizes]
    bs = []
    for i, (_, n, k) in enumerate(sizes):
        transposed = layout == "nk" or (layout == "mixed" and i % 2 == 1)
        bs.append(randn(n, k, dtype=dtype).mT if transposed else randn(k, n, dtype=dtype))
    return as_, bs


def _check_list(got, as_, bs, what: str) -> None:
    assert len(got) == len(as_)
    for i, (out, a, b) in enumerate(zip(got, as_, bs)):
        assert out.shape == (a.shape[0], b.shape[1]) and out.is_contiguous()
        k = a.shape[1]
        if k == 0:
            assert torch.all(out == 0), f"{what}[{i}]: K = 0 gives zeros"
            continue
        floor = gemm_floor(a.dtype, k, tf32=False) + 16 * UNIT_ROUNDOFF[torch.float32]
        assert_close_to_reference(out, a.double() @ b.double(), a @ b, floor, f"{what}[{i}]")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["kn", "nk", "mixed"])
def test_grouped_gemm_list_matches_the_reference(family, dtype, layout):
    """sm90 runs a list whose bs share one layout in one launch; a mixed list goes to
    sm80 (one GEMM after another), as does everything on older families."""
    dtype_ = DTYPES[dtype]
    as_, bs = _list_operands(LIST_SIZES, dtype_, layout)
    poison_allocator((300, 136), dtype_)
    expected = "sm80" if family == "sm90" and layout == "mixed" else family
    got = call_forced(family, lambda: samattn.grouped_gemm_list(as_, bs), expected=expected)
    _check_list(got, as_, bs, f"{family} {dtype} {layout}")


def test_grouped_gemm_list_sizes_sm90_hands_over(family):
    """K or N not whole 16 bytes, or a with a row stride TMA cannot step, runs on sm80."""
    sizes = [(64, 64, 64), (33, 40, 100)]
    as_, bs = _list_operands(sizes, torch.bfloat16, "kn")
    expected = "sm80" if family == "sm90" else family
    got = call_forced(family, lambda: samattn.grouped_gemm_list(as_, bs), expected=expected)
    _check_list(got, as_, bs, f"{family} unaligned")
    # Strided rows of whole 16 bytes are read in place on sm90.
    wide = [randn(m, k + 8, dtype=torch.bfloat16)[:, :k] for m, _, k in [(70, 48, 32)]]
    narrow = [randn(32, 48, dtype=torch.bfloat16)]
    got = call_forced(family, lambda: samattn.grouped_gemm_list(wide, narrow))
    _check_list(got, wide, narrow, f"{family} strided a")


def test_grouped_gemm_list_of_many(family):
    """More GEMMs than one prepare launch describes (32), with K = 0 in a later chunk."""
    sizes = [(8 + 24 * (i % 5), 8 * (1 + i % 7), 0 if i % 37 == 36 else 8 * (1 + i % 11))
             for i in range(100)]  # fmt: skip
    as_, bs = _list_operands(sizes, torch.float16, "kn")
    got = call_forced(family, lambda: samattn.grouped_gemm_list(as_, bs))
    _check_list(got, as_, bs, f"{family} many")


def _gemm_kernel_launches(run) -> tuple[int, int] | None:
    """(list kernel launches, plain tensor-core GEMM launches) while `run` runs, from
    torch's profiler; None when it records no kernel at all (no CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not names:
        return None
    lists = sum("gemm_tensor_core_list_kernel" in n for n in names)
    plain = sum("gemm_tensor_core_kernel<" in n for n in names)
    return lists, plain


@pytest.mark.parametrize("count", [4, 70])
def test_grouped_gemm_list_is_one_launch_per_32(family, count):
    """On the mma.sync families a list of one layout runs in one launch per 32 GEMMs, not
    one per GEMM; a list of two layouts in one per layout."""
    if family not in ("sm80", "sm75"):
        pytest.skip("the sm80 and sm75 list kernel; sm90 has its own")
    sizes = [(8 + 24 * (i % 5), 8 * (1 + i % 7), 8 * (1 + i % 11)) for i in range(count)]
    for layout, launches in (("kn", -(-count // 32)), ("mixed", None)):
        as_, bs = _list_operands(sizes, torch.float16, layout)
        with samattn.use_family(family):
            got = samattn.grouped_gemm_list(as_, bs)
            seen = _gemm_kernel_launches(lambda: samattn.grouped_gemm_list(as_, bs))  # noqa: B023
        _check_list(got, as_, bs, f"{family} {layout} {count}")
        if seen is None:
            pytest.skip("torch's profiler records no CUDA kernels here")
        lists, plain = seen
        assert plain == 0, f"{layout}: {plain} per-GEMM launches"
        if launches is None:  # two layouts of B: one launch per layout per 32 GEMMs
            assert 2 <= lists <= 2 * -(-count // 32), f"{layout}: {lists} launches"
        else:
            assert lists == launches, f"{layout}: {lists} launches"


def test_grouped_gemm_list_gradients(family):
    as_, bs = _list_operands(LIST_SIZES[:3] + LIST_SIZES[4:], torch.bfloat16, "kn")
    as_ = [a.requires_grad_() for a in as_]
    bs = [b.requires_grad_() for b in bs]
    douts = [randn(a.shape[0], b.shape[1], dtype=torch.bfloat16) for a, b in zip(as_, bs)]

    def step():
        outs = samattn.grouped_gemm_list(as_, bs)
        return torch.autograd.grad(outs, (*as_, *bs), douts)

    grads = call_forced(family, step, expected=("sm90", "sm80") if family == "sm90" else family)
    count = len(as_)
    for i, (a, b, dout) in enumerate(zip(as_, bs, douts)):
        k = a.shape[1]
        if k == 0:
            assert grads[i].shape == a.shape and grads[count + i].shape == b.shape
            continue
        ref_a = dout.double() @ b.double().mT
        ref_b = a.double().mT @ dout.double()
        floor_a = gemm_floor(torch.bfloat16, b.shape[1], tf32=False)
        floor_b = gemm_floor(torch.bfloat16, a.shape[0], tf32=False)
        assert_close_to_reference(grads[i], ref_a, dout @ b.mT, floor_a, f"{family} da[{i}]")
        base_b = a.detach().mT @ dout
        assert_close_to_reference(grads[count + i], ref_b, base_b, floor_b, f"{family} db[{i}]")


def test_grouped_gemm_list_under_compile_and_graphs(family):
    """Compiled (fullgraph) as eager; a captured list replays on the values its tensors
    hold then."""
    as_, bs = _list_operands(LIST_SIZES, torch.float16, "nk")
    with samattn.use_family(family):
        eager = samattn.grouped_gemm_list(as_, bs)
        compiled = torch.compile(samattn.grouped_gemm_list, fullgraph=True)(as_, bs)
        for c, e in zip(compiled, eager):
            assert torch.equal(c, e)
        graph, captured = capture_graph(lambda: samattn.grouped_gemm_list(as_, bs))
        for t in (*as_, *bs):
            t.copy_(torch.randn_like(t, dtype=torch.float32).to(t.dtype))
        graph.replay()
        after = samattn.grouped_gemm_list(as_, bs)
    for c, e in zip(captured, after):
        assert torch.equal(c, e)
