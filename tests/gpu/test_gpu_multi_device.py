"""Two GPUs: every op runs on the device of its tensors, whichever device is current.

PyTorch code moves between devices freely: a model split over GPUs (transformers'
``device_map="auto"``), replicas driven from one thread or from one thread per device,
a CUDA graph captured on the second GPU. Each test runs a call on tensors of one device
while the other device is current, runs the same call on copies of the inputs on the
current device, and checks that

- the outputs (and gradients) live on their inputs' device,
- they equal the current device's results bit for bit (two GPUs of one model run the same
  family and kernels; the backward tests ask for the deterministic mode, the decode a
  fixed split),
- they match a float64 (float32 for attention) reference within the dtype's rounding,
- neither device is left with a CUDA error.

Skipped with fewer than two GPUs.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch
from gpu_checks import COMPLETE_FAMILIES, UNIT_ROUNDOFF, runnable_families
from reference import allowed_keys, attention

import samattn

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two GPUs (torch.cuda.device_count() < 2)"
)

# (the tensors' device, the current device)
PLACEMENTS = [(1, 0), (0, 1)]


@pytest.fixture(params=PLACEMENTS, ids=["tensors_on_1_current_0", "tensors_on_0_current_1"])
def placement(request) -> tuple[int, int]:
    return request.param


def cuda(index: int) -> torch.device:
    return torch.device("cuda", index)


def inputs_on(index: int, *shapes, dtype: torch.dtype, seed: int = 0, scale: float = 1.0):
    """Normal random tensors of these shapes on cuda:index, the same values for a seed
    whatever the device (drawn on the CPU)."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(*shape, generator=generator) * scale).to(dtype).to(cuda(index))
        for shape in shapes
    ]


def copies(tensors, index: int):
    """The tensors (None kept) copied to cuda:index, with their requires_grad."""
    out = []
    for t in tensors:
        if t is None:
            out.append(None)
            continue
        c = t.detach().to(cuda(index))
        out.append(c.requires_grad_(t.requires_grad))
    return out


def flat(result) -> list[torch.Tensor]:
    """The tensors of a result (a tensor, or nested tuples and lists of them, Nones skipped)."""
    if isinstance(result, torch.Tensor):
        return [result]
    if result is None:
        return []
    return [t for part in result for t in flat(part)]


def run(fn, tensors, current: int, family: str | None = None):
    """fn(*tensors) with cuda:current the current device (and the family forced). A family
    that does not have the op (sm90 has no softmax) skips, as gpu_checks.call_forced does."""
    try:
        with torch.cuda.device(current), samattn.use_family(family):
            return fn(*tensors)
    except samattn.UnsupportedError as error:
        if family in COMPLETE_FAMILIES:
            raise
        pytest.skip(f"{family}: {str(error).splitlines()[0]}")


def assert_healthy() -> None:
    for index in range(2):
        torch.cuda.synchronize(index)
        torch.ones(1, device=cuda(index)).add_(1).item()


def check_twins(fn, tensors, placement, family=None, exact=True):
    """Run fn on `tensors` (on placement's data device) and on their copies on the
    current device; the results must live on their inputs' devices and agree (bit for
    bit when exact). Returns the data device's result."""
    data, current = placement
    twin_inputs = copies(tensors, current)
    result = run(fn, tensors, current, family)
    twin = run(fn, twin_inputs, current, family)
    ours, theirs = flat(result), flat(twin)
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.device == cuda(data), f"output {i} is on {a.device}, its inputs on cuda:{data}"
        assert b.device == cuda(current)
        if exact:
            assert torch.equal(a.cpu(), b.cpu()), f"output {i} differs between the devices"
        else:
            torch.testing.assert_close(a.cpu(), b.cpu())
    assert_healthy()
    return result


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, k: int = 1) -> None:
    """out within a few roundings of dtype (accumulated over k terms) of the reference."""
    unit = UNIT_ROUNDOFF[dtype]
    scale = ref.abs().max().item() or 1.0
    tol = (4 * unit + 1e-6 * math.sqrt(k)) * scale
    err = (out.double().cpu() - ref.double().cpu()).abs().max().item()
    assert err <= tol, f"max abs error {err:.3g} above {tol:.3g}"


