"""Attention dropout on the GPU (the issue "Attention without holes").

The kernels keep probability (b, h, i, j) iff its Philox byte passes the threshold
(cpp/src/attention/dropout.cuh); samattn._dropout.keep_mask recomputes those decisions with
torch ops from the call's seed, which these tests capture. So the output and the gradients
are checked element for element against float64 references that drop exactly the same
probabilities: softmax(scores) * keep * scale(p) @ v, scale(p) = 1 / (1 - p) of p rounded
to 1/256. Accuracy rule as in the other
attention tests (gpu_checks.assert_close_to_reference): twice the error of the same
reference in the input dtype, plus a floor.

Beyond that: the kept fraction matches dropout_p; the output's mean over many seeds is the
output without dropout; torch.manual_seed reproduces a call and two calls differ; a CUDA
graph draws a new mask per replay; the deterministic backward is bit-identical; S_dmask
(return_attn_probs) marks exactly the dropped probabilities; the sm90 forward and backward
run dropout, varlen included (the backward hands dropout with a mask to sm80).
"""

from __future__ import annotations

import pytest
import torch
from gpu_checks import (
    DEVICE,
    UNIT_ROUNDOFF,
    assert_close_to_reference,
    call_forced,
    capture_graph,
    forced_runs,
    poison_allocator,
    randn,
    runnable_families,
)

import samattn
from samattn import _dropout
from samattn import attention as attention_module
from samattn._checks import AttentionParams

F16, BF16 = torch.float16, torch.bfloat16


@pytest.fixture(params=["sm90", "sm80", "sm75"])
def attn_family(request) -> str:
    """The family forced in the forward and the backward."""
    if request.param not in runnable_families():
        pytest.skip(f"{request.param} is not built or cannot run on this GPU")
    return request.param


@pytest.fixture
def seeds(monkeypatch) -> list[torch.Tensor]:
    """The seed tensors the calls draw, in order."""
    drawn: list[torch.Tensor] = []
    real = _dropout.new_seed

    def spy(device):
        seed = real(device)
        drawn.append(seed)
        return seed

    monkeypatch.setattr(attention_module._dropout, "new_seed", spy)
    return drawn


