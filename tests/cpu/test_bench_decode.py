"""samattn.bench's decode section (--ops decode) and its README table, without a GPU.

The decode benchmark runs end to end on small CPU tensors here: samattn.flash_attn_with_kvcache
is replaced by a torch reference, the timer by one call with fixed times, and the CUDA graph and
host-time measurements by constants, so what is checked is the bookkeeping: the case grid, the
bytes counted, the paged inputs, the records and their ratios, the value-check switch around the
timings, and the cases skipped for memory or for a library without flash_attn_with_kvcache.
"""

from __future__ import annotations

import json

import pytest
import torch
from cpu_helpers import load_readme_table

import samattn
from samattn import bench
from samattn.bench import cases, common, report, routines, runner, timing

# The times the fake timer reports, in ms: samattn 0.5 on contiguous caches and 0.625 on paged
# ones, SDPA 1.0, the copy 0.25.
SAMATTN_MS, PAGED_MS, SDPA_MS, COPY_MS = 0.5, 0.625, 1.0, 0.25
GRAPH_US, HOST_US = 7.0, 30.0
SDPA = torch.nn.functional.scaled_dot_product_attention  # the references' (tests patch it)


class FixedTimer:
    """Calls fn once on the first input set and reports the fixed time of that kind of call."""

    def __init__(self) -> None:
        self.timed: list[str] = []

    def input_set_count(self, set_bytes: int) -> int:
        return 2  # two sets, as small caches rotate

    def median_ms(self, fn, input_sets) -> float:
        fn(*input_sets[0])
        name = getattr(fn, "__name__", "")
        self.timed.append(name)
        if name == "samattn_decode":
            return SAMATTN_MS if input_sets[0][4] is None else PAGED_MS
        if name == "sdpa_decode":
            return SDPA_MS
        return COPY_MS


def gather(cache: torch.Tensor, block_table, row: int, length: int) -> torch.Tensor:
    if block_table is None:
        return cache[row, :length]
    return torch.cat([cache[page] for page in block_table[row].tolist()])[:length]


def reference_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal=False,
                      **options):  # fmt: skip
    """flash_attn_with_kvcache without append, non-causal, on torch's math."""
    assert not causal and not options
    out = []
    for row in range(q.shape[0]):
        length = int(cache_seqlens[row])
        k = gather(k_cache, block_table, row, length).float()
        v = gather(v_cache, block_table, row, length).float()
        group = q.shape[2] // k.shape[1]
        o = SDPA(
            q[row].float().transpose(0, 1),
            k.transpose(0, 1).repeat_interleave(group, 0),
            v.transpose(0, 1).repeat_interleave(group, 0),
        )
        out.append(o.transpose(0, 1))
    return torch.stack(out).to(q.dtype)


class ValueChecks:
    """Stands in for samattn.set_value_checks / value_checks_enabled."""

    def __init__(self) -> None:
        self.enabled = True

    def set(self, enabled: bool) -> None:
        assert isinstance(enabled, bool)
        self.enabled = enabled

    def get(self) -> bool:
        return self.enabled


class CallLog(list):
    """The kvcache calls, (paged, value checks on), and the value-check switch."""

    checks: ValueChecks


@pytest.fixture
def cpu_decode(monkeypatch):
    """The decode section on the CPU; yields the log of kvcache calls: (paged, checks on)."""
    monkeypatch.setattr(common, "DEVICE", "cpu")
    monkeypatch.setattr(routines.decode, "SMALL", (1, 64))
    monkeypatch.setattr(runner, "COPY_BYTES", 2**20)
    monkeypatch.setattr(common, "free_memory_bytes", lambda: 2**40)
    monkeypatch.setattr(timing, "graph_gpu_us", lambda fn: (fn(), GRAPH_US)[1])
    monkeypatch.setattr(timing, "host_us", lambda fn: (fn(), HOST_US)[1])
    checks = ValueChecks()
    monkeypatch.setattr(samattn, "set_value_checks", checks.set, raising=False)
    monkeypatch.setattr(samattn, "value_checks_enabled", checks.get, raising=False)
    log = CallLog()
    log.checks = checks

    def kvcache(q, k_cache, v_cache, **options):
        log.append((options.get("block_table") is not None, checks.enabled))
        return reference_kvcache(q, k_cache, v_cache, **options)

    monkeypatch.setattr(samattn, "flash_attn_with_kvcache", kvcache, raising=False)

    def samattn_ms(self, family, fn, input_sets):
        return self.timer.median_ms(fn, input_sets), "sm80"

    monkeypatch.setattr(runner.Bench, "samattn_ms", samattn_ms)
    return log


