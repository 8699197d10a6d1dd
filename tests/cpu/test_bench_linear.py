"""samattn.bench --ops linear on the CPU: records per torch baseline, and a torch.compile
that cannot run leaves the eager baseline alone. samattn.linear is replaced by torch's."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from cpu_helpers import OneCallTimer

import samattn
from samattn import bench
from samattn.bench import cases, common, report, routines, runner

SHAPE = (8, 16, 32)


def reference_linear(x, w, b=None, activation=None):
    return F.gelu(F.linear(x, w, b))


def run_linear_on_cpu(monkeypatch, compile_works: bool) -> runner.Bench:
    monkeypatch.setattr(common, "DEVICE", "cpu")
    monkeypatch.setattr(samattn, "linear", reference_linear)

    def fake_compile(fn, **kwargs):
        if compile_works:
            return fn

        def refuse(*args):
            raise RuntimeError("no inductor backend here")

        return refuse

    monkeypatch.setattr(torch, "compile", fake_compile)

    def samattn_ms(self, family, fn, input_sets):
        return self.timer.median_ms(fn, input_sets), "sm90"

    monkeypatch.setattr(runner.Bench, "samattn_ms", samattn_ms)
    b = runner.Bench(OneCallTimer(), [None])
    routines.linear.run(b, ("bf16", SHAPE))
    return b


@pytest.mark.parametrize("compile_works", [True, False])
def test_linear_records(monkeypatch, compile_works):
    b = run_linear_on_cpu(monkeypatch, compile_works)
    assert not b.errors and not b.skipped
    expected = ["eager", "compiled"] if compile_works else ["eager"]
    assert [r["versus"] for r in b.records] == expected
    tflop = 2 * 8 * 16 * 32 / 1e12
    for r in b.records:
        assert r["op"] == "linear_epilogue" and r["shape"] == list(SHAPE)
        assert r["samattn"] == pytest.approx(tflop / 1e-3) and r["ratio"] == pytest.approx(1.0)
        assert r["difference_to_baseline"] == 0.0
        assert r["baseline_name"].startswith("F.gelu(F.linear(x, w, b)), torch ")
    json.dumps(b.records)
    assert "linear_epilogue vs eager" in report.summarize(b)


def test_linear_cases_follow_the_issue():
    full = cases.LINEAR_CASES["full"]
    assert {shape for _, shape in full} == {
        (tokens, n_in, n_out)
        for tokens in (4096, 16384)
        for n_in, n_out in ((4096, 14336), (14336, 4096))
    }
    assert "linear" in bench.OPS and bench.parse_args(["--ops", "linear"]).ops == ["linear"]
