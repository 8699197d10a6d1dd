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
from torch.utils._python_dispatch import TorchDispatchMode

import samattn
from samattn import _eager, _lib


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
