"""Grouped GEMM (--ops grouped): samattn.grouped_gemm for a mixture-of-experts layer, bf16,
8 and 64 experts, top-2 routing of 4096 / 16384 tokens with skewed loads (expert e gets a
share proportional to 1 / (e + 1)), hidden 4096 and expert dim 14336, both projections
(up: 4096 -> 14336, down: 14336 -> 4096; --quick: 8 experts, 4096 tokens, up), and the
weight gradient of each (`projection` "up_wgrad", "down_wgrad": grad_w[e] = x_e^T dy_e, the
K-grouped GEMM autograd runs): op "grouped_gemm", one record per baseline:
torch._grouped_mm where the installed torch has it and it runs the case (for a weight
gradient its 2-D x 2-D form, offsets along K), and a Python loop of torch.mm over the
experts (`versus`). Then samattn.grouped_gemm_list on 8 and 64 independent bf16 GEMMs
(--quick: 8) of sizes drawn from M in {128, 512, 1000, 2048}, N in {1024, 4096}, K in
{1024, 2048, 4096} (`sizes`), against a loop of torch.mm: op "grouped_gemm_list"."""

from __future__ import annotations

from collections.abc import Callable

import torch

import samattn

from .. import cases as bench_cases
from ..cases import GroupedCase, GroupedListCase, list_sizes, skewed_loads
from ..common import randn, relative_difference, try_call
from ..runner import Bench

OP = "grouped"
HEADER = None
FREES_MEMORY = True


def cases(size: str) -> list[GroupedCase | GroupedListCase]:
    return bench_cases.GROUPED_CASES[size]


def run(bench: Bench, case: GroupedCase | GroupedListCase) -> None:
    if isinstance(case, GroupedListCase):
        gemm_list(bench, case)
    elif case.projection.endswith("_wgrad"):
        weight_gradient(bench, case)
    else:
        experts_layer(bench, case)


