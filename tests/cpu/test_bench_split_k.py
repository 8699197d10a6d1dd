"""samattn.bench --ops split_k on the CPU: one record per split choice, and the choices a
family refuses go to `skipped` with its reason. samattn.gemm is replaced by torch.matmul."""

from __future__ import annotations

import json

import torch
from cpu_helpers import OneCallTimer

import samattn
from samattn import _cuda, bench
from samattn.bench import cases, common, report, routines, runner

SHAPE = (8, 16, 256)


def run_split_k_on_cpu(monkeypatch) -> runner.Bench:
    monkeypatch.setattr(common, "DEVICE", "cpu")

    def gemm(a, b, *, split_k="auto", split_k_mode="auto"):
        if split_k_mode == "serial":
            raise samattn.UnsupportedError("serial split-K runs on the sm90 family")
        return torch.matmul(a, b)

    monkeypatch.setattr(samattn, "gemm", gemm)
    monkeypatch.setattr(_cuda, "gemm_plan", lambda a, b, **kw: ("sm80", f"split_k={kw['split_k']}"))

    def samattn_ms(self, family, fn, input_sets):
        return self.timer.median_ms(fn, input_sets), "sm80"

    monkeypatch.setattr(runner.Bench, "samattn_ms", samattn_ms)
    b = runner.Bench(OneCallTimer(), [None])
    routines.split_k.run(b, ("bf16", SHAPE))
    return b


def test_split_k_records(monkeypatch):
    b = run_split_k_on_cpu(monkeypatch)
    assert not b.errors
    ran = [(s, m) for s, m in cases.SPLIT_K_CHOICES if m != "serial"]
    assert [(r["split_k"], r["split_k_mode"]) for r in b.records] == ran
    assert [(s["split_k"], s["split_k_mode"]) for s in b.skipped] == [
        (s, m) for s, m in cases.SPLIT_K_CHOICES if m == "serial"
    ]
    assert all("serial split-K runs on the sm90 family" in s["reason"] for s in b.skipped)
    tflop = 2 * 8 * 16 * 256 / 1e12
    for r in b.records:
        assert r["op"] == "gemm_split_k" and r["shape"] == list(SHAPE)
        assert r["samattn"] == tflop / 1e-3 and r["ratio"] == 1.0
        assert r["config"] == f"split_k={r['split_k']}"
        assert "split_k=" in report.format_record(r)
    json.dumps(b.records)
    json.dumps(b.skipped)


def test_split_k_cases_follow_the_issue():
    assert {shape for _, shape in cases.SPLIT_K_CASES["full"]} >= {
        (256, 256, 65536),
        (512, 512, 65536),
    }
    assert ("auto", "auto") in cases.SPLIT_K_CHOICES
    assert {m for _, m in cases.SPLIT_K_CHOICES} == {"auto", "serial", "parallel"}
    assert bench.parse_args(["--ops", "split_k"]).ops == ["split_k"]
