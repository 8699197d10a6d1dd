"""samattn.bench --ops grouped on the CPU: one record per baseline (torch._grouped_mm when
it runs the case, the torch.mm loop always), skewed loads that add up to the routed rows.
samattn.grouped_gemm is replaced by a torch reference and the sizes are shrunk."""

from __future__ import annotations

import json

import pytest
import torch
from cpu_helpers import OneCallTimer

import samattn
from samattn import bench
from samattn.bench import cases, common, routines, runner


def reference(x, w, offsets):
    out = torch.zeros(x.shape[0], w.shape[2], dtype=x.dtype)
    begin = 0
    for e, end in enumerate(offsets.tolist()):
        out[begin:end] = x[begin:end] @ w[e]
        begin = end
    return out


def bench_with_family(monkeypatch, family: str) -> runner.Bench:
    """A Bench whose samattn timings time the replaced op once and report `family`."""

    def samattn_ms(self, _family, fn, input_sets):
        return self.timer.median_ms(fn, input_sets), family

    monkeypatch.setattr(runner.Bench, "samattn_ms", samattn_ms)
    return runner.Bench(OneCallTimer(), [None])


@pytest.mark.parametrize("grouped_mm", ["missing", "refuses", "runs"])
def test_grouped_records(monkeypatch, grouped_mm):
    monkeypatch.setattr(common, "DEVICE", "cpu")
    monkeypatch.setattr(samattn, "grouped_gemm", reference)
    if grouped_mm == "missing":
        monkeypatch.delattr(torch, "_grouped_mm", raising=False)
    else:

        def fake_grouped_mm(x, w, offs):
            if grouped_mm == "refuses":
                raise RuntimeError("grouped gemm is only supported on SM90")
            return reference(x, w, offs)

        monkeypatch.setattr(torch, "_grouped_mm", fake_grouped_mm, raising=False)

    b = bench_with_family(monkeypatch, "sm80")
    routines.grouped.run(b, cases.GroupedCase(8, 40, "down", hidden=16, expert_dim=24))
    assert not b.errors and not b.skipped
    expected = ["torch.mm loop"] + (["torch._grouped_mm"] if grouped_mm == "runs" else [])
    assert [r["versus"] for r in b.records] == expected
    for r in b.records:
        assert r["op"] == "grouped_gemm" and r["shape"] == [8, 40, 24, 16]
        assert sum(r["loads"]) == 80 and r["loads"] == sorted(r["loads"], reverse=True)
        assert r["difference_to_baseline"] < 1e-2
    json.dumps(b.records)


def weight_gradient_reference(xt, dy, offsets):
    begins = [0, *offsets.tolist()[:-1]]
    return torch.stack([xt[:, b:e] @ dy[b:e] for b, e in zip(begins, offsets.tolist())])


@pytest.mark.parametrize("grouped_mm", ["missing", "runs"])
def test_weight_gradient_records(monkeypatch, grouped_mm):
    """The K-grouped GEMM of the backward against the loop and torch._grouped_mm's 2-D x
    2-D form (offsets along K)."""
    monkeypatch.setattr(common, "DEVICE", "cpu")
    monkeypatch.setattr(routines.grouped, "weight_gradient_op", weight_gradient_reference)
    if grouped_mm == "missing":
        monkeypatch.delattr(torch, "_grouped_mm", raising=False)
    else:
        fake = lambda xt, dy, offs: weight_gradient_reference(xt, dy, offs)  # noqa: E731
        monkeypatch.setattr(torch, "_grouped_mm", fake, raising=False)

    b = bench_with_family(monkeypatch, "sm90")
    routines.grouped.run(b, cases.GroupedCase(8, 40, "up_wgrad", hidden=16, expert_dim=24))
    assert not b.errors and not b.skipped
    expected = ["torch.mm loop"] + (["torch._grouped_mm"] if grouped_mm == "runs" else [])
    assert [r["versus"] for r in b.records] == expected
    for r in b.records:
        assert r["projection"] == "up_wgrad" and r["shape"] == [8, 40, 16, 24]
        assert r["difference_to_baseline"] < 1e-2


def test_grouped_list_records(monkeypatch):
    monkeypatch.setattr(common, "DEVICE", "cpu")
    reference_list = lambda as_, bs: [a @ b for a, b in zip(as_, bs)]  # noqa: E731
    monkeypatch.setattr(samattn, "grouped_gemm_list", reference_list)

    b = bench_with_family(monkeypatch, "sm90")
    case = cases.GroupedListCase(8, (("m", (3, 5)), ("n", (4, 8)), ("k", (2, 6))))
    routines.grouped.run(b, case)
    assert not b.errors and not b.skipped
    (r,) = b.records
    assert r["op"] == "grouped_gemm_list" and r["shape"] == [8] and len(r["sizes"]) == 8
    assert r["sizes"] == [list(size) for size in cases.list_sizes(case)]  # the same every run
    assert r["difference_to_baseline"] < 1e-2
    json.dumps(b.records)


def test_grouped_cases_follow_the_issue():
    full = [c for c in cases.GROUPED_CASES["full"] if isinstance(c, cases.GroupedCase)]
    assert {(c.experts, c.tokens) for c in full} == {(8, 4096), (8, 16384), (64, 4096), (64, 16384)}
    assert {c.projection for c in full} == {"up", "down", "up_wgrad", "down_wgrad"}
    assert {(c.hidden, c.expert_dim) for c in full} == {(4096, 14336)}
    lists = [c for c in cases.GROUPED_CASES["full"] if isinstance(c, cases.GroupedListCase)]
    assert [c.count for c in lists] == [8, 64]
    loads = cases.skewed_loads(64, 2 * 16384)
    assert sum(loads) == 2 * 16384 and loads[0] > 10 * loads[-1] > 0
    assert bench.parse_args(["--ops", "grouped"]).ops == ["grouped"]
