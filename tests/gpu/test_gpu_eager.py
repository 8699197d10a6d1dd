"""The eager routes (samattn/_eager.py) run the same kernels as the dispatcher's.

A plain eager call skips torch.library's dispatcher (DIRECT), a call that needs a
gradient goes through a lean autograd.Function (AUTOGRAD); anything else takes
torch.ops.samattn.* (DISPATCH). Forced here with a pass-through dispatch mode, which
makes every call take the dispatcher. The outputs and gradients must be bit-identical,
and the family each call runs must follow use_family and SAMATTN_FAMILY from one call to
the next (nothing cached past a change).
"""

from __future__ import annotations

import pytest
import torch
from gpu_checks import expected_gemm_family, randn, runnable_families
from reference import attention
from torch.utils._python_dispatch import TorchDispatchMode

import samattn
from samattn import _eager, _lib
from samattn._checks import AttentionParams


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _both_routes(fn):
    """fn() on the eager route, then under a dispatch mode (the dispatcher's route)."""
    direct = fn()
    with _Passthrough():
        dispatched = fn()
    return direct, dispatched


def _calls():
    a, b = randn(70, 40, dtype=torch.bfloat16), randn(40, 33, dtype=torch.bfloat16)
    x = randn(9, 300, dtype=torch.float32)
    q, k, v = (randn(2, n, 4, 64, dtype=torch.float16) for n in (37, 80, 80))
    return {
        "gemm": lambda: samattn.gemm(a, b.mT.contiguous().mT),
        "softmax": lambda: samattn.softmax(x, -1),
        "attention": lambda: samattn.flash_attn_func(q, k, v, causal=True),
    }


@pytest.mark.parametrize("name", ["gemm", "softmax", "attention"])
def test_direct_route_matches_the_dispatcher(name):
    fn = _calls()[name]
    assert _eager.route(randn(2, dtype=torch.float16)) == _eager.DIRECT
    direct, dispatched = _both_routes(fn)
    assert torch.equal(direct, dispatched)


def _grads(name):
    a = randn(70, 40, dtype=torch.bfloat16).requires_grad_()
    b = randn(40, 33, dtype=torch.bfloat16).requires_grad_()
    x = randn(9, 300, dtype=torch.float32).requires_grad_()
    q, k, v = (randn(2, n, 4, 64, dtype=torch.float16).requires_grad_() for n in (37, 80, 80))
    inputs, fn = {
        "gemm": ((a, b), lambda: samattn.gemm(a, b)),
        "softmax": ((x,), lambda: samattn.softmax(x, 0)),
        "attention": (
            (q, k, v),
            lambda: samattn.flash_attn_func(q, k, v, causal=True, deterministic=True),
        ),
    }[name]

    def run():
        out = fn()
        grad = torch.ones_like(out) * 0.5 + torch.linspace(0, 1, out.numel(), device="cuda").view(
            out.shape
        ).to(out.dtype)
        return (out, *torch.autograd.grad(out, inputs, grad))

    return run


@pytest.mark.parametrize("name", ["gemm", "softmax", "attention"])
def test_autograd_route_matches_the_dispatcher(name):
    run = _grads(name)
    assert _eager.route(randn(2, dtype=torch.float16).requires_grad_()) == _eager.AUTOGRAD
    direct, dispatched = _both_routes(run)
    for ours, theirs in zip(direct, dispatched):
        assert torch.equal(ours, theirs)


def test_gemm_backward_on_autograds_thread():
    """The backward runs on autograd's device thread, which may have no CUDA context
    bound yet: the library must bind one (sm90 GEMMs build TMA descriptors with the
    driver API, which needs it)."""
    a = randn(64, 64, dtype=torch.bfloat16).requires_grad_()
    b = randn(64, 64, dtype=torch.bfloat16).requires_grad_()
    samattn.gemm(a, b).sum().backward()
    torch.cuda.synchronize()
    assert torch.allclose(a.grad.float(), b.float().sum(1).expand(64, 64), rtol=2e-2, atol=1e-1)