def reference(q, k, v, keep, p, scale, causal=False, window=(-1, -1), softcap=0.0,
              dtype=torch.float64, mask=None):  # fmt: skip
    """Attention with the probabilities `keep` (b, h, sq, sk) marks kept, computed in
    `dtype`; q (b, sq, h, d), k and v (b, sk, hk, d); mask: None, bool (True: attend) or
    additive, broadcastable to (b, h, sq, sk)."""
    _b, sq, h, _d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    qd, kd, vd = (t.to(dtype) for t in (q, k, v))
    kd = kd.repeat_interleave(h // hk, dim=2)
    vd = vd.repeat_interleave(h // hk, dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", qd, kd) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(sq, device=q.device).view(-1, 1)
    j = torch.arange(sk, device=q.device).view(1, -1)
    diagonal = i + sk - sq
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    right = 0 if causal else window[1]
    if right >= 0:
        visible &= j <= diagonal + right
    if window[0] >= 0:
        visible &= j >= diagonal - window[0]
    scores = scores.masked_fill(~visible, float("-inf"))
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask.to(dtype)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see no key: 0
    dropped = probs * keep.to(dtype) * _dropout.scale(p)
    return torch.einsum("bhij,bjhd->bihd", dropped, vd)


SM75_BACKWARD_MAX_D = 192  # the largest head dim with an sm75 backward kernel

CASES = {
    # name: (b, sq, sk, h, hk, d, options)
    "plain d64": (2, 97, 131, 3, 3, 64, {}),
    "causal d128": (1, 130, 77, 2, 2, 128, {"causal": True}),
    "window gqa d64": (2, 64, 200, 4, 2, 64, {"window_size": (37, 5)}),
    "softcap d40 padded": (1, 50, 70, 2, 1, 40, {"softcap": 5.0}),
    "odd head dim 33": (1, 33, 45, 2, 2, 33, {}),
    "gqa d256": (1, 70, 150, 4, 2, 256, {}),
    "causal d256": (2, 129, 129, 2, 2, 256, {"causal": True}),
}


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_gradients_match_the_reference(attn_family, seeds, case, dtype):
    family = attn_family
    if family == "sm75" and dtype == BF16:
        pytest.skip("sm75 runs float16 attention")
    b, sq, sk, h, hk, d, options = CASES[case]
    p = 0.17
    q = randn(b, sq, h, d, dtype=dtype).requires_grad_()
    k = randn(b, sk, hk, d, dtype=dtype).requires_grad_()
    v = randn(b, sk, hk, d, dtype=dtype).requires_grad_()
    poison_allocator((b, sq, h, d), dtype)
    out = call_forced(
        family, lambda: samattn.flash_attn_func(q, k, v, p, **options), expected=forced_runs(family)
    )
    assert len(seeds) == 1
    keep = _dropout.keep_mask(_dropout.seed_value(seeds[0]), p, b, h, sq, sk, DEVICE)
    scale = d**-0.5
    args = dict(
        causal=options.get("causal", False),
        window=options.get("window_size", (-1, -1)),
        softcap=options.get("softcap", 0.0),
    )
    ref = reference(q, k, v, keep, p, scale, **args)
    low = reference(q, k, v, keep, p, scale, **args, dtype=dtype)
    floor = 4 * UNIT_ROUNDOFF[dtype]
    assert_close_to_reference(out.detach(), ref.detach(), low.detach(), floor, f"{case} out")

    dout = randn(b, sq, h, d, dtype=dtype)
    if family == "sm75" and d > SM75_BACKWARD_MAX_D:
        # No sm75 backward kernel fits this head dim: the call must say so, not crash.
        with pytest.raises(samattn.UnsupportedError, match="head dims up to 192"):
            torch.autograd.grad(out, (q, k, v), dout)
        return
    # The backward runs on autograd's thread with the forward's family.
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout.double())
    low_grads = torch.autograd.grad(low, (q, k, v), dout)
    for name, g, r, lo in zip("qkv", grads, ref_grads, low_grads):
        assert_close_to_reference(g, r, lo, 8 * UNIT_ROUNDOFF[dtype], f"{case} d{name}")


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_masked_dropout_matches_the_reference(attn_family, seeds, mask_kind):
    # The kernels with masks draw the same words; an additive mask gets its gradient.
    family = attn_family
    dtype = F16
    b, sq, sk, h, d, p = 2, 45, 77, 2, 64, 0.2
    q, k, v = (randn(b, n, h, d, dtype=dtype).requires_grad_() for n in (sq, sk, sk))
    if mask_kind == "bool":
        mask = torch.rand(b, 1, sq, sk, device=DEVICE) > 0.3
        mask[0, 0, 3] = False  # a row that sees no key
    else:
        mask = (torch.randn(1, h, sq, sk, device=DEVICE) * 2).requires_grad_()
    out = call_forced(
        family,
        lambda: samattn.flash_attn_func(q, k, v, p, attn_mask=mask),
        expected=forced_runs(family),
    )
    keep = _dropout.keep_mask(_dropout.seed_value(seeds[0]), p, b, h, sq, sk, DEVICE)
    ref = reference(q, k, v, keep, p, d**-0.5, mask=mask)
    low = reference(q, k, v, keep, p, d**-0.5, dtype=dtype, mask=mask)
    floor = 4 * UNIT_ROUNDOFF[dtype]
    assert_close_to_reference(out.detach(), ref.detach(), low.detach(), floor, "out")
    inputs = (q, k, v) if mask_kind == "bool" else (q, k, v, mask)
    dout = randn(b, sq, h, d, dtype=dtype)
    grads = torch.autograd.grad(out, inputs, dout)
    ref_grads = torch.autograd.grad(ref, inputs, dout.double())
    low_grads = torch.autograd.grad(low, inputs, dout)
    for name, g, r, lo in zip(("q", "k", "v", "mask"), grads, ref_grads, low_grads):
        assert_close_to_reference(g, r, lo, 8 * UNIT_ROUNDOFF[dtype], f"d{name}")


def test_varlen_drops_per_sequence(attn_family, seeds):
    family = attn_family
    # Sequence b's indices count from its own first row; its batch index is b. Gradients
    # too (the backward runs on the automatic family: sm90's on Hopper).
    dtype = F16
    lengths_q, lengths_k = [17, 0, 64, 33], [40, 5, 64, 1]
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32,
                        device=DEVICE)  # fmt: skip
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32,
                        device=DEVICE)  # fmt: skip
    h, d, p = 2, 64, 0.3
    q = randn(sum(lengths_q), h, d, dtype=dtype).requires_grad_()
    k = randn(sum(lengths_k), h, d, dtype=dtype).requires_grad_()
    v = randn(sum(lengths_k), h, d, dtype=dtype).requires_grad_()
    out = call_forced(
        family,
        lambda: samattn.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), p, causal=True
        ),
        expected=forced_runs(family),
    )
    seed = _dropout.seed_value(seeds[0])
    keep = _dropout.keep_mask(seed, p, len(lengths_q), h, max(lengths_q), max(lengths_k), DEVICE)
    refs, lows = [], []
    for s, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
        if lq == 0:
            continue
        rows = slice(cu_q[s].item(), cu_q[s].item() + lq)
        keys = slice(cu_k[s].item(), cu_k[s].item() + lk)
        args = (q[rows][None], k[keys][None], v[keys][None], keep[s : s + 1, :, :lq, :lk], p,
                d**-0.5)  # fmt: skip
        refs.append(reference(*args, causal=True)[0])
        lows.append(reference(*args, causal=True, dtype=dtype)[0])
        assert_close_to_reference(
            out[rows].detach(), refs[-1].detach(), lows[-1].detach(), 4 * UNIT_ROUNDOFF[dtype],
            f"seq {s}",
        )  # fmt: skip
    # The sequences in order are every packed row (the empty one has none).
    dout = randn(*out.shape, dtype=dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(torch.cat(refs), (q, k, v), dout.double())
    low_grads = torch.autograd.grad(torch.cat(lows), (q, k, v), dout)
    for name, g, r, lo in zip("qkv", grads, ref_grads, low_grads):
        assert_close_to_reference(g, r, lo, 8 * UNIT_ROUNDOFF[dtype], f"varlen d{name}")


def test_kept_fraction_and_expectation():
    # The kept fraction is 1 - p; the mean output over many calls tends to the output
    # without dropout (dropout is unbiased).
    torch.manual_seed(1)
    b, s, h, d, p = 1, 256, 4, 64, 0.25
    q, k, v = (randn(b, s, h, d, dtype=BF16) for _ in range(3))
    _, lse, s_dmask = samattn.flash_attn_func(q, k, v, p, return_attn_probs=True)
    kept = (~s_dmask.signbit()).float().mean().item()
    assert abs(kept - (1 - p)) < 0.01, kept
    plain = samattn.flash_attn_func(q, k, v).double()
    calls = 400
    mean = sum(samattn.flash_attn_func(q, k, v, p).double() for _ in range(calls)) / calls
    # Each output element averages `calls` independent draws: its standard error is about
    # sqrt(p / (1 - p) * sum_j P_ij^2 v_j^2 / calls); bound the mean error by 6 of those.
    params = AttentionParams(d**-0.5, False, -1, -1, 0.0)
    probs = _dropout.attention_probs(q, k, lse, params).double()
    variance = torch.einsum("bhij,bjhd->bihd", probs**2, v.double() ** 2) * p / (1 - p)
    error = (mean - plain).abs()
    assert (error <= 6 * (variance / calls).sqrt() + 2e-2 * plain.abs().max()).all()


def test_seed_reproduces_and_calls_differ():
    q, k, v = (randn(2, 64, 2, 64, dtype=F16) for _ in range(3))
    torch.manual_seed(7)
    first = samattn.flash_attn_func(q, k, v, 0.5)
    second = samattn.flash_attn_func(q, k, v, 0.5)
    torch.manual_seed(7)
    again = samattn.flash_attn_func(q, k, v, 0.5)
    assert torch.equal(first, again)
    assert not torch.equal(first, second)


def test_graph_replay_draws_new_masks():
    q, k, v = (randn(1, 64, 2, 64, dtype=BF16) for _ in range(3))
    graph, out = capture_graph(lambda: samattn.flash_attn_func(q, k, v, 0.5))
    graph.replay()
    first = out.clone()
    graph.replay()
    assert not torch.equal(first, out)
    torch.cuda.synchronize()


def test_deterministic_backward_is_bit_identical(seeds):
    q, k, v = (randn(2, 200, 4, 64, dtype=BF16).requires_grad_() for _ in range(3))
    dout = randn(2, 200, 4, 64, dtype=BF16)
    torch.manual_seed(3)
    out = samattn.flash_attn_func(q, k, v, 0.2, causal=True, deterministic=True)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    second = torch.autograd.grad(out, (q, k, v), dout)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_s_dmask_marks_the_dropped_probabilities(seeds):
    b, s, h, d, p = 2, 70, 3, 64, 0.4
    q, k, v = (randn(b, s, h, d, dtype=F16) for _ in range(3))
    out, _lse, s_dmask = samattn.flash_attn_func(q, k, v, p, causal=True, return_attn_probs=True)
    keep = _dropout.keep_mask(_dropout.seed_value(seeds[0]), p, b, h, s, s, DEVICE)
    assert s_dmask.shape == (b, h, s, s) and s_dmask.dtype == F16
    visible = torch.ones(s, s, dtype=torch.bool, device=DEVICE).tril()
    assert torch.equal(~s_dmask.signbit() | ~visible, keep | ~visible)
    probs = torch.softmax(
        (torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) * d**-0.5).masked_fill(
            ~visible, float("-inf")
        ),
        dim=-1,
    )
    torch.testing.assert_close(s_dmask.abs().double(), probs, atol=2e-3, rtol=1e-2)
    # The output is the kept probabilities, scaled, times v.
    dropped = torch.where(s_dmask.signbit(), 0.0, s_dmask.double()) * _dropout.scale(p)
    torch.testing.assert_close(
        out.double(), torch.einsum("bhij,bjhd->bihd", dropped, v.double()), atol=5e-3, rtol=0
    )


