"""Score terms and masks (--ops terms): bf16, head dims 64/128/256, seqlen 1k/4k/16k on the
attention grid, causal and not (--quick: three cases). Forward and backward of
samattn.flash_attn_func with ALiBi slopes, with attention sinks (requiring grad in the
backward), and with a bool and an additive float32 mask of random key padding, (batch, 1,
seqlen, seqlen) (through samattn.scaled_dot_product_attention; when causal through
flash_attn_func(causal=True, attn_mask=...), as SDPA refuses is_causal with a mask), each
against the same call without the feature: op "attention_terms", fields `feature`,
`direction`, `ratio` = plain time / feature time (0.9: the feature costs 10%). The mask
calls also against torch's SDPA forced to its EFFICIENT_ATTENTION backend with the same
mask (the float mask in the inputs' dtype, which that kernel reads; the causal mask folded
in): op "attention_mask", `ratio` = SDPA's time / samattn's, `difference_to_baseline` of
the output or the largest of the gradients. TFLOPS count the attention's nominal work (as
the attention routine, halved when causal) for every call. --terms-features measures only
the features named."""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

import samattn

from ... import _lib
from .. import cases as bench_cases
from .. import common
from ..cases import MASK_FEATURES, AttentionCase
from ..common import DTYPES, alibi_slopes, element_size, padding_mask, randn, relative_difference
from ..report import TERMS_TARGETS
from ..runner import Bench
from .attention import attention_tflop, case_label

OP = "terms"
# torch's kernel that takes a mask: the baseline of the mask cases.
MASK_BASELINE_BACKEND = "EFFICIENT_ATTENTION"
HEADER = (
    "score terms and masks: attention_terms ratio = plain time / time with the feature "
    f"(target {TERMS_TARGETS['attention_terms']:.2f}); attention_mask ratio = sdpa "
    f"{MASK_BASELINE_BACKEND} time / samattn time with the same mask (target "
    f"{TERMS_TARGETS['attention_mask']:.1f})"
)
FREES_MEMORY = True


def cases(size: str) -> list[tuple[str, AttentionCase]]:
    return bench_cases.TERMS_CASES[size]