def test_family_follows_every_change(monkeypatch):
    """Nothing cached outlives a change of use_family or SAMATTN_FAMILY."""
    monkeypatch.delenv("SAMATTN_FAMILY", raising=False)
    families = runnable_families()
    if len(families) < 2:
        pytest.skip("needs two runnable families")
    a, b = randn(256, 256, dtype=torch.float16), randn(256, 256, dtype=torch.float16)

    def ran() -> str:
        _lib.set_last_family(_lib.FAMILY_AUTO)
        samattn.gemm(a, b)
        return _lib.last_family()

    automatic = ran()
    assert automatic == expected_gemm_family(families[-1], a, b)
    for family in families:
        expected = expected_gemm_family(family, a, b)
        with samattn.use_family(family):
            assert ran() == expected
        assert ran() == automatic
        monkeypatch.setenv("SAMATTN_FAMILY", family)
        assert ran() == expected
        monkeypatch.delenv("SAMATTN_FAMILY")
        assert ran() == automatic


# ------------------------------------------------------------- prepared calls ----
def _prepared_cases():
    """name -> (prepared-call cache, a factory of fresh inputs, the call on them)."""
    from samattn import _cuda

    def attention_inputs(seqlen_q, seqlen_k, nheads, nheads_k, d, transposed=False):
        def make():
            if transposed:  # SDPA's layout seen as flash-attn's: strided views
                shapes = ((1, nheads, seqlen_q, d), (1, nheads_k, seqlen_k, d))
                q = randn(*shapes[0], dtype=torch.bfloat16).transpose(1, 2)
                k, v = (randn(*shapes[1], dtype=torch.bfloat16).transpose(1, 2) for _ in "kv")
                return q, k, v
            q = randn(1, seqlen_q, nheads, d, dtype=torch.bfloat16)
            k, v = (randn(1, seqlen_k, nheads_k, d, dtype=torch.bfloat16) for _ in "kv")
            return q, k, v

        return make

    def attention_backward_inputs():
        q = randn(2, 70, 4, 64, dtype=torch.bfloat16)
        k, v = (randn(2, 90, 2, 64, dtype=torch.bfloat16) for _ in "kv")
        out, lse, _ = samattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        return randn(*out.shape, dtype=out.dtype), q, k, v, out, lse

    def attention_backward(*inputs):  # deterministic: bit-identical run to run
        params = AttentionParams(64**-0.5, True, -1, -1, 0.0, True)
        return torch.cat([g.flatten() for g in _cuda.flash_attn_backward(*inputs, params)[:3]])

    def kvcache_inputs():  # a decode step appending one row, causal
        q = randn(2, 1, 8, 128, dtype=torch.bfloat16)
        k_cache, v_cache = (randn(2, 700, 2, 128, dtype=torch.bfloat16) for _ in "kv")
        k, v = (randn(2, 1, 2, 128, dtype=torch.bfloat16) for _ in "kv")
        lens = torch.tensor([300, 650], dtype=torch.int32, device="cuda")
        return q, k_cache, v_cache, k, v, lens

    def paged_kvcache_inputs():  # 4 query rows, MQA, pages of 16 in a shuffled table
        q = randn(3, 4, 8, 64, dtype=torch.float16)
        k_cache, v_cache = (randn(20, 16, 1, 64, dtype=torch.float16) for _ in "kv")
        table = torch.randperm(20, device="cuda")[:18].reshape(3, 6).to(torch.int32)
        return q, k_cache, v_cache, table

    return {
        "kvcache decode": (
            _cuda._KVCACHE,
            kvcache_inputs,
            lambda q, kc, vc, k, v, lens: samattn.flash_attn_with_kvcache(
                q, kc, vc, k, v, cache_seqlens=lens, causal=True
            ),
        ),
        "kvcache paged": (
            _cuda._KVCACHE,
            paged_kvcache_inputs,
            lambda q, kc, vc, table: samattn.flash_attn_with_kvcache(
                q, kc, vc, cache_seqlens=77, block_table=table, window_size=(40, 0)
            ),
        ),
        "gemm small": (
            _cuda._GEMM,
            lambda: (randn(64, 48, dtype=torch.bfloat16), randn(48, 40, dtype=torch.bfloat16)),
            lambda a, b: samattn.gemm(a, b, alpha=0.5),
        ),
        # Large enough for a kernel that takes a workspace (stream-K on sm90).
        "gemm workspace": (
            _cuda._GEMM,
            lambda: tuple(randn(1024, 1024, dtype=torch.float16) for _ in "ab"),
            lambda a, b: samattn.gemm(a, b),
        ),
        "gemm transposed": (
            _cuda._GEMM,
            lambda: (randn(96, 64, dtype=torch.float32).mT, randn(96, 80, dtype=torch.float32)),
            lambda a, b: samattn.gemm(a, b),
        ),
        "gemm epilogue": (
            _cuda._GEMM,
            lambda: (
                randn(96, 256, dtype=torch.bfloat16),
                randn(200, 256, dtype=torch.bfloat16),
                randn(200, dtype=torch.bfloat16),
            ),
            lambda x, w, bias: samattn.gemm(
                x, w.mT, bias=bias, activation="gelu", out_dtype=torch.float32
            ),
        ),
        "softmax": (
            _cuda._SOFTMAX,
            lambda: (randn(7, 300, dtype=torch.float16),),
            lambda x: samattn.softmax(x, 0),
        ),
        "softmax backward": (
            _cuda._SOFTMAX_BACKWARD,
            lambda: (randn(5, 129, dtype=torch.float32), randn(5, 129, dtype=torch.float32)),
            lambda y, dy: _cuda.softmax_backward(y, dy, -1),
        ),
        "attention": (
            _cuda._ATTENTION,
            attention_inputs(77, 130, 4, 2, 64),
            lambda q, k, v: samattn.flash_attn_func(q, k, v, causal=True, window_size=(40, 3)),
        ),
        "attention views": (
            _cuda._ATTENTION,
            attention_inputs(33, 200, 4, 4, 128, transposed=True),
            lambda q, k, v: samattn.flash_attn_func(q, k, v, softcap=5.0),
        ),
        "attention backward": (
            _cuda._ATTENTION_BACKWARD,
            attention_backward_inputs,
            attention_backward,
        ),
        # Decode-shaped: split over the keys, with a workspace.
        "attention decode": (
            _cuda._ATTENTION,
            attention_inputs(1, 700, 8, 1, 128),
            lambda q, k, v: samattn.flash_attn_func(q, k, v),
        ),
    }