def small_case(batch=3, seqlen_q=4, seqlen_k=64, paged=0) -> cases.DecodeCase:
    return cases.DecodeCase(batch, seqlen_q, seqlen_k, heads=4, heads_k=2, d=16, paged=paged)


def run(cases, families=(None,)) -> runner.Bench:
    b = runner.Bench(FixedTimer(), list(families))
    for case in cases:
        routines.decode.run(b, ("bf16", case))
    return b


# ---------------------------------------------------------------- cases ----
def test_decode_grid_follows_the_issue():
    full = cases.DECODE_CASES["full"]
    assert len(full) == 2 * 3 * 4 * 3
    assert {dtype for dtype, _ in full} == {"bf16"}
    assert {(c.heads, c.heads_k, c.d) for _, c in full} == {(32, 8, 128)}
    assert {c.seqlen_q for _, c in full} == {1, 4}
    assert {c.batch for _, c in full} == {1, 8, 64}
    assert {c.seqlen_k for _, c in full} == {1024, 8192, 32768, 131072}
    assert {c.paged for _, c in full} == {0, 16, 256}
    assert len(set(full)) == len(full)
    grid = [c for _, c in full]
    for i, case in enumerate(grid):  # each paged case after its contiguous one
        if case.paged:
            assert case._replace(paged=0) in grid[:i]
    quick = [c for _, c in cases.DECODE_CASES["quick"]]
    assert quick and set(quick) <= set(grid)
    for i, case in enumerate(quick):
        if case.paged:
            assert case._replace(paged=0) in quick[:i]
    assert "decode" in bench.OPS
    assert "decode" in bench.parse_args([]).ops
    assert bench.parse_args(["--ops", "decode"]).ops == ["decode"]


def test_kv_bytes_and_labels():
    case = cases.decode_case(64, 1, 131072, paged=16)
    assert cases.decode_kv_bytes(case) == 2 * 64 * 131072 * 8 * 128 * 2 == 32 * 2**30
    assert cases.decode_what(case) == "b64 sq1 L128k page16"
    assert cases.decode_what(cases.decode_case(1, 4, 1000)) == "b1 sq4 L1000 contiguous"


def test_paged_inputs_shuffle_whole_pages(monkeypatch):
    monkeypatch.setattr(common, "DEVICE", "cpu")
    torch.manual_seed(0)
    case = small_case(batch=3, seqlen_k=64, paged=16)
    q, k_cache, v_cache, cache_seqlens, block_table = routines.decode.inputs(case, torch.bfloat16)
    assert q.shape == (3, 4, 4, 16) and q.dtype == torch.bfloat16
    assert k_cache.shape == v_cache.shape == (12, 16, 2, 16)
    assert cache_seqlens.tolist() == [64, 64, 64] and cache_seqlens.dtype == torch.int32
    assert block_table.shape == (3, 4) and block_table.dtype == torch.int32
    assert sorted(block_table.flatten().tolist()) == list(range(12))  # every page once
    assert block_table.flatten().tolist() != list(range(12))  # shuffled
    for row in range(3):
        k, v = routines.decode.sequence_kv(k_cache, v_cache, block_table, row, 64)
        assert torch.equal(k, gather(k_cache, block_table, row, 64))
        assert torch.equal(v, gather(v_cache, block_table, row, 64))
    contiguous = routines.decode.inputs(small_case(), torch.bfloat16)
    assert contiguous[1].shape == (3, 64, 2, 16) and contiguous[4] is None


def test_attention_reference_matches_sdpa_with_repeated_heads():
    torch.manual_seed(0)
    q, k, v = torch.randn(4, 8, 32), torch.randn(50, 2, 32), torch.randn(50, 2, 32)
    expected = SDPA(
        q.transpose(0, 1), k.transpose(0, 1).repeat_interleave(4, 0),
        v.transpose(0, 1).repeat_interleave(4, 0),
    ).transpose(0, 1)  # fmt: skip
    torch.testing.assert_close(routines.decode.attention_reference(q, k, v), expected)


def test_value_checks_switch_restores_the_previous_setting(monkeypatch):
    checks = ValueChecks()
    monkeypatch.setattr(samattn, "set_value_checks", checks.set, raising=False)
    monkeypatch.setattr(samattn, "value_checks_enabled", checks.get, raising=False)
    with common.value_checks(False):
        assert checks.enabled is False
        with common.value_checks(True):
            assert checks.enabled is True
        assert checks.enabled is False
    assert checks.enabled is True
    monkeypatch.delattr(samattn, "set_value_checks")
    with common.value_checks(False):  # a library without the switch: nothing to do
        pass