def test_masked_s_dmask_marks_the_dropped_probabilities(seeds):
    # A bool key-padding mask: S_dmask's signs are the keep mask where the mask lets a key
    # in, its magnitudes each row's softmax, 0 where the mask leaves the key out.
    b, s, h, d, p = 2, 50, 2, 64, 0.3
    q, k, v = (randn(b, s, h, d, dtype=F16) for _ in range(3))
    mask = torch.rand(b, 1, 1, s, device=DEVICE) > 0.3
    _, _, s_dmask = samattn.flash_attn_func(q, k, v, p, attn_mask=mask, return_attn_probs=True)
    assert s_dmask.shape == (b, h, s, s) and s_dmask.dtype == F16
    keep = _dropout.keep_mask(_dropout.seed_value(seeds[0]), p, b, h, s, s, DEVICE)
    allowed = mask.expand(b, h, s, s)
    assert not s_dmask[~allowed].any()
    assert torch.equal(~s_dmask.signbit() | ~allowed, keep | ~allowed)
    scores = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) * d**-0.5
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    torch.testing.assert_close(s_dmask.abs().double(), probs, atol=2e-3, rtol=1e-2)


def test_varlen_s_dmask_marks_each_sequence(seeds):
    lengths, h, d, p = [17, 40, 1], 2, 64, 0.3
    cu = torch.tensor([0, 17, 57, 58], dtype=torch.int32, device=DEVICE)
    q, k, v = (randn(sum(lengths), h, d, dtype=BF16) for _ in range(3))
    _, _, s_dmask = samattn.flash_attn_varlen_func(
        q, k, v, cu, cu, max(lengths), max(lengths), p, return_attn_probs=True
    )
    assert s_dmask.shape == (3, h, 40, 40)
    keep = _dropout.keep_mask(_dropout.seed_value(seeds[0]), p, 3, h, 40, 40, DEVICE)
    for b, n in enumerate(lengths):
        corner = s_dmask[b, :, :n, :n]
        assert torch.equal(~corner.signbit(), keep[b, :, :n, :n])
        # |S_dmask| is each row's softmax: rows sum to 1.
        sums = corner.abs().float().sum(-1)
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=2e-2, rtol=0)