# ------------------------------------------------------------------- GEMM ----
@pytest.mark.parametrize("shape", [(257, 129, 200), (64, 64, 64), (3, 65, 40, 72)], ids=str)
def test_gemm(family, placement, shape):
    batch = shape[:-3]
    m, k, n = shape[-3:]
    a, b = inputs_on(placement[0], (*batch, m, k), (*batch, k, n), dtype=torch.float16)
    out = check_twins(samattn.gemm, [a, b], placement, family)
    assert_matches(out, a.double() @ b.double(), torch.float16, k)


def test_gemm_epilogue_split_k_and_linear(placement):
    data = placement[0]
    a, b, bias = inputs_on(data, (96, 4096), (4096, 160), (160,), dtype=torch.bfloat16)
    ref = a.double() @ b.double()

    def epilogue(a, b, bias):
        return samattn.gemm(a, b, bias=bias, activation="gelu", out_dtype=torch.float32)

    out = check_twins(epilogue, [a, b, bias], placement)
    torch.testing.assert_close(
        out.double(), torch.nn.functional.gelu(ref + bias.double()), rtol=2e-2, atol=2e-2
    )
    for split in (4, "auto"):
        out = check_twins(lambda a, b, s=split: samattn.gemm(a, b, split_k=s), [a, b], placement)
        assert_matches(out, ref, torch.bfloat16, 4096)
    # A small output with a long K: split-K on Hopper by default.
    x, y = inputs_on(data, (64, 16384), (16384, 64), dtype=torch.bfloat16, seed=1)
    out = check_twins(samattn.gemm, [x, y], placement)
    assert_matches(out, x.double() @ y.double(), torch.bfloat16, 16384)
    weight = inputs_on(data, (160, 4096), dtype=torch.bfloat16, seed=2)[0]
    out = check_twins(lambda x, w, b: samattn.linear(x, w, b, "silu"), [a, weight, bias], placement)
    ref = torch.nn.functional.silu(a.double() @ weight.double().T + bias.double())
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)


def test_gemm_gradients(family, placement):
    a, b = inputs_on(placement[0], (70, 48), (48, 36), dtype=torch.float16)
    a.requires_grad_(True)
    b.requires_grad_(True)
    dout = inputs_on(placement[0], (70, 36), dtype=torch.float16, seed=5)[0]

    def step(a, b, dout):
        out = samattn.gemm(a, b)
        return (out, *torch.autograd.grad(out, (a, b), dout))

    _out, da, db = check_twins(step, [a, b, dout], placement, family)
    assert_matches(da, dout.double() @ b.double().T, torch.float16, 36)
    assert_matches(db, a.double().T @ dout.double(), torch.float16, 70)


def grouped_reference(x, w, offsets):
    ends = offsets.tolist()
    starts = [0, *ends[:-1]]
    return torch.cat(
        [x[s:e].double() @ w[i].double() for i, (s, e) in enumerate(zip(starts, ends))]
    )


def test_grouped_gemm_and_its_gradients(family, placement):
    data = placement[0]
    dtype = torch.float16
    x, w, dy = inputs_on(data, (300, 64), (5, 64, 96), (300, 96), dtype=dtype)
    offsets = torch.tensor([40, 40, 170, 290, 300], dtype=torch.int32, device=cuda(data))
    x.requires_grad_(True)
    w.requires_grad_(True)

    def step(x, w, offsets, dy):
        y = samattn.grouped_gemm(x, w, offsets)
        return (y, *torch.autograd.grad(y, (x, w), dy))

    y, dx, dw = check_twins(step, [x, w, offsets, dy], placement, family)
    assert_matches(y, grouped_reference(x.detach(), w.detach(), offsets), dtype, 64)
    assert_matches(dx, grouped_reference(dy, w.detach().transpose(1, 2), offsets), dtype, 96)
    assert torch.all(dw[1] == 0), "an expert with no rows has a zero weight gradient"
    assert_matches(dw[2], x.detach()[40:170].double().T @ dy[40:170].double(), dtype, 130)


