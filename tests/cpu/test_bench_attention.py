"""samattn.bench's attention cases and benchmarks/readme_table.py, without a GPU.

The attention benchmark runs end to end on CPU tensors here: samattn's kernels are replaced by
a torch reference and the timer by one call, so what is checked is the bookkeeping: the case
grid, the FLOP counts, the records, and how refusing baselines and a missing backward are
recorded as skipped instead of ending the run.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from cpu_helpers import OneCallTimer, ascii_lines, load_readme_table

import samattn
from samattn.bench import cases, common, report, routines, runner

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- cases ----
def test_attention_grid_follows_the_issue():
    full = cases.ATTENTION_CASES["full"]
    assert len(full) == 2 * 3 * 5 * 2
    assert {dtype for dtype, _ in full} == {"bf16", "f16"}
    assert {case.d for _, case in full} == {64, 128, 256}
    assert {case.seqlen for _, case in full} == {1024, 2048, 4096, 8192, 16384}
    assert {case.causal for _, case in full} == {False, True}
    for _, case in full:
        assert case.batch * case.seqlen == 16384
        assert case.heads * case.d == 2048
    assert len(set(full)) == len(full)
    quick = cases.ATTENTION_CASES["quick"]
    assert quick and set(quick) <= set(full)


def test_attention_flops():
    case = cases.attention_case(1024, 64, causal=False)  # batch 16, heads 32
    assert (case.batch, case.heads) == (16, 32)
    forward = 4 * 16 * 32 * 1024 * 1024 * 64 / 1e12
    assert routines.attention.attention_tflop(case, "fwd") == pytest.approx(forward)
    assert routines.attention.attention_tflop(case, "bwd") == pytest.approx(2.5 * forward)
    causal = case._replace(causal=True)
    assert routines.attention.attention_tflop(causal, "fwd") == pytest.approx(forward / 2)
    assert routines.attention.attention_tflop(causal, "bwd") == pytest.approx(2.5 * forward / 2)


# ---------------------------------------------------- skipping baselines ----
def test_a_refusing_baseline_is_skipped_with_its_reasons():
    timer = OneCallTimer()
    b = runner.Bench(timer, [None])

    def refuses(x):
        warnings.warn("Flash attention needs equal head dims", stacklevel=1)
        raise RuntimeError("No available kernel. Aborting execution.")

    ms, reason = b.optional_baseline_ms(("k", 1), lambda: (refuses, [(1,)]))
    assert ms is None
    assert "No available kernel" in reason and "equal head dims" in reason
    assert timer.calls == 0

    def make_fails():
        raise RuntimeError("cuDNN refused the backward")

    assert b.optional_baseline_ms(("k", 2), make_fails) == (None, "cuDNN refused the backward")

    made = []

    def make():
        made.append(1)
        return (lambda x: x, [(1,)])

    assert b.optional_baseline_ms(("k", 3), make) == (1.0, None)
    assert b.optional_baseline_ms(("k", 3), make) == (1.0, None)
    assert made == [1] and timer.calls == 1  # measured once per key


def test_unsupported_and_not_implemented_cases_are_skipped(monkeypatch):
    b = runner.Bench(OneCallTimer(), [None, "sm75"])

    def body(family):
        if family == "sm75":
            raise samattn.UnsupportedError("sm75 has no attention kernels")
        raise NotImplementedError("the backward is not implemented yet")

    b.run_case("attention_backward bf16 case", body, {"op": "attention_backward", "d": 64})
    assert not b.errors and not b.records
    assert [(s["family"], s["op"], s["d"]) for s in b.skipped] == [
        ("auto", "attention_backward", 64),
        ("sm75", "attention_backward", 64),
    ]
    assert b.skipped[0]["reason"] == "the backward is not implemented yet"
    assert "sm75 has no attention kernels" in b.skipped[1]["reason"]
    assert "skipped attention_backward bf16 case [sm75]" in report.summarize(b)


# ------------------------------------------------- attention end to end ----
def reference_flash_attn_func(q, k, v, causal=False, **_):
    """flash_attn_func's layout on torch's math: (batch, seq, heads, d) in and out."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
        is_causal=causal,
    )  # fmt: skip
    return out.to(q.dtype).transpose(1, 2)


class NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("samattn: the FlashAttention backward is not implemented yet")