def test_sm90_runs_dropout_forward_and_backward():
    # The sm90 backward draws the forward's keep map on S^T itself.
    if "sm90" not in runnable_families():
        pytest.skip("sm90 is not built or cannot run on this GPU")
    q, k, v = (randn(1, 128, 2, 64, dtype=BF16) for _ in range(3))
    seed = _dropout.new_seed(q.device)
    params = AttentionParams(0.125, False, -1, -1, 0.0, dropout_p=0.1, dropout_seed=seed)
    out, lse = call_forced("sm90", lambda: samattn._cuda.flash_attn_forward(q, k, v, params))
    call_forced(
        "sm90",
        lambda: samattn._cuda.flash_attn_backward(torch.ones_like(out), q, k, v, out, lse, params),
    )


def test_bad_dropout_arguments():
    q, k, v = (randn(1, 16, 1, 64, dtype=F16) for _ in range(3))
    with pytest.raises(ValueError, match="dropout_p must be < 1"):
        samattn.flash_attn_func(q, k, v, 1.0)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\]"):
        samattn.flash_attn_func(q, k, v, -0.1)
    with pytest.raises(ValueError, match="dropout_seed must be an int64 tensor"):
        torch.ops.samattn.flash_attn_forward(
            q,
            k,
            v,
            None,
            None,
            0,
            0,
            0.125,
            False,
            -1,
            -1,
            0.0,
            False,
            None,
            None,
            None,
            0.1,
            torch.zeros(1, device=DEVICE),
        )