def run(bench: Bench, case: tuple[str, AttentionCase]) -> None:
    """Forward and backward of flash_attn_func with each of bench.terms_features against
    the same call without it ("attention_terms", ratio = plain time / feature time), and
    the masked calls against SDPA's memory-efficient backend with the same mask
    ("attention_mask", ratio = SDPA's time / samattn's). The masks go through
    samattn.scaled_dot_product_attention when not causal; causal, through
    flash_attn_func(causal=True, attn_mask=...) (SDPA refuses is_causal with a mask),
    with SDPA given the mask and the causal mask as one. The masks are key padding
    (padding_mask): the masked call skips tiles of padded keys that the call without it
    computes, so the mask records carry mask_keeps, the fraction of the mask's elements
    it keeps (averaged over the input sets), to read their ratio by."""
    dtype_name, case = case
    dtype = DTYPES[dtype_name][0]
    causal = case.causal
    shape = (case.batch, case.seqlen, case.heads, case.d)
    mask_shape = (case.batch, 1, case.seqlen, case.seqlen)
    # q, k, v, the bool mask (1 byte) and the float32 one (4 bytes) of each set.
    count = bench.timer.input_set_count(
        3 * math.prod(shape) * element_size(dtype_name) + 5 * math.prod(mask_shape)
    )
    sets = []
    for _ in range(count):
        q, k, v = (randn(shape, dtype) for _ in range(3))
        keep = padding_mask(case.batch, case.seqlen, q.device)
        bias = torch.zeros(mask_shape, device=q.device).masked_fill_(~keep, -math.inf)
        sets.append((q, k, v, keep, bias))
    mask_keeps = sum(keep.float().mean().item() for *_, keep, _ in sets) / len(sets)
    dout = randn(shape, dtype)
    slopes = alibi_slopes(case.heads, dout.device)
    sinks = torch.randn(case.heads, device=dout.device)
    what = case_label(dtype_name, case)

    def call(feature: str, q, k, v, keep, bias, sink_logits):
        """The measured call: samattn with `feature` ("plain": none)."""
        if feature == "alibi":
            return samattn.flash_attn_func(q, k, v, causal=causal, alibi_slopes=slopes)
        if feature == "sinks":
            return samattn.flash_attn_func(q, k, v, causal=causal, sinks=sink_logits)
        if feature in MASK_FEATURES:
            mask = keep if feature == "bool_mask" else bias
            if causal:
                return samattn.flash_attn_func(q, k, v, causal=True, attn_mask=mask)
            out = samattn.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
            )
            return out.transpose(1, 2)
        return samattn.flash_attn_func(q, k, v, causal=causal)

    def gradients(out, inputs):
        return torch.autograd.grad(out, inputs, dout, retain_graph=True)

    def samattn_graphs(feature: str, family: str | None) -> list[tuple]:
        """(out, the inputs to differentiate) per set: q, k, v, and the sinks."""
        graphs = []
        with samattn.use_family(family):
            for q, k, v, keep, bias in sets:
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                if feature == "sinks":
                    leaves.append(sinks.detach().clone().requires_grad_())
                logits = leaves[3] if feature == "sinks" else None
                graphs.append((call(feature, *leaves[:3], keep, bias, logits), leaves))
        return graphs

    plain: dict[tuple, float] = {}  # (family, direction) -> ms of the plain call

    def measure(feature: str, family: str | None, direction: str) -> tuple[float, str]:
        if direction == "fwd":
            inputs = [(*inputs, sinks) for inputs in sets]
            return bench.samattn_ms(family, functools.partial(call, feature), inputs)
        _lib.set_last_family(_lib.FAMILY_AUTO)
        graphs = samattn_graphs(feature, family)
        forward_ran = _lib.last_family() or "?"
        ms, ran = bench.samattn_ms(family, gradients, graphs)
        # Autograd runs the backward on its own thread, out of the last-family record.
        return ms, forward_ran if ran == "?" else ran

    def torch_inputs(feature: str, inputs: tuple) -> tuple:
        """SDPA's (batch, heads, seq, d) views and the same mask (float: in q's dtype,
        which its kernel reads), with the causal mask folded in when causal."""
        q, k, v, keep, bias = inputs
        mask = keep if feature == "bool_mask" else bias.to(dtype)
        if causal:
            lower = torch.ones(case.seqlen, case.seqlen, dtype=torch.bool, device=q.device)
            lower = lower.tril()
            mask = mask & lower if feature == "bool_mask" else mask.masked_fill(~lower, -math.inf)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask

    def sdpa(q, k, v, mask):
        out = common.sdpa_with_backend(MASK_BASELINE_BACKEND, q, k, v, mask)
        return out.transpose(1, 2)  # (batch, seq, heads, d), as samattn's

    def torch_graphs(feature: str) -> list[tuple]:
        graphs = []
        for q, k, v, mask in (torch_inputs(feature, inputs) for inputs in sets):
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            graphs.append((sdpa(*leaves, mask), leaves))
        return graphs

    def torch_make(feature: str, direction: str):
        def make():
            if direction == "fwd":
                return sdpa, [torch_inputs(feature, inputs) for inputs in sets]
            return gradients, torch_graphs(feature)

        return make

    def difference(feature: str, direction: str, family: str | None) -> float:
        """samattn against SDPA on the first set: the output, or the largest relative
        difference of dq, dk, dv (SDPA's transposed to samattn's layout)."""
        with samattn.use_family(family):
            if direction == "fwd":
                ours = call(feature, *sets[0], sinks)
                return relative_difference(ours, sdpa(*torch_inputs(feature, sets[0])))
            ours = gradients(*samattn_graphs(feature, family)[0])
        theirs = gradients(*torch_graphs(feature)[0])
        return max(relative_difference(a, b.transpose(1, 2)) for a, b in zip(ours, theirs))

    def body(feature: str, direction: str, family: str | None) -> None:
        key = (family, direction)
        if key not in plain:
            plain[key] = measure("plain", family, direction)[0]
        ms, ran = measure(feature, family, direction)
        tflop = attention_tflop(case, direction)
        common_fields = dict(
            family=ran, forced=family is not None, dtype=dtype_name, shape=list(case[:4]),
            **case._asdict(), feature=feature, direction=direction, unit="TFLOPS",
            samattn=tflop / (ms / 1e3), samattn_ms=ms,
            **({"mask_keeps": mask_keeps} if feature in MASK_FEATURES else {}),
        )  # fmt: skip
        bench.record(
            op="attention_terms",
            what=f"{feature} {direction} {what}",
            **common_fields,
            baseline=tflop / (plain[key] / 1e3),
            baseline_name="samattn without the feature",
            baseline_ms=plain[key],
        )
        if feature not in MASK_FEATURES:
            return
        base_ms, reason = bench.optional_baseline_ms(
            ("attention_mask", direction, dtype_name, case, feature),
            torch_make(feature, direction),
        )
        extra: dict[str, Any] = {"baseline_skipped": reason} if reason else {}
        via = "flash_attn_func(causal=True, attn_mask=...)" if causal else "sdpa(attn_mask=...)"
        bench.record(
            op="attention_mask",
            what=f"{feature} {direction} {what}",
            **common_fields,
            baseline=tflop / (base_ms / 1e3) if base_ms else None,
            baseline_name=f"sdpa {MASK_BASELINE_BACKEND} (the same mask)",
            baseline_ms=base_ms,
            samattn_call=via,
            mask_shape=list(mask_shape),
            mask_dtype="bool" if feature == "bool_mask" else "float32",
            baseline_mask_dtype="bool" if feature == "bool_mask" else dtype_name,
            difference_to_baseline=difference(feature, direction, family) if base_ms else None,
            **extra,
        )

    fields = {"dtype": dtype_name, **case._asdict()}
    for feature in bench.terms_features:
        for direction in ("fwd", "bwd"):
            bench.run_case(
                f"attention_terms {feature} {direction} {what}",
                functools.partial(body, feature, direction),
                {"op": "attention_terms", "feature": feature, "direction": direction, **fields},
            )
