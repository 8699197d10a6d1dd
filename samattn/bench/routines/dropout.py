"""Attention dropout (--ops dropout): what dropout costs. samattn.flash_attn_func with
dropout_p = DROPOUT_P (0.1), forward and backward (the backward timed alone, as the
attention routine does), bf16, head dims 64 and 128, seqlen 1k and 4k on the attention
grid, causal and not (--quick: one case), against torch's SDPA forced to its
FLASH_ATTENTION backend with the same dropout_p (`baseline`, `ratio`; its random pattern
is its own, so no output is compared), and against samattn's own call without dropout
(`plain_ms`, `ratio_to_plain` = plain time / time with dropout: 0.9 means dropout costs
10%). Op "attention_dropout", fields `direction`, `dropout_p`. Replaces
benchmarks/attention_dropout_bench.py (results/h100_attention_dropout.json)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

import samattn

from ... import _lib
from .. import cases as bench_cases
from ..cases import DROPOUT_P, AttentionCase
from ..common import DTYPES, element_size, randn
from ..runner import Bench
from .attention import attention_tflop, case_label

OP = "dropout"
HEADER = None
FREES_MEMORY = True
BASELINE_BACKEND = "FLASH_ATTENTION"


def cases(size: str) -> list[tuple[str, AttentionCase]]:
    return bench_cases.DROPOUT_CASES[size]


def run(bench: Bench, case: tuple[str, AttentionCase]) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype_name, case = case
    dtype = DTYPES[dtype_name][0]
    causal, p = case.causal, DROPOUT_P
    shape = (case.batch, case.seqlen, case.heads, case.d)
    count = bench.timer.input_set_count(3 * math.prod(shape) * element_size(dtype_name))
    sets = [tuple(randn(shape, dtype) for _ in range(3)) for _ in range(count)]
    dout = randn(shape, dtype)

    def ours(dropout_p: float) -> Callable[..., torch.Tensor]:
        def forward(q, k, v):
            return samattn.flash_attn_func(q, k, v, dropout_p, causal=causal)

        return forward

    def sdpa(q, k, v):
        backend = getattr(SDPBackend, BASELINE_BACKEND, None)
        if backend is None:
            raise RuntimeError(f"torch {torch.__version__} has no SDPBackend.{BASELINE_BACKEND}")
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=p,
                is_causal=causal,
            )  # fmt: skip
        return out.transpose(1, 2)

    def graphs(forward: Callable[..., torch.Tensor], family: str | None) -> list[tuple]:
        """(out, q, k, v, dout) per input set, out from one forward with requires_grad."""
        made = []
        with samattn.use_family(family):
            for inputs in sets:
                q, k, v = (t.detach().requires_grad_() for t in inputs)
                made.append((forward(q, k, v), q, k, v, dout))
        return made

    def gradients(out, q, k, v, dout):
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    def body(direction: str, family: str | None) -> None:
        if direction == "fwd":
            plain_ms, _ = bench.samattn_ms(family, ours(0.0), sets)
            ms, ran = bench.samattn_ms(family, ours(p), sets)

            def make():
                return sdpa, sets
        else:
            plain_ms, _ = bench.samattn_ms(family, gradients, graphs(ours(0.0), family))
            _lib.set_last_family(_lib.FAMILY_AUTO)
            dropped = graphs(ours(p), family)
            forward_ran = _lib.last_family() or "?"
            ms, ran = bench.samattn_ms(family, gradients, dropped)
            # Autograd runs the backward on its own thread, out of the last-family record.
            ran = forward_ran if ran == "?" else ran

            def make():
                return gradients, graphs(sdpa, None)

        key = ("attention_dropout", direction, dtype_name, case)
        base_ms, reason = bench.optional_baseline_ms(key, make)
        extra: dict[str, Any] = {"baseline_skipped": reason} if reason else {}
        bench.record_rate(
            "attention_dropout", family, ran, dtype_name, case[:4], "TFLOPS",
            attention_tflop(case, direction), ms, base_ms,
            f"sdpa {BASELINE_BACKEND} (the same dropout_p)", what=f"{direction} {what}",
            **case._asdict(),
            direction=direction, dropout_p=p, plain_ms=plain_ms, ratio_to_plain=plain_ms / ms,
            **extra,
        )  # fmt: skip

    what = case_label(dtype_name, case)
    fields = {"dtype": dtype_name, **case._asdict(), "dropout_p": p}
    for direction in ("fwd", "bwd"):
        bench.run_case(
            f"attention_dropout {direction} {what}",
            lambda family, direction=direction: body(direction, family),
            {"op": "attention_dropout", "direction": direction, **fields},
        )