@pytest.mark.parametrize("name", list(_prepared_cases()))
def test_prepared_calls_match_the_full_path(name):
    """A call whose signature ran before reuses that call's C arguments with its own
    pointers: on fresh inputs its result must be bit-identical to the full path's (the
    cache emptied), and an entry with too small a workspace must still run right (the
    library asks for one, or runs without)."""
    cache, make, call = _prepared_cases()[name]
    cache.clear()
    call(*make())
    entries = list(cache.entries.values())
    assert len(entries) == 1, "the first call left no prepared entry"
    for trial in range(3):
        inputs = make()
        if trial == 2:  # as if the library now needed more workspace than cached
            (key,) = cache.entries
            cache.entries[key] = cache.entries[key]._replace(workspace=0)
        prepared = call(*inputs)
        cache.clear()
        full = call(*inputs)
        torch.cuda.synchronize()
        assert torch.isfinite(prepared.float()).all()
        if trial < 2:
            assert torch.equal(prepared, full), f"trial {trial}"
        else:  # without a workspace the library may run another way (attention: no split)
            assert torch.allclose(prepared.float(), full.float(), rtol=1e-2, atol=1e-2)


def test_int_cache_seqlens_follow_their_value():
    """An int cache_seqlens becomes a device tensor that the next calls with the same int
    reuse: every value must still reach the kernels, on the prepared path and the full
    one, on another stream too, and inside a captured CUDA graph."""
    from samattn import _cuda

    q = randn(2, 1, 8, 64, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(2, 256, 2, 64, dtype=torch.bfloat16) for _ in "kv")

    def step(lens):
        return samattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens)

    def want(value):
        return step(torch.full((2,), value, dtype=torch.int32, device="cuda"))

    side = torch.cuda.Stream()
    for value in (50, 50, 51, 200, 50):
        assert torch.equal(step(value), want(value)), value
        _cuda._KVCACHE.clear()
        assert torch.equal(step(value), want(value)), value
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = step(value)
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(on_side, want(value)), value
    graph = torch.cuda.CUDAGraph()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(120)  # warm-up outside the capture
        with torch.cuda.graph(graph):
            captured = step(120)
    torch.cuda.current_stream().wait_stream(side)
    step(121)
    graph.replay()
    assert torch.equal(captured, want(120))