def test_grouped_gemm_list(family, placement):
    data = placement[0]
    shapes = [((17, 40), (40, 24)), ((64, 64), (64, 8)), ((5, 128), (128, 200))]
    tensors = inputs_on(data, *[s for pair in shapes for s in pair], dtype=torch.float16)
    as_, bs = tensors[0::2], tensors[1::2]
    outs = check_twins(
        lambda *t: samattn.grouped_gemm_list(list(t[0::2]), list(t[1::2])), tensors, placement,
        family,
    )  # fmt: skip
    for out, a, b in zip(outs, as_, bs):
        assert_matches(out, a.double() @ b.double(), torch.float16, a.shape[1])


# ---------------------------------------------------------------- softmax ----
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("shape, dim", [((33, 1000), -1), ((7, 300, 5), 1)], ids=str)
def test_softmax_and_its_gradient(family, placement, dtype, shape, dim):
    x, dy = inputs_on(placement[0], shape, shape, dtype=dtype, scale=3.0)
    x.requires_grad_(True)

    def step(x, dy):
        y = samattn.softmax(x, dim)
        return y, torch.autograd.grad(y, x, dy)[0]

    y, dx = check_twins(step, [x, dy], placement, family)
    ref = torch.softmax(x.detach().double(), dim)
    assert_matches(y, ref, dtype)
    ref_dx = ref * (dy.double() - (dy.double() * ref).sum(dim, keepdim=True))
    assert_matches(dx, ref_dx, dtype, shape[dim])


# -------------------------------------------------------------- attention ----
def attention_reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, keep=None):
    """out (b, sq, h, d) in float32 on q's device: test_gpu_attention's reference with its
    window rule; keep: None or a bool mask broadcastable to (b, h, sq, sk)."""
    mask = allowed_keys(q.shape[1], k.shape[1], causal, window).to(q.device)
    if keep is not None:
        mask = mask & keep
    return attention(q, k, v, q.shape[-1] ** -0.5, softcap, mask, torch.float32)[0]


def attention_step(**kwargs):
    """flash_attn_func forward and its deterministic backward: (out, lse, dq, dk, dv)."""

    def step(q, k, v, dout):
        out, lse, _ = samattn.flash_attn_func(
            q, k, v, return_attn_probs=True, deterministic=True, **kwargs
        )
        return (out, lse, *torch.autograd.grad(out, (q, k, v), dout))

    return step


def qkv_on(index, b, sq, sk, h, hk, d, dtype, seed=0):
    q, k, v, dout = inputs_on(
        index, (b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d), (b, sq, h, d), dtype=dtype, seed=seed
    )
    for t in (q, k, v):
        t.requires_grad_(True)
    return [q, k, v, dout]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attn_func(family, placement, d, causal):
    dtype = torch.float16
    tensors = qkv_on(placement[0], 2, 200, 333, 4, 2, d, dtype)
    out, _lse, dq, dk, dv = check_twins(attention_step(causal=causal), tensors, placement, family)
    q, k, v, dout = (t.detach() for t in tensors)
    assert_matches(out, attention_reference(q, k, v, causal), dtype, 333)
    # The gradient through the float32 reference.
    qr, kr, vr = (t.float().requires_grad_(True) for t in (q, k, v))
    ref = attention_reference(qr, kr, vr, causal)
    grads = torch.autograd.grad(ref, (qr, kr, vr), dout.float())
    for got, want, name in zip((dq, dk, dv), grads, "qkv"):
        torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2, msg=f"d{name}")


def test_sm90_attention_at_every_head_dim_it_runs(placement):
    """The sm90 forward (TMA descriptors, the persistent grid) at each of its head dims."""
    if "sm90" not in runnable_families():
        pytest.skip("no sm90 family on this GPU")
    for d in (64, 128, 256):
        tensors = qkv_on(placement[0], 1, 512, 512, 8, 8, d, torch.bfloat16, seed=d)
        out = check_twins(
            lambda q, k, v, dout: samattn.flash_attn_func(q, k, v, causal=True), tensors,
            placement, "sm90",
        )  # fmt: skip
        q, k, v, _ = (t.detach() for t in tensors)
        assert_matches(out, attention_reference(q, k, v, causal=True), torch.bfloat16, 512)