def run_attention_on_cpu(monkeypatch, flash_attn_func, causal=True):
    monkeypatch.setattr(common, "DEVICE", "cpu")
    monkeypatch.setattr(samattn, "flash_attn_func", flash_attn_func)

    def samattn_ms(self, family, fn, input_sets):
        return self.timer.median_ms(fn, input_sets), "sm80"

    monkeypatch.setattr(runner.Bench, "samattn_ms", samattn_ms)
    b = runner.Bench(OneCallTimer(), [None])
    case = cases.AttentionCase(batch=2, heads=2, seqlen=64, d=32, causal=causal)
    routines.attention.run(b, ("bf16", case))
    return b, case


def test_attention_records_with_a_refusing_cudnn_backend(monkeypatch):
    # On the CPU, SDPA's flash backend runs and the cuDNN backend refuses every case.
    b, case = run_attention_on_cpu(monkeypatch, reference_flash_attn_func)
    assert not b.errors and not b.skipped
    forward, backward = b.records
    expected = [(forward, "attention_forward", "fwd"), (backward, "attention_backward", "bwd")]
    for r, op, direction in expected:
        assert r["op"] == op and r["direction"] == direction
        assert (r["batch"], r["heads"], r["seqlen"], r["d"], r["causal"]) == tuple(case)
        assert r["shape"] == [2, 2, 64, 32] and r["dtype"] == "bf16"
        assert r["family"] == "sm80" and r["forced"] is False
        tflop = routines.attention.attention_tflop(case, direction)
        assert r["samattn"] == pytest.approx(tflop / 1e-3)  # 1 ms
        assert r["baseline"] == pytest.approx(tflop / 1e-3) and r["ratio"] == pytest.approx(1.0)
        assert r["cudnn"] is None and r["ratio_to_cudnn"] is None
        assert "No viable backend" in r["cudnn_skipped"] or r["cudnn_skipped"]
        assert r["compared_with"] == "flash"
        assert r["difference_to_baseline"] < 2e-2  # the same attention, rounded to bf16
    assert "cudnn refused" in report.format_record(forward)
    summary = report.summarize(b)
    assert "attention_forward" in summary and "ERROR" not in summary
    json.dumps(b.records)  # the records go to the JSON file as they are


def test_attention_backward_not_implemented_is_skipped(monkeypatch):
    def forward_only(q, k, v, causal=False, **kwargs):
        return NoBackward.apply(reference_flash_attn_func(q, k, v, causal=causal))

    b, _ = run_attention_on_cpu(monkeypatch, forward_only, causal=False)
    assert not b.errors
    assert [r["op"] for r in b.records] == ["attention_forward"]
    (skipped,) = b.skipped
    assert skipped["op"] == "attention_backward" and skipped["family"] == "auto"
    assert "not implemented yet" in skipped["reason"]


def test_a_broken_attention_is_flagged(monkeypatch):
    def wrong(q, k, v, causal=False, **kwargs):
        return reference_flash_attn_func(q, k, v, causal=not causal)

    b, _ = run_attention_on_cpu(monkeypatch, wrong)
    assert all(r["difference_to_baseline"] > common.AGREEMENT_LIMIT for r in b.records)
    assert "MISMATCH" in report.format_record(b.records[0])


# ------------------------------------------------------------ readme table ----
def attention_record(op, dtype, d, seqlen, causal, tflops, flash, cudnn, family="sm80"):
    case = cases.attention_case(seqlen, d, causal)
    return {
        "op": op, "family": family, "forced": family != "sm80", "dtype": dtype,
        "shape": list(case[:4]), **case._asdict(), "unit": "TFLOPS", "samattn": tflops,
        "baseline": flash, "ratio": tflops / flash if flash else None, "cudnn": cudnn,
        "ratio_to_cudnn": tflops / cudnn if cudnn else None, "difference_to_baseline": 1e-3,
    }  # fmt: skip


