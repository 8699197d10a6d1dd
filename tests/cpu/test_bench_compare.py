"""samattn.bench --compare on small synthetic result files (no GPU), and the default
families of a run (every family the GPU can run, with the library's answers mocked)."""

from __future__ import annotations

import json

import pytest

from samattn import _lib, bench
from samattn.bench import cli, compare


def gemm(family="sm80", forced=True, tflops=300.0, ratio=0.5, dtype="bf16", n=4096, ms=0.45):
    return {
        "op": "gemm", "family": family, "forced": forced, "dtype": dtype,
        "shape": [1, n, n, n], "unit": "TFLOPS", "samattn": tflops, "baseline": tflops / ratio,
        "ratio": ratio, "samattn_ms": ms, "baseline_ms": ms * ratio,
    }  # fmt: skip


def overhead(us=10.0, ratio=0.8):
    return {
        "op": "overhead_gemm", "family": "sm90", "forced": False, "dtype": "-", "shape": [],
        "what": "gemm bf16 1024^3", "unit": "us", "samattn": us, "baseline": us * ratio,
        "ratio": ratio,
    }  # fmt: skip


def attention(direction="fwd", tflops=400.0, causal=False):
    return {
        "op": f"attention_{'forward' if direction == 'fwd' else 'backward'}", "family": "sm90",
        "forced": False, "dtype": "bf16", "shape": [8, 16, 2048, 128], "batch": 8, "heads": 16,
        "seqlen": 2048, "d": 128, "causal": causal, "direction": direction, "unit": "TFLOPS",
        "samattn": tflops, "baseline": 400.0, "ratio": tflops / 400.0, "samattn_ms": 1.0,
    }  # fmt: skip


def results(records, gpu="NVIDIA H100 80GB HBM3"):
    return {
        "gpu": gpu,
        "date": "2026-12-01",
        "command": "python -m samattn.bench",
        "records": records,
    }


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_records_match_by_their_identifying_fields():
    old = [gemm(), gemm(dtype="f16"), attention("fwd"), attention("bwd"), attention(causal=True)]
    new = [attention(causal=True), attention("bwd"), attention("fwd"), gemm(dtype="f16"), gemm()]
    result = compare.compare(old, new)
    assert not result.only_old and not result.only_new
    assert all(c.old == c.new for c in result.pairs)
    assert [c.change for c in result.pairs] == [0.0] * 5


def test_records_sharing_their_fields_match_in_order():
    # A forced sm90 GEMM that ran on sm80, then the forced sm80 one: the same fields.
    old = [gemm(tflops=200.0), gemm(tflops=300.0)]
    new = [gemm(tflops=210.0), gemm(tflops=240.0)]
    changes = [round(c.change, 3) for c in compare.compare(old, new).pairs]
    assert changes == [0.05, -0.2]


def test_moved_records_are_reported_with_both_numbers(tmp_path):
    old = results([gemm(tflops=376.0, ratio=0.49, ms=0.366), gemm(dtype="f16"), overhead(10.0)])
    new = results([gemm(tflops=200.0, ratio=0.26, ms=0.687), gemm(dtype="f16", tflops=330.0),
                   overhead(12.0), attention()])  # fmt: skip
    lines = []
    status = compare.compare_files(
        write(tmp_path, "old.json", old), write(tmp_path, "new.json", new), out=lines.append
    )
    text = "\n".join(lines)
    assert status == 1
    assert "3 records" in text and "2 slower, 1 faster, 0 within" in text
    slower = text[text.index("slower:") : text.index("faster:")]
    # The worst first: the sm80 bf16 GEMM, its TFLOPS, ratio to torch and time, old -> new.
    first = slower.splitlines()[1]
    assert first.strip().startswith("-46.8%  gemm sm80 bf16 1x4096x4096x4096")
    assert "376 TFLOPS -> 200 TFLOPS" in first
    assert "ratio to torch 0.49 -> 0.26" in first and "0.366 ms -> 0.687 ms" in first
    # A time (overhead, microseconds) that grew is slower: 1 / 1.2 - 1.
    assert "-16.7%  overhead_gemm sm90* - gemm bf16 1024^3: 10 us -> 12 us" in slower
    assert "+10.0%  gemm sm80 f16 1x4096x4096x4096: 300 TFLOPS -> 330 TFLOPS" in text
    assert "only in new: 1 (attention_forward 1)" in text