def test_attention_features(placement):
    """Window and softcap, ALiBi, sinks (with their gradient), GQA, bf16, automatic family."""
    data = placement[0]
    dtype = torch.bfloat16
    tensors = qkv_on(data, 2, 150, 150, 8, 2, 64, dtype, seed=3)
    out, *_ = check_twins(attention_step(window_size=(40, 7), softcap=20.0), tensors, placement)
    q, k, v, _ = (t.detach() for t in tensors)
    assert_matches(out, attention_reference(q, k, v, window=(40, 7), softcap=20.0), dtype, 150)

    slopes = torch.linspace(0.05, 0.5, 8, device=cuda(data))
    sinks = torch.linspace(-1.0, 1.0, 8, device=cuda(data)).requires_grad_(True)

    def terms(q, k, v, dout, slopes, sinks):
        out = samattn.flash_attn_func(
            q, k, v, causal=True, alibi_slopes=slopes, sinks=sinks, deterministic=True
        )
        return (out, *torch.autograd.grad(out, (q, k, v, sinks), dout))

    check_twins(terms, [*tensors, slopes, sinks], placement)


def test_attention_dropout_draws_from_the_tensors_device(placement):
    """The seed comes from the generator of the tensors' device: with both generators
    seeded alike, both devices drop the same entries; a second call drops others."""
    data, current = placement
    tensors = qkv_on(data, 2, 128, 128, 4, 4, 64, torch.bfloat16, seed=4)
    twin = copies(tensors, current)

    def dropped(tensors):
        q, k, v, dout = tensors
        with torch.cuda.device(current):
            out = samattn.flash_attn_func(q, k, v, dropout_p=0.25, deterministic=True)
            return (out, *torch.autograd.grad(out, (q, k, v), dout))

    torch.cuda.manual_seed_all(1234)
    first = dropped(tensors)
    second = dropped(tensors)
    torch.cuda.manual_seed_all(1234)
    first_twin = dropped(twin)
    for a, b in zip(first, first_twin):
        assert a.device == cuda(data)
        assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(first[0], second[0]), "two calls drew the same dropout mask"
    assert_healthy()


def test_varlen(family, placement):
    data = placement[0]
    lengths = [0, 1, 70, 129]
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v, dout = inputs_on(data, *[(total, 4, 64)] * 4, dtype=torch.float16, seed=6)
    for t in (q, k, v):
        t.requires_grad_(True)
    cu = cu.to(cuda(data))

    def step(q, k, v, dout, cu):
        out = samattn.flash_attn_varlen_func(
            q, k, v, cu, cu, max(lengths), max(lengths), causal=True, deterministic=True
        )
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    out, *_ = check_twins(step, [q, k, v, dout, cu], placement, family)
    starts = cu.tolist()
    for s, e in zip(starts[:-1], starts[1:]):
        if e > s:
            ref = attention_reference(*(t.detach()[s:e][None] for t in (q, k, v)), causal=True)
            assert_matches(out[s:e], ref[0], torch.float16, e - s)


def test_sdpa_with_a_mask(placement):
    data = placement[0]
    q, k, v = inputs_on(data, (2, 4, 96, 64), (2, 4, 160, 64), (2, 4, 160, 64), dtype=torch.float16)
    generator = torch.Generator().manual_seed(7)
    keep = (torch.rand(2, 1, 96, 160, generator=generator) > 0.3).to(cuda(data))
    out = check_twins(
        lambda q, k, v, m: samattn.scaled_dot_product_attention(q, k, v, attn_mask=m),
        [q, k, v, keep], placement,
    )  # fmt: skip
    ref = attention_reference(*(t.transpose(1, 2) for t in (q, k, v)), keep=keep).transpose(1, 2)
    assert_matches(out, ref, torch.float16, 160)


