"""samattn.bench --ops grouped on the CPU: one record per baseline (torch._grouped_mm when
it runs the case, the torch.mm loop always), skewed loads that add up to the routed rows.
samattn.grouped_gemm is replaced by a torch reference and the sizes are shrunk."""

from __future__ import annotations

import json

import pytest
import torch
from test_bench_attention import OneCallTimer

import samattn
from samattn import bench


def reference(x, w, offsets):
    out = torch.zeros(x.shape[0], w.shape[2], dtype=x.dtype)
    begin = 0
    for e, end in enumerate(offsets.tolist()):
        out[begin:end] = x[begin:end] @ w[e]
        begin = end
    return out


@pytest.mark.parametrize("grouped_mm", ["missing", "refuses", "runs"])
def test_grouped_records(monkeypatch, grouped_mm):
    monkeypatch.setattr(bench, "_randn", lambda shape, dtype: torch.randn(shape).to(dtype))
    monkeypatch.setattr(bench, "GROUPED_HIDDEN", 16)
    monkeypatch.setattr(bench, "GROUPED_EXPERT_DIM", 24)
    monkeypatch.setattr(samattn, "grouped_gemm", reference)
    if grouped_mm == "missing":
        monkeypatch.delattr(torch, "_grouped_mm", raising=False)
    else:

        def fake_grouped_mm(x, w, offs):
            if grouped_mm == "refuses":
                raise RuntimeError("grouped gemm is only supported on SM90")
            return reference(x, w, offs)

        monkeypatch.setattr(torch, "_grouped_mm", fake_grouped_mm, raising=False)

    def samattn_ms(self, family, fn, input_sets):
        return self.timer.median_ms(fn, input_sets), "sm80"

    monkeypatch.setattr(bench.Bench, "_samattn_ms", samattn_ms)
    b = bench.Bench(OneCallTimer(), [None])
    b.grouped((8, 40, "down"))
    assert not b.errors and not b.skipped
    expected = ["torch.mm loop"] + (["torch._grouped_mm"] if grouped_mm == "runs" else [])
    assert [r["versus"] for r in b.records] == expected
    for r in b.records:
        assert r["op"] == "grouped_gemm" and r["shape"] == [8, 40, 24, 16]
        assert sum(r["loads"]) == 80 and r["loads"] == sorted(r["loads"], reverse=True)
        assert r["difference_to_baseline"] < 1e-2
    json.dumps(b.records)


def test_grouped_cases_follow_the_issue():
    full = bench.GROUPED_CASES["full"]
    assert {(e, t) for e, t, _ in full} == {(8, 4096), (8, 16384), (64, 4096), (64, 16384)}
    assert {p for _, _, p in full} == {"up", "down"}
    assert (bench.GROUPED_HIDDEN, bench.GROUPED_EXPERT_DIM) == (4096, 14336)
    loads = bench.skewed_loads(64, 2 * 16384)
    assert sum(loads) == 2 * 16384 and loads[0] > 10 * loads[-1] > 0
    assert bench.parse_args(["--ops", "grouped"]).ops == ["grouped"]
