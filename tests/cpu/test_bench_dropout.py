"""samattn.bench --ops dropout on the CPU: the records of what dropout costs, forward and
backward, against SDPA's flash backend with the same dropout_p and against samattn without
dropout. samattn.flash_attn_func is replaced by torch's math (with torch's dropout)."""

from __future__ import annotations

import json

import pytest
import torch
from cpu_helpers import OneCallTimer

import samattn
from samattn import bench
from samattn.bench import cases, common, report, routines, runner


def reference_flash_attn_func(q, k, v, dropout_p=0.0, causal=False, **_):
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
        dropout_p=dropout_p, is_causal=causal,
    )  # fmt: skip
    return out.to(q.dtype).transpose(1, 2)


def test_dropout_records(monkeypatch):
    monkeypatch.setattr(common, "DEVICE", "cpu")
    calls = []

    def flash_attn_func(q, k, v, dropout_p=0.0, causal=False, **kwargs):
        calls.append(dropout_p)
        return reference_flash_attn_func(q, k, v, dropout_p, causal)

    monkeypatch.setattr(samattn, "flash_attn_func", flash_attn_func)

    def samattn_ms(self, family, fn, input_sets):
        return self.timer.median_ms(fn, input_sets), "sm80"

    monkeypatch.setattr(runner.Bench, "samattn_ms", samattn_ms)
    b = runner.Bench(OneCallTimer(), [None])
    case = cases.AttentionCase(batch=2, heads=2, seqlen=64, d=32, causal=True)
    routines.dropout.run(b, ("bf16", case))
    assert not b.errors, b.errors
    assert {0.0, cases.DROPOUT_P} <= set(calls)
    records = [r for r in b.records if r["op"] == "attention_dropout"]
    assert [r["direction"] for r in records] == ["fwd", "bwd"]
    for r in records:
        tflop = routines.attention.attention_tflop(case, r["direction"])
        assert r["samattn"] == pytest.approx(tflop / 1e-3) and r["shape"] == [2, 2, 64, 32]
        assert r["dropout_p"] == cases.DROPOUT_P and r["causal"] is True
        assert r["ratio_to_plain"] == pytest.approx(1.0) and r["plain_ms"] == 1.0
        # SDPA's flash backend with dropout runs on the CPU, or says why not.
        assert r["ratio"] == pytest.approx(1.0) or r["baseline_skipped"]
        assert r["what"].startswith(r["direction"])
        assert "attention_dropout" in report.format_record(r)
    json.dumps(b.records)


def test_dropout_cases():
    full = cases.DROPOUT_CASES["full"]
    assert {c.d for _, c in full} == {64, 128} and {c.seqlen for _, c in full} == {1024, 4096}
    assert set(cases.DROPOUT_CASES["quick"]) <= set(full)
    assert "dropout" in bench.OPS and bench.parse_args(["--ops", "dropout"]).ops == ["dropout"]