# ---------------------------------------------------------- end to end ----
def test_decode_records(cpu_decode, capsys):
    contiguous, paged = small_case(), small_case(paged=16)
    b = run([contiguous, paged])
    assert not b.errors and not b.skipped
    first, second = b.records
    kv_bytes = 2 * 3 * 64 * 2 * 16 * 2
    copy = 2 * 2**20 / 1e9 / (COPY_MS / 1e3)
    for r, case, ms in ((first, contiguous, SAMATTN_MS), (second, paged, PAGED_MS)):
        assert r["op"] == "decode" and r["dtype"] == "bf16" and r["unit"] == "GB/s"
        assert r["family"] == "sm80" and r["forced"] is False
        assert (r["batch"], r["seqlen_q"], r["seqlen_k"], r["heads"], r["heads_k"], r["d"]) == (
            3, 4, 64, 4, 2, 16,
        )  # fmt: skip
        assert r["paged"] == case.paged and r["what"] == cases.decode_what(case)
        assert r["kv_bytes"] == kv_bytes
        assert r["samattn_us"] == pytest.approx(ms * 1e3)
        assert r["samattn"] == pytest.approx(kv_bytes / 1e9 / (ms / 1e3))
        assert r["copy"] == pytest.approx(copy)
        assert r["copy_fraction"] == pytest.approx(r["samattn"] / copy)
        assert r["difference_to_reference"] < 1e-2  # the same attention, in bf16
        assert "samattn_graph_us" not in r  # not the small case
    # Contiguous: against SDPA, ratio = SDPA's time / samattn's.
    assert first["baseline_us"] == pytest.approx(SDPA_MS * 1e3)
    assert first["ratio"] == pytest.approx(SDPA_MS / SAMATTN_MS)
    assert "baseline_skipped" not in first
    # Paged: no SDPA; contiguous time / paged time.
    assert second["baseline"] is None and second["ratio"] is None
    assert second["ratio_to_contiguous"] == pytest.approx(SAMATTN_MS / PAGED_MS)
    assert second["contiguous_us"] == pytest.approx(SAMATTN_MS * 1e3)
    # The first call of each case checks the values; the timed ones run without the check.
    assert cpu_decode[0] == (False, True)
    assert cpu_decode[1] == (False, False)
    assert cpu_decode.checks.enabled is True  # restored
    assert (True, True) in cpu_decode and (True, False) in cpu_decode
    assert b.timer.timed.count("<lambda>") == 1  # the copy, measured once per run
    json.dumps(b.records)
    out = capsys.readouterr().out
    assert "device-to-device copy" in out
    assert "of copy" in report.format_record(first) and "of contiguous" in report.format_record(
        second
    )
    summary = report.summarize(b)
    assert "decode sm80 target 1.00 x sdpa, contiguous: 1 of 1 cases meet it" in summary
    assert "decode sm80 target 0.95 of contiguous, paged: 0 of 1 cases meet it" in summary
    assert "below: b3 sq4 L64 page16 0.80" in summary
    assert "MISMATCH" not in summary and "ERROR" not in summary


def test_the_small_case_gets_graph_and_host_times(cpu_decode):
    b = run([small_case(batch=1, seqlen_q=1), small_case(batch=1, seqlen_q=1, paged=16)])
    contiguous, paged = b.records
    for who in ("samattn", "baseline"):
        assert contiguous[f"{who}_graph_us"] == GRAPH_US
        assert contiguous[f"{who}_host_us"] == HOST_US
    assert contiguous["samattn_host_checked_us"] == HOST_US
    assert paged["samattn_graph_us"] == GRAPH_US and "baseline_graph_us" not in paged
    text = report.format_record(contiguous)
    assert "graph 7.0" in text and "sdpa host 30.0" in text


def test_a_case_too_large_for_memory_is_skipped(cpu_decode, monkeypatch, capsys):
    monkeypatch.setattr(common, "free_memory_bytes", lambda: 10_000)
    b = run([small_case()], families=(None, "sm75"))
    assert not b.records and not b.errors and not cpu_decode
    assert [s["family"] for s in b.skipped] == ["auto", "sm75"]
    skipped = b.skipped[0]
    assert skipped["op"] == "decode" and skipped["paged"] == 0 and skipped["kv_bytes"] == 24576
    assert "60% of the" in skipped["reason"] and "free GPU memory" in skipped["reason"]
    assert "skipped decode bf16 b3 sq4 L64 contiguous" in capsys.readouterr().out