def test_threshold_report_only_and_compare_by_ratio(tmp_path):
    old = write(tmp_path, "old.json", results([gemm(tflops=300.0, ratio=0.50)]))
    new = write(tmp_path, "new.json", results([gemm(tflops=290.0, ratio=0.40)]))
    assert compare.compare_files(old, new, out=lambda line: None) == 0  # -3.3%: within 5%
    assert compare.compare_files(old, new, threshold=0.02, out=lambda line: None) == 1
    assert compare.compare_files(old, new, 0.02, report_only=True, out=lambda line: None) == 0
    lines = []
    assert compare.compare_files(old, new, by="ratio", out=lines.append) == 1  # -20%
    assert "-20.0%" in "\n".join(lines) and "ratio to torch" in "\n".join(lines)


def test_files_of_two_gpus_or_not_results_are_refused(tmp_path):
    old = write(tmp_path, "old.json", results([gemm()]))
    other = write(tmp_path, "a100.json", results([gemm()], gpu="NVIDIA A100-SXM4-80GB"))
    lines = []
    assert compare.compare_files(old, other, out=lines.append) == 2
    assert "compare runs of one GPU" in lines[-1]
    assert compare.compare_files(old, other, any_gpu=True, out=lambda line: None) == 0
    broken = write(tmp_path, "broken.json", {"gpu": "x"})
    assert compare.compare_files(old, broken, out=lines.append) == 2
    assert "no 'records' list" in lines[-1]
    assert compare.compare_files(old, str(tmp_path / "missing.json"), out=lines.append) == 2


def test_missing_numbers_are_listed_not_compared():
    old, new = gemm(), gemm()
    new["samattn"] = None
    (change,) = compare.compare([old], [new]).pairs
    assert change.change is None
    lines = []
    assert compare.report(results([old]), results([new]), out=lines.append) == 0
    assert any("not comparable" in line for line in lines)


def test_the_committed_results_compare_with_themselves(tmp_path):
    path = "benchmarks/results/h100.json"
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / path).read_text())
    result = compare.compare(data["records"], data["records"])
    assert len(result.pairs) == len(data["records"]) and not result.only_old
    assert all(c.change in (0.0, None) for c in result.pairs)


def test_main_compares_two_files_without_a_gpu(tmp_path, capsys):
    old = write(tmp_path, "old.json", results([gemm(tflops=376.0)]))
    new = write(tmp_path, "new.json", results([gemm(tflops=200.0)]))
    assert bench.main(["--compare", old, new]) == 1
    assert "-46.8%" in capsys.readouterr().out
    assert bench.main(["--compare", old, new, "--threshold", "50"]) == 0
    assert bench.main(["--compare", old, new, "--report-only"]) == 0
    with pytest.raises(SystemExit):
        bench.parse_args(["--compare", old, new, new])


def test_default_families_are_every_family_the_gpu_runs(monkeypatch):
    """Automatic selection plus each built family that the library accepts, forced, for
    some op and dtype on this compute capability (sm90 only on 9.0)."""
    monkeypatch.setattr(_lib, "built_families", lambda: ["sm75", "sm80", "sm90"])

    def select_family(op, dtype, cc, requested, allow_tf32):
        family = _lib.FAMILY_NAMES[requested]
        if family == "sm90" and cc != (9, 0):
            raise _lib.UnsupportedError(f"{family} cannot run on {cc}")
        if family == "sm75" and cc < (7, 5):
            raise _lib.UnsupportedError("too old")
        return family

    monkeypatch.setattr(_lib, "select_family", select_family)
    assert cli.runnable_families((9, 0)) == ["sm90", "sm80", "sm75"]
    assert cli.runnable_families((8, 6)) == ["sm80", "sm75"]
    monkeypatch.setattr(cli.torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert cli.default_families() == ["auto", "sm80", "sm75"]
    assert bench.parse_args([]).families is None  # computed on the GPU
    assert bench.parse_args(["--families", "auto,sm75"]).families == ["auto", "sm75"]
