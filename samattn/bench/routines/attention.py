"""Attention (--ops attention): samattn.flash_attn_func forward and backward in TFLOPS
(forward 4 * batch * heads * seqlen^2 * headdim, halved when causal; backward 2.5x the
forward) against torch.nn.functional.scaled_dot_product_attention forced to its
FLASH_ATTENTION backend (FlashAttention-2; `baseline`, `ratio`) and to CUDNN_ATTENTION
(`cudnn`, `ratio_to_cudnn`). samattn gets (batch, seqlen, heads, headdim) tensors; SDPA
the (batch, heads, seqlen, headdim) transposed views of the same tensors, as
FlashAttention's own benchmark does. The backward is timed alone: one forward with
requires_grad, then torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
repeatedly. A baseline that refuses a case (e.g. cuDNN's head dim 256 backward) is left out
of that record with the reason (`baseline_skipped`, `cudnn_skipped`). Ops
"attention_forward", "attention_backward"."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

import samattn

from ... import _lib
from .. import cases as bench_cases
from ..cases import AttentionCase
from ..common import DTYPES, SDPA_BACKENDS, element_size, randn, relative_difference, shape_text
from ..runner import Bench

OP = "attention"
HEADER = None
FREES_MEMORY = True


def cases(size: str) -> list[tuple[str, AttentionCase]]:
    return bench_cases.ATTENTION_CASES[size]


def attention_tflop(case: AttentionCase, direction: str) -> float:
    """Tera-FLOPs of one call: forward 4 * batch * heads * seqlen^2 * d (two GEMMs of
    2 * seqlen^2 * d each), halved when causal; backward (five GEMMs) 2.5x the forward."""
    flop = 4 * case.batch * case.heads * case.seqlen * case.seqlen * case.d
    if case.causal:
        flop /= 2
    return flop * (2.5 if direction == "bwd" else 1.0) / 1e12


def case_label(dtype_name: str, case: AttentionCase) -> str:
    return f"{dtype_name} {shape_text(case[:4])}{' causal' if case.causal else ''}"


def run(bench: Bench, case: tuple[str, AttentionCase]) -> None:
    """Forward and backward of samattn.flash_attn_func against SDPA's flash and cuDNN
    backends, on the same (batch, seqlen, heads, d) tensors (SDPA: transposed views)."""
    from torch.nn.attention import SDPBackend

    dtype_name, case = case
    dtype = DTYPES[dtype_name][0]
    shape = (case.batch, case.seqlen, case.heads, case.d)
    count = bench.timer.input_set_count(3 * math.prod(shape) * element_size(dtype_name))
    sets = [tuple(randn(shape, dtype) for _ in range(3)) for _ in range(count)]
    dout = randn(shape, dtype)
    causal = case.causal

    def samattn_forward(q, k, v):
        return samattn.flash_attn_func(q, k, v, causal=causal)

    def sdpa_forward(backend_name: str) -> Callable[..., torch.Tensor]:
        backend = getattr(SDPBackend, SDPA_BACKENDS[backend_name], None)

        def forward(q, k, v):
            if backend is None:
                raise RuntimeError(
                    f"torch {torch.__version__} has no SDPBackend.{SDPA_BACKENDS[backend_name]}"
                )
            with torch.nn.attention.sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
                )
            return out.transpose(1, 2)

        return forward

    implementations = {"samattn": samattn_forward}
    implementations.update((name, sdpa_forward(name)) for name in SDPA_BACKENDS)
    what = case_label(dtype_name, case)
    fields = {"dtype": dtype_name, **case._asdict()}

    def record(direction: str, family: str | None, ms: float, ran: str, reference, output):
        tflop = attention_tflop(case, direction)
        timings = {
            name: bench.optional_baseline_ms(
                (f"attention_{direction}", dtype_name, case, name),
                functools.partial(reference, name),
            )
            for name in SDPA_BACKENDS
        }
        flash_ms, flash_skipped = timings["flash"]
        cudnn_ms, cudnn_skipped = timings["cudnn"]
        compared = next((name for name in SDPA_BACKENDS if timings[name][0]), None)
        extra: dict[str, Any] = {}
        if flash_skipped:
            extra["baseline_skipped"] = flash_skipped
        if cudnn_skipped:
            extra["cudnn_skipped"] = cudnn_skipped
        cudnn = tflop / (cudnn_ms / 1e3) if cudnn_ms else None
        samattn_tflops = tflop / (ms / 1e3)
        with samattn.use_family(family):
            difference = output(compared) if compared else None
        bench.record(
            op=f"attention_{'forward' if direction == 'fwd' else 'backward'}",
            family=ran,
            forced=family is not None,
            dtype=dtype_name,
            shape=list(case[:4]),
            **case._asdict(),
            direction=direction,
            unit="TFLOPS",
            samattn=samattn_tflops,
            baseline=tflop / (flash_ms / 1e3) if flash_ms else None,
            baseline_name="sdpa FLASH_ATTENTION (FlashAttention-2)",
            cudnn=cudnn,
            ratio_to_cudnn=samattn_tflops / cudnn if cudnn else None,
            samattn_ms=ms,
            baseline_ms=flash_ms,
            cudnn_ms=cudnn_ms,
            difference_to_baseline=difference,
            compared_with=compared,
            **extra,
        )

    def forward(family: str | None) -> None:
        ms, ran = bench.samattn_ms(family, samattn_forward, sets)

        def output_difference(name: str) -> float:
            return relative_difference(samattn_forward(*sets[0]), implementations[name](*sets[0]))

        def reference(name: str):
            return implementations[name], sets

        record("fwd", family, ms, ran, reference, output_difference)

    def backward_sets(name: str, family: str | None) -> list[tuple]:
        """(out, q, k, v, dout) per input set, out from one forward with requires_grad."""
        graphs = []
        with samattn.use_family(family):
            for inputs in sets:
                q, k, v = (t.detach().requires_grad_() for t in inputs)
                graphs.append((implementations[name](q, k, v), q, k, v, dout))
        return graphs

    def gradients(out, q, k, v, dout):
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    def backward_family(family: str | None) -> str:
        """The family of the backward op called once on this thread (autograd runs it
        on its own thread, out of sight of the last-family record; it may choose
        another family than the forward did)."""
        q, k, v = sets[0]
        with samattn.use_family(family):
            out, lse, _ = samattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
            _lib.set_last_family(_lib.FAMILY_AUTO)
            torch.ops.samattn.flash_attn_backward(
                dout, q, k, v, out, lse, None, None, case.seqlen, case.seqlen,
                case.d**-0.5, causal, -1, -1, 0.0, False,
            )  # fmt: skip
        return _lib.last_family() or "?"

    def backward(family: str | None) -> None:
        samattn_graphs = backward_sets("samattn", family)
        ms, ran = bench.samattn_ms(family, gradients, samattn_graphs)
        if ran == "?":
            ran = backward_family(family)

        def reference(name: str):
            return gradients, backward_sets(name, None)

        def gradient_difference(name: str) -> float:
            ours = gradients(*samattn_graphs[0])
            theirs = gradients(*backward_sets(name, None)[0])
            return max(relative_difference(a, b) for a, b in zip(ours, theirs))

        record("bwd", family, ms, ran, reference, gradient_difference)

    bench.run_case(f"attention_forward {what}", forward, {"op": "attention_forward", **fields})
    bench.run_case(f"attention_backward {what}", backward, {"op": "attention_backward", **fields})