# -------------------------------------------------------------- KV cache ----
def test_kvcache_decode_paged(family, placement):
    """A decode step over a paged cache (new keys appended in place, split-KV by default and
    forced), then the cache compared with the twin's."""
    data = placement[0]
    dtype = torch.float16
    b, h, hk, d, page, pages_per_seq = 3, 8, 2, 128, 64, 6
    num_blocks = b * pages_per_seq + 2
    q, k_new, v_new, k_cache, v_cache = inputs_on(
        data, (b, 1, h, d), (b, 1, hk, d), (b, 1, hk, d), (num_blocks, page, hk, d),
        (num_blocks, page, hk, d), dtype=dtype, seed=8,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(9)
    block_table = torch.randperm(num_blocks, generator=generator)[: b * pages_per_seq]
    block_table = block_table.view(b, pages_per_seq).to(torch.int32).to(cuda(data))
    seqlens = torch.tensor([0, 200, 383], dtype=torch.int32, device=cuda(data))
    for splits in (0, 3):

        def decode(q, k_cache, v_cache, k_new, v_new, seqlens, block_table, splits=splits):
            out = samattn.flash_attn_with_kvcache(
                q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                block_table=block_table, num_splits=splits, return_softmax_lse=True,
            )  # fmt: skip
            return (*out, k_cache, v_cache)

        caches = [k_cache.clone(), v_cache.clone()]
        tensors = [q, *caches, k_new, v_new, seqlens, block_table]
        out, _lse, k_after, v_after = check_twins(decode, tensors, placement, family)
    for i in range(b):
        n = int(seqlens[i]) + 1
        rows = torch.arange(n, device=cuda(data))
        pages = block_table[i].long()[rows // page]
        keys, values = k_after[pages, rows % page], v_after[pages, rows % page]
        assert torch.equal(keys[-1], k_new[i, 0]) and torch.equal(values[-1], v_new[i, 0])
        ref = attention_reference(q[i : i + 1], keys[None], values[None])
        assert_matches(out[i : i + 1], ref, dtype, n)


# ------------------------------------------------- graphs, compile, threads ----
def test_cuda_graph_on_the_second_device():
    """Captured and replayed with cuda:1 current; the replay follows new inputs."""
    with torch.cuda.device(1):
        a, b = inputs_on(1, (128, 256), (256, 64), dtype=torch.bfloat16)
        q, k, v, _ = qkv_on(1, 2, 64, 200, 4, 4, 64, torch.bfloat16)
        q, k, v = (t.detach() for t in (q, k, v))
        x = inputs_on(1, (16, 500), dtype=torch.float32)[0]

        def step():
            return samattn.gemm(a, b), samattn.flash_attn_func(q, k, v), samattn.softmax(x)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # A capture stream of this device: torch.cuda.graph's default one is made once per
        # process, on whichever device was current at the first capture.
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            outputs = step()
        for t in (a, b, q, k, v, x):
            t.copy_(torch.randn_like(t, dtype=torch.float32).to(t.dtype))
        graph.replay()
        eager = step()
        torch.cuda.synchronize()
    for captured, fresh in zip(outputs, eager):
        assert captured.device == cuda(1)
        assert torch.equal(captured, fresh)
    assert_healthy()


def test_compiled_training_step_on_the_other_device(placement):
    data, current = placement
    tensors = qkv_on(data, 2, 96, 96, 4, 4, 64, torch.float16, seed=10)
    w = inputs_on(data, (64, 64), dtype=torch.float16, seed=11)[0].requires_grad_(True)

    def loss(q, k, v, w):
        out = samattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
        hidden = samattn.gemm(out.reshape(-1, 64), w)
        return samattn.softmax(hidden.float(), -1).square().sum()

    compiled = torch.compile(loss, fullgraph=True)
    q, k, v, _ = tensors
    with torch.cuda.device(current):
        value = compiled(q, k, v, w)
        grads = torch.autograd.grad(value, (q, k, v, w))
        eager_value = loss(q, k, v, w)
        eager_grads = torch.autograd.grad(eager_value, (q, k, v, w))
    assert value.device == cuda(data)
    torch.testing.assert_close(value, eager_value)
    for got, want in zip(grads, eager_grads):
        assert got.device == cuda(data)
        torch.testing.assert_close(got, want)
    assert_healthy()


def test_one_thread_per_device():
    """Two threads, one per device, each running attention, a GEMM and a softmax with
    gradients in a loop; each result equals the same step run alone."""
    steps = 8

    def work(index: int):
        tensors = qkv_on(index, 2, 130, 130, 4, 2, 64, torch.bfloat16, seed=index)
        a, b = inputs_on(index, (200, 96), (96, 72), dtype=torch.bfloat16, seed=index)
        step = attention_step(causal=True)
        with torch.cuda.device(index):
            return [
                (*step(*tensors), samattn.gemm(a, b), samattn.softmax(a.float()))
                for _ in range(steps)
            ]

    alone = {index: work(index)[0] for index in range(2)}
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def thread(index: int) -> None:
        try:
            results[index] = work(index)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for index in range(2):
        for outputs in results[index]:
            for got, want in zip(outputs, alone[index]):
                assert got.device == cuda(index)
                assert torch.equal(got, want)
    assert_healthy()


def test_same_signature_on_alternating_devices():
    """Calls of one signature (one prepared-call entry) alternate between the devices,
    each with its own data: each result is its own device's."""
    pairs = {i: inputs_on(i, (96, 160), (160, 48), dtype=torch.float16, seed=i) for i in (0, 1)}
    xs = {i: inputs_on(i, (64, 777), dtype=torch.float16, seed=20 + i)[0] for i in (0, 1)}
    qkvs = {i: qkv_on(i, 1, 64, 64, 2, 2, 64, torch.float16, seed=30 + i)[:3] for i in (0, 1)}
    for _ in range(3):
        for i in (0, 1, 1, 0):
            with torch.cuda.device(1 - i):
                out = samattn.gemm(*pairs[i])
                y = samattn.softmax(xs[i])
                attn = samattn.flash_attn_func(*(t.detach() for t in qkvs[i]))
            assert out.device == y.device == attn.device == cuda(i)
            a, b = pairs[i]
            assert_matches(out, a.double() @ b.double(), torch.float16, 160)
            assert_matches(y, torch.softmax(xs[i].double(), -1), torch.float16)
            ref = attention_reference(*(t.detach() for t in qkvs[i]))
            assert_matches(attn, ref, torch.float16, 64)
    assert_healthy()


# ------------------------------------------------------ mixed devices raise ----
def _mixed(name: str):
    """Calls whose tensors sit on two devices, each with the argument that is elsewhere."""
    on0 = lambda *s, dtype=torch.float16: torch.randn(*s, device=cuda(0)).to(dtype)  # noqa: E731
    on1 = lambda *s, dtype=torch.float16: torch.randn(*s, device=cuda(1)).to(dtype)  # noqa: E731
    if name == "flash_attn_func k":
        return lambda: samattn.flash_attn_func(on0(1, 8, 2, 64), on1(1, 8, 2, 64), on0(1, 8, 2, 64))
    if name == "flash_attn_func sinks":
        return lambda: samattn.flash_attn_func(
            on0(1, 8, 2, 64), on0(1, 8, 2, 64), on0(1, 8, 2, 64),
            sinks=on1(2, dtype=torch.float32),
        )  # fmt: skip
    if name == "kvcache k_cache":
        return lambda: samattn.flash_attn_with_kvcache(
            on0(1, 1, 2, 64), on1(1, 16, 2, 64), on0(1, 16, 2, 64), cache_seqlens=4
        )
    if name == "grouped_gemm offsets":
        return lambda: samattn.grouped_gemm(
            on0(8, 16), on0(2, 16, 8), torch.tensor([4, 8], dtype=torch.int32, device=cuda(1))
        )
    if name == "gemm bias":
        return lambda: samattn.gemm(on0(8, 16), on0(16, 8), bias=on1(8))
    if name == "softmax_backward dy":
        return lambda: torch.ops.samattn.softmax_backward(on0(4, 8), on1(4, 8), -1)
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name",
    ["flash_attn_func k", "flash_attn_func sinks", "kvcache k_cache", "grouped_gemm offsets",
     "gemm bias", "softmax_backward dy"],
)  # fmt: skip
def test_arguments_on_two_devices_raise(name):
    call = _mixed(name)
    with pytest.raises((ValueError, RuntimeError), match=r"cuda:1|device"):
        call()
    assert_healthy()