def test_a_library_without_kvcache_is_skipped(cpu_decode, monkeypatch):
    monkeypatch.delattr(samattn, "flash_attn_with_kvcache")
    b = run([small_case()])
    assert not b.records and not b.errors
    (skipped,) = b.skipped
    assert skipped["op"] == "decode" and "has no flash_attn_with_kvcache" in skipped["reason"]


def test_a_refusing_sdpa_is_recorded(cpu_decode, monkeypatch):
    def refuses(*args, **kwargs):
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", refuses)
    b = run([small_case()])
    (r,) = b.records
    assert r["baseline"] is None and r["ratio"] is None
    assert "No available kernel" in r["baseline_skipped"]


def test_a_wrong_paged_read_is_flagged(cpu_decode, monkeypatch):
    def ignores_the_block_table(q, k_cache, v_cache, block_table=None, **options):
        if block_table is not None:
            block_table = torch.arange(block_table.numel()).view(block_table.shape)
        return reference_kvcache(q, k_cache, v_cache, block_table=block_table, **options)

    monkeypatch.setattr(samattn, "flash_attn_with_kvcache", ignores_the_block_table)
    torch.manual_seed(0)
    b = run([small_case(paged=16)])
    (r,) = b.records
    assert r["difference_to_reference"] > common.AGREEMENT_LIMIT
    assert "MISMATCH" in report.format_record(r)
    assert "MISMATCH decode" in report.summarize(b)


# ------------------------------------------------------------ readme table ----
def decode_record(batch, seqlen_q, seqlen_k, paged, us, **extra):
    case = cases.decode_case(batch, seqlen_q, seqlen_k, paged)
    kv_bytes = cases.decode_kv_bytes(case)
    gbps = kv_bytes / 1e9 / (us / 1e6)
    return {
        "op": "decode", "family": "sm80", "forced": False, "dtype": "bf16",
        "what": cases.decode_what(case), **case._asdict(), "unit": "GB/s", "samattn": gbps,
        "samattn_us": us, "kv_bytes": kv_bytes, "copy": 3000.0, "copy_fraction": gbps / 3000,
        "baseline": None, "ratio": None, **extra,
    }  # fmt: skip


def test_readme_table_decode(tmp_path, capsys):
    table = load_readme_table()
    data = {
        "records": [
            decode_record(1, 1, 1024, 0, 10.0, baseline_us=12.0, ratio=1.2,
                          samattn_graph_us=6.5, baseline_graph_us=8.0, samattn_host_us=20.0,
                          baseline_host_us=15.0, samattn_host_checked_us=60.0),
            decode_record(1, 1, 1024, 16, 12.5, ratio_to_contiguous=0.8),
            decode_record(1, 1, 1024, 256, 10.0, ratio_to_contiguous=1.0),
            decode_record(64, 4, 32768, 0, 2900.0, baseline_us=2900.0, ratio=1.0),
        ],
        "skipped": [
            {"case": "x", "op": "decode", "family": "auto", "dtype": "bf16",
             **cases.decode_case(64, 4, 131072, 16)._asdict(),
             "reason": "its K/V caches would take more than 60% of the free GPU memory"},
        ],
    }  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    table.main([str(path), "decode"])
    lines = capsys.readouterr().out.replace("\N{EN DASH}", "-").splitlines()
    assert lines[0].startswith("| q len | batch | cache | K+V read | µs | GB/s | of copy |")
    assert "page 16 µs | page 16 / contiguous | page 256 µs" in lines[0]
    assert lines[1] == "| --- " * 14 + "|"
    assert lines[2] == (
        "| 1 | 1 | 1k | 4 MiB | 10.0 | 419 | 0.14 | 12.0 | 1.20 | 12.5 | 0.80 | 10.0 | 1.00 "
        "| sm80 |"
    )
    assert lines[3] == (
        "| 4 | 64 | 32k | 8 GiB | 2900.0 | 2962 | 0.99 | 2900.0 | 1.00 | - | - | - | - | sm80 |"
    )
    assert "| batch 1, q len 1, 1k cache, contiguous | 6.5 | 8.0 | 20.0 | 15.0 | 60.0 | sm80 |" in (
        lines
    )
    assert lines[-1] == (
        "skipped batch 64, q len 4, 128k cache, page 16: its K/V caches would take more than "
        "60% of the free GPU memory"
    )
    table.main([str(path), "gemm"])
    assert capsys.readouterr().out.strip() == ""