@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(77, 130), (1, 700)], ids=["prefill", "decode"])
def test_prepared_calls_without_lse_leave_it_to_the_calls_that_want_it(seqlen_q, seqlen_k):
    """Inference calls (no gradient, no return_attn_probs) make no lse; a later call of the
    same signature that wants it gets the full log-sum-exp, and the outputs agree."""
    from samattn import _cuda

    _cuda._ATTENTION.clear()
    q = randn(1, seqlen_q, 8, 128, dtype=torch.bfloat16)
    k, v = (randn(1, seqlen_k, 2, 128, dtype=torch.bfloat16) for _ in "kv")
    first = samattn.flash_attn_func(q, k, v)  # the full path: keeps the signature
    assert len(_cuda._ATTENTION.entries) == 1
    params = AttentionParams(128**-0.5, False, -1, -1, 0.0)
    out, lse = _cuda.flash_attn_forward(q, k, v, params, want_lse=False)
    assert lse is None
    with_lse, lse, _ = samattn.flash_attn_func(q, k, v, return_attn_probs=True)
    torch.cuda.synchronize()
    assert torch.equal(out, first) and torch.equal(with_lse, first)
    _, want = attention(q, k, v, 128**-0.5, 0.0, None, torch.float64)
    torch.testing.assert_close(lse, want.float(), rtol=0, atol=1e-3)


def test_prepared_calls_follow_the_signature():
    """A different stride, dtype, scalar or forced family is another signature: the
    cache never hands one call's arguments to another."""
    from samattn import _cuda

    _cuda._ATTENTION.clear()
    q, k, v = (randn(2, 64, 4, 64, dtype=torch.float16) for _ in "qkv")
    base = samattn.flash_attn_func(q, k, v)
    assert torch.equal(samattn.flash_attn_func(q, k, v), base)
    q_view = q[:, 8:48]  # strided: rows of another length, another pointer
    for changed, differs in (
        (lambda: samattn.flash_attn_func(q, k, v, causal=True), True),
        (lambda: samattn.flash_attn_func(q, k, v, softmax_scale=0.3), True),
        (lambda: samattn.flash_attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16()), True),
        (lambda: samattn.flash_attn_func(q_view, k, v), False),
    ):
        first = changed()
        again = changed()
        _cuda._ATTENTION.clear()
        assert torch.equal(first, again) and torch.equal(changed(), first)
        assert first.shape[1] == 64 or torch.allclose(first, base[:, 8:48], atol=2e-3)
        if differs:
            assert not torch.equal(first.float(), base.float())
    families = runnable_families()
    _cuda._ATTENTION.clear()
    for family in families:
        with samattn.use_family(family):
            samattn.flash_attn_func(q, k, v)
            assert _lib.last_family() in (family, "sm80")
    assert len({key[-1] for key in _cuda._ATTENTION.entries}) == len(families)