def test_readme_table_attention(tmp_path, capsys):
    table = load_readme_table()
    gemm = {
        "op": "gemm", "family": "sm90", "forced": False, "dtype": "bf16",
        "shape": [1, 4096, 4096, 4096], "unit": "TFLOPS", "samattn": 700.0, "baseline": 750.0,
        "ratio": 700 / 750, "difference_to_baseline": 1e-3, "config": "tile=128x256_c2x1 x",
    }  # fmt: skip
    data = {
        "records": [
            gemm,
            attention_record("attention_forward", "f16", 64, 1024, False, 300.0, 280.0, 330.0),
            attention_record("attention_forward", "bf16", 128, 2048, True, 400.0, 320.0, 500.0),
            attention_record("attention_backward", "bf16", 128, 2048, True, 250.0, 250.0, None),
            attention_record("attention_forward", "f16", 64, 1024, False, 20, 280, 330, "sm75"),
        ],
        "skipped": [
            {"case": "x", "op": "attention_backward", "family": "auto", "dtype": "f16",
             "reason": "samattn: the FlashAttention backward is not implemented yet"},
        ],
    }  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))

    table.main([str(path)])
    lines = ascii_lines(capsys.readouterr().out)
    assert lines[2].startswith("| gemm | 4096 x 4096 x 4096 | bfloat16 | 700 TFLOPS | 750 | 0.93")
    rows = [line for line in lines if line.startswith("| bfloat16") or line.startswith("| float16")]
    # bf16 first, then by head dim, seqlen, causal; fwd and bwd side by side.
    assert rows == [
        "| bfloat16 | 128 | 2048 | 8 x 16 | yes | 400 | 1.25 | 0.80 | 250 | 1.00 | - | sm80 |",
        "| float16 | 64 | 1024 | 16 x 32 | no | 300 | 1.07 | 0.91 | - | - | - | sm80 |",
    ]
    assert "skipped: samattn: the FlashAttention backward is not implemented yet" in lines

    table.main([str(path), "attention", "--family", "sm75"])
    out = "\n".join(ascii_lines(capsys.readouterr().out))
    assert "| float16 | 64 | 1024 | 16 x 32 | no | 20 | 0.07 | 0.06 | - | - | - | sm75 |" in out
    assert "gemm" not in out and "skipped" not in out


def test_readme_table_keeps_the_other_ops(capsys):
    table = load_readme_table()
    data = json.loads((ROOT / "benchmarks" / "results" / "h100.json").read_text())
    table.main([str(ROOT / "benchmarks" / "results" / "h100.json")])
    out = capsys.readouterr().out
    # Without an op prefix: the GEMM / softmax table first, then attention's own.
    lines = out.split("\n\n")[0].splitlines()
    automatic = [
        r
        for r in data["records"]
        if not r["forced"] and not r["op"].startswith(("attention", "overhead", "decode"))
    ]
    assert len(lines) == 2 + len(automatic)
    if any(r["op"].startswith("attention") for r in data["records"]):
        assert "| head dim |" in out
    assert math.isclose(float(lines[2].split("|")[6]), automatic[0]["ratio"], abs_tol=0.006)


def test_readme_table_of_the_committed_attention_runs(capsys):
    """The README's attention tables from the committed files: h100.json (its sm90 records
    from the wheel of 2df8940, its sm75 ones from the wheel of c8ede0a) and
    h100_attention_sm80.json (the sm80 records it held before, when sm80 was the automatic
    family)."""
    table = load_readme_table()
    results = ROOT / "benchmarks" / "results"

    table.main([str(results / "h100.json"), "attention"])
    lines = ascii_lines(capsys.readouterr().out)
    assert (
        "| bfloat16 | 128 | 16384 | 1 x 16 | no | 642 | 1.80 | 1.12 | 524 | 1.65 | 0.95 | sm90 |"
        in lines
    )
    # The same run's score terms and masks follow the attention table.
    assert any(
        line.startswith("| head dim | seqlen | batch x heads | causal | ALiBi fwd")
        for line in lines
    )

    table.main([str(results / "h100.json"), "attention", "--family", "sm75"])
    lines = ascii_lines(capsys.readouterr().out)
    assert (
        "| float16 | 64 | 1024 | 16 x 32 | no | 167 | 0.60 | 0.40 | 118 | 0.49 | 0.36 | sm75 |"
        in lines
    )
    # No sm75 backward above head dim 192: dashes, and the reason below the table.
    assert "| float16 | 256 | 1024 | 16 x 8 | no | 138 | 0.49 | 0.23 | - | - | - | sm75 |" in lines
    assert any("the sm75 backward supports head dims up to 192" in line for line in lines)
    assert not any(line.startswith("| bfloat16") for line in lines)

    # The sm80 records were the automatic family's when measured: no --family.
    table.main([str(results / "h100_attention_sm80.json"), "attention"])
    rows = [line for line in ascii_lines(capsys.readouterr().out) if line.startswith("| ")]
    assert len(rows) == 2 + 60
    assert (
        "| bfloat16 | 128 | 16384 | 1 x 16 | no | 373 | 1.04 | 0.60 | 316 | 1.01 | 0.57 | sm80 |"
        in rows
    )
    table.main([str(results / "h100_attention_sm80.json"), "attention", "--family", "sm75"])
    out = "\n".join(ascii_lines(capsys.readouterr().out))
    assert (
        "| float16 | 64 | 1024 | 16 x 32 | no | 170 | 0.60 | 0.39 | 120 | 0.50 | 0.36 | sm75 |"
        in out
    )