def weight_gradient_op(xt: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """grad_w[e] = x_e^T dy_e: the K-grouped GEMM of samattn.grouped_gemm's backward."""
    return torch.ops.samattn.grouped_gemm_k(xt, dy, offsets)


def _layer(case: GroupedCase) -> tuple[int, int, int, list[int], torch.Tensor, torch.Tensor]:
    """(rows, n_in, n_out, loads, x, offsets) of a case: 2 * tokens routed rows."""
    n_in, n_out = case.hidden, case.expert_dim
    if case.projection.startswith("down"):
        n_in, n_out = n_out, n_in
    rows = 2 * case.tokens
    loads = skewed_loads(case.experts, rows)
    x = randn((rows, n_in), torch.bfloat16)
    offsets = torch.tensor(loads, dtype=torch.int32).cumsum(0).int().to(x.device)
    return rows, n_in, n_out, loads, x, offsets


def experts_layer(bench: Bench, case: GroupedCase) -> None:
    """out[rows of e] = x[rows of e] @ w[e]."""
    rows, n_in, n_out, loads, x, offsets = _layer(case)
    w = randn((case.experts, n_in, n_out), torch.bfloat16) * 0.02

    def loop(x, w, offsets):
        out = x.new_empty(rows, n_out)
        begin = 0
        for e, count in enumerate(loads):  # the host knows the loads: no sync
            torch.mm(x[begin : begin + count], w[e], out=out[begin : begin + count])
            begin += count
        return out

    # torch._grouped_mm wants the weights' K contiguous (w.mT of an (E, N, K) tensor).
    w_t = w.mT.contiguous().mT
    _records(
        bench, case, samattn.grouped_gemm, [(x, w, offsets)], loop,
        lambda x, w, offsets: torch._grouped_mm(x, w_t, offs=offsets), loads, n_in, n_out,
    )  # fmt: skip


def weight_gradient(bench: Bench, case: GroupedCase) -> None:
    """grad_w[e] = x_e^T dy_e, as samattn.grouped_gemm's backward computes it."""
    rows, n_in, n_out, loads, x, offsets = _layer(case)
    dy = randn((rows, n_out), x.dtype) * 0.02

    def loop(xt, dy, offsets):
        out = xt.new_empty(case.experts, xt.shape[0], n_out)
        begin = 0
        for e, count in enumerate(loads):  # the host knows the loads: no sync
            torch.mm(xt[:, begin : begin + count], dy[begin : begin + count], out=out[e])
            begin += count
        return out

    _records(
        bench, case, weight_gradient_op, [(x.mT, dy, offsets)], loop,
        lambda xt, dy, offsets: torch._grouped_mm(xt, dy, offs=offsets), loads, n_in, n_out,
    )  # fmt: skip


def _records(
    bench: Bench,
    case: GroupedCase,
    samattn_fn: Callable[..., torch.Tensor],
    sets: list[tuple],
    loop: Callable[..., torch.Tensor],
    torch_grouped: Callable[..., torch.Tensor],
    loads: list[int],
    n_in: int,
    n_out: int,
) -> None:
    """The records of one grouped case: samattn_fn against the loop of torch.mm and,
    where the installed torch has it and it runs the case, torch._grouped_mm."""
    experts, tokens, projection = case.experts, case.tokens, case.projection
    tflop = 2 * 2 * tokens * n_in * n_out / 1e12
    shape = [experts, tokens, n_in, n_out]
    baselines = [("torch.mm loop", loop)]
    if getattr(torch, "_grouped_mm", None) is not None:
        refused = try_call(torch_grouped, *sets[0])
        if refused is None:
            baselines.append(("torch._grouped_mm", torch_grouped))
        else:
            print(f"  torch._grouped_mm refused: {refused}", flush=True)

    def body(family: str | None) -> None:
        ms, ran = bench.samattn_ms(family, samattn_fn, sets)
        with samattn.use_family(family):
            out = samattn_fn(*sets[0])
        agreement = relative_difference(out, loop(*sets[0]))
        del out
        for name, fn in baselines:
            base_ms = bench.baseline_ms(("grouped", name, projection, *shape), fn, sets)
            bench.record_rate(
                "grouped_gemm", family, ran, "bf16", shape, "TFLOPS", tflop, ms, base_ms, name,
                experts=experts, tokens=tokens, projection=projection, loads=loads, versus=name,
                difference_to_baseline=agreement,
            )  # fmt: skip

    bench.run_case(f"grouped {experts} experts {tokens} tokens {projection}", body)


def gemm_list(bench: Bench, case: GroupedListCase) -> None:
    """samattn.grouped_gemm_list of case.count GEMMs against a loop of torch.mm."""
    sizes = list_sizes(case)
    as_ = [randn((m, k), torch.bfloat16) for m, _, k in sizes]
    bs = [randn((k, n), torch.bfloat16) * 0.02 for _, n, k in sizes]
    sets = [(as_, bs)]
    tflop = sum(2 * m * n * k for m, n, k in sizes) / 1e12

    def loop(as_, bs):
        return [torch.mm(a, b) for a, b in zip(as_, bs)]

    def body(family: str | None) -> None:
        ms, ran = bench.samattn_ms(family, samattn.grouped_gemm_list, sets)
        base_ms = bench.baseline_ms(("grouped_list", case.count), loop, sets)
        with samattn.use_family(family):
            outs = samattn.grouped_gemm_list(as_, bs)
        agreement = max(relative_difference(o, r) for o, r in zip(outs, loop(as_, bs)))
        bench.record_rate(
            "grouped_gemm_list", family, ran, "bf16", [case.count], "TFLOPS", tflop, ms, base_ms,
            "torch.mm loop", sizes=[list(size) for size in sizes], versus="torch.mm loop",
            difference_to_baseline=agreement,
        )  # fmt: skip

    bench.run_case(f"grouped_gemm_list {case.count} GEMMs", body)
