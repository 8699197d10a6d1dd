"""samattn.bench's fp8 decode section (--ops decode_fp8), without a GPU.

As in test_bench_decode.py, the routine runs end to end on small CPU tensors: samattn's
flash_attn_with_kvcache is replaced by a torch reference that dequantizes fp8 caches with
k_scale / v_scale, the timer by one call with fixed times (the fp8 call twice as fast as the
bf16 one on contiguous caches), so what is checked is the bookkeeping: the case grid, the
quantization and its scales, the bytes counted, the records and their ratios, the references
on the dequantized cache, the value-check switch, issue 48's summary, and the cases skipped
for memory, for a family without fp8 caches or for a library without k_scale.
"""

from __future__ import annotations

import json

import pytest
import torch

import samattn
from samattn import bench
from samattn.bench import cases, common, compare, report, routines, runner

fp8_routine = routines.decode_fp8

# The fake timer's times in ms: fp8 0.25 (contiguous) / 0.4 (paged), bf16 0.5, the copy 0.25.
FP8_MS, FP8_PAGED_MS, BF16_MS, COPY_MS = 0.25, 0.4, 0.5, 0.25
SDPA = torch.nn.functional.scaled_dot_product_attention
FP8_DTYPES = {torch.float8_e4m3fn, torch.float8_e5m2}


class FixedTimer:
    """Calls fn once on the first input set and reports the fixed time of that kind of call."""

    def __init__(self) -> None:
        self.timed: list[str] = []

    def input_set_count(self, set_bytes: int) -> int:
        return 2

    def median_ms(self, fn, input_sets) -> float:
        fn(*input_sets[0])
        name = getattr(fn, "__name__", "")
        self.timed.append(name)
        if name == "samattn_decode_fp8":
            return FP8_MS if input_sets[0][4] is None else FP8_PAGED_MS
        if name == "samattn_decode_bf16":
            return BF16_MS
        return COPY_MS


def gather(cache: torch.Tensor, block_table, row: int, length: int) -> torch.Tensor:
    if block_table is None:
        return cache[row, :length]
    return torch.cat([cache[page] for page in block_table[row].tolist()])[:length]


def dequantized(cache: torch.Tensor, scale) -> torch.Tensor:
    if cache.dtype not in FP8_DTYPES:
        assert scale is None
        return cache.float()
    return cache.float() * scale.view(1, 1, -1, 1)


def reference_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, k_scale=None,
                      v_scale=None):  # fmt: skip
    """flash_attn_with_kvcache without append, non-causal, on torch's math; fp8 caches
    dequantized with k_scale / v_scale."""
    k_cache, v_cache = dequantized(k_cache, k_scale), dequantized(v_cache, v_scale)
    out = []
    for row in range(q.shape[0]):
        length = int(cache_seqlens[row])
        k = gather(k_cache, block_table, row, length)
        v = gather(v_cache, block_table, row, length)
        group = q.shape[2] // k.shape[1]
        o = SDPA(
            q[row].float().transpose(0, 1),
            k.transpose(0, 1).repeat_interleave(group, 0),
            v.transpose(0, 1).repeat_interleave(group, 0),
        )
        out.append(o.transpose(0, 1))
    return torch.stack(out).to(q.dtype)


class ValueChecks:
    def __init__(self) -> None:
        self.enabled = True

    def set(self, enabled: bool) -> None:
        self.enabled = enabled

    def get(self) -> bool:
        return self.enabled


class CallLog(list):
    """The kvcache calls: (cache dtype, paged, value checks on, k_scale, v_scale)."""

    checks: ValueChecks


@pytest.fixture
def cpu_fp8(monkeypatch):
    monkeypatch.setattr(common, "DEVICE", "cpu")
    monkeypatch.setattr(runner, "COPY_BYTES", 2**20)
    monkeypatch.setattr(common, "free_memory_bytes", lambda: 2**40)
    checks = ValueChecks()
    monkeypatch.setattr(samattn, "set_value_checks", checks.set, raising=False)
    monkeypatch.setattr(samattn, "value_checks_enabled", checks.get, raising=False)
    log = CallLog()
    log.checks = checks

    def kvcache(q, k_cache, v_cache, **options):
        log.append(
            (
                k_cache.dtype,
                options.get("block_table") is not None,
                checks.enabled,
                options.get("k_scale"),
                options.get("v_scale"),
            )
        )
        return reference_kvcache(q, k_cache, v_cache, **options)

    monkeypatch.setattr(samattn, "flash_attn_with_kvcache", kvcache, raising=False)

    def samattn_ms(self, family, fn, input_sets):
        return self.timer.median_ms(fn, input_sets), "sm80"

    monkeypatch.setattr(runner.Bench, "samattn_ms", samattn_ms)
    return log


def small_case(batch=3, seqlen_k=64, paged=0) -> cases.DecodeCase:
    return cases.DecodeCase(batch, 1, seqlen_k, heads=4, heads_k=2, d=16, paged=paged)


def run(cases_, families=(None,)) -> runner.Bench:
    b = runner.Bench(FixedTimer(), list(families))
    for case in cases_:
        fp8_routine.run(b, case)
    return b


# ---------------------------------------------------------------- cases ----
def test_decode_fp8_grid_follows_the_issue():
    full = cases.DECODE_FP8_CASES["full"]
    assert {dtype for dtype, _, _ in full} == {"bf16"}
    assert {(c.heads, c.heads_k, c.d, c.seqlen_q) for _, _, c in full} == {(32, 8, 128, 1)}
    assert {c.batch for _, _, c in full} == {1, 8, 64}
    assert {c.seqlen_k for _, _, c in full} == {8192, 32768, 131072}
    assert {c.paged for _, _, c in full} == {0, 256}
    e4m3 = [c for _, fp8, c in full if fp8 == "e4m3"]
    e5m2 = [c for _, fp8, c in full if fp8 == "e5m2"]
    assert len(e4m3) == len(set(e4m3)) == 3 * 3 * 2  # every batch x length x layout
    assert 1 <= len(e5m2) <= 2 and set(e5m2) <= set(e4m3)
    assert len(set(full)) == len(full)
    quick = cases.DECODE_FP8_CASES["quick"]
    assert quick and set(quick) <= set(full)
    assert ("bf16", "e4m3", cases.decode_case(1, 1, 8192)) in quick  # the small case
    assert any(
        cases.decode_kv_bytes(c) >= cases.DECODE_FP8_TARGET_BYTES == 256 * 2**20
        for _, _, c in quick
    )
    assert {fp8 for _, fp8, _ in quick} == {"e4m3", "e5m2"}
    assert fp8_routine.cases("full") == full and fp8_routine.cases("quick") == quick
    assert cases.DECODE_FP8_TARGET == 1.8


def test_decode_fp8_is_an_op_and_decode_is_unchanged():
    assert bench.OPS.index("decode_fp8") == bench.OPS.index("decode") + 1
    assert routines.ROUTINES["decode_fp8"] is fp8_routine and fp8_routine.OP == "decode_fp8"
    assert "decode_fp8" in bench.parse_args([]).ops
    assert bench.parse_args(["--ops", "decode_fp8"]).ops == ["decode_fp8"]
    assert bench.parse_args(["--ops", "decode"]).ops == ["decode"]
    assert routines.ROUTINES["decode"].cases("quick") == cases.DECODE_CASES["quick"]
    assert "decode_fp8" in fp8_routine.HEADER and fp8_routine.FREES_MEMORY


def test_fp8_bytes_and_labels():
    case = cases.decode_case(8, 1, 32768, paged=256)
    assert cases.decode_kv_bytes(case, 1) == 2 * 8 * 32768 * 8 * 128 == 2**29
    assert cases.decode_kv_bytes(case) == 2**30
    assert cases.decode_fp8_what("e5m2", case) == "e5m2 b8 sq1 L32k page256"


# --------------------------------------------------------- quantization ----
@pytest.mark.parametrize("fp8, dtype, largest", [
    ("e4m3", torch.float8_e4m3fn, 448.0), ("e5m2", torch.float8_e5m2, 57344.0),
])  # fmt: skip
def test_quantize_uses_per_kv_head_amax_scales(monkeypatch, fp8, dtype, largest):
    torch.manual_seed(0)
    cache = torch.randn(3, 40, 2, 16).to(torch.bfloat16)
    cache[:, :, 1] *= 8  # the heads differ
    cache[1, 3, 0, 5] = -30.0  # head 0's amax, negative
    q8, scales = fp8_routine.quantize(cache, fp8)
    assert q8.dtype == dtype and q8.shape == cache.shape
    assert scales.dtype == torch.float32 and scales.shape == (2,) and scales.is_contiguous()
    amax = cache.float().abs().amax(dim=(0, 1, 3))
    torch.testing.assert_close(scales, amax / largest)
    assert q8.float()[1, 3, 0, 5] == -largest  # the amax maps to the largest value
    assert q8.float().abs().max() <= largest
    restored = q8.float() * scales.view(1, 1, -1, 1)
    precision = 2**-3 if fp8 == "e4m3" else 2**-2  # half an ulp, relative
    assert common.relative_difference(restored, cache.float()) < precision / 2
    # In slices of a few tokens: the same scales and bytes.
    monkeypatch.setattr(fp8_routine, "CHUNK_ELEMENTS", 2 * 16 * 7)
    sliced, sliced_scales = fp8_routine.quantize(cache, fp8)
    assert torch.equal(sliced_scales, scales)
    assert torch.equal(sliced.view(torch.uint8), q8.view(torch.uint8))
    # A head of zeros gets a positive scale (and zeros).
    zeros, zero_scales = fp8_routine.quantize(torch.zeros(2, 4, 2, 16, dtype=torch.bfloat16), fp8)
    assert (zero_scales > 0).all() and not zeros.float().any()


def test_dequantized_sequences_gather_pages(monkeypatch):
    monkeypatch.setattr(common, "DEVICE", "cpu")
    torch.manual_seed(0)
    case = small_case(batch=3, seqlen_k=40, paged=16)
    _, k_cache, v_cache, _, block_table = routines.decode.inputs(case, torch.bfloat16)
    k8, k_scale = fp8_routine.quantize(k_cache, "e4m3")
    v8, v_scale = fp8_routine.quantize(v_cache, "e4m3")
    for row in range(3):
        k, v = fp8_routine.dequantized_sequence_kv(k8, v8, block_table, row, 40, k_scale, v_scale)
        assert k.dtype == v.dtype == torch.float32 and k.shape == (40, 2, 16)
        expected_k = gather(dequantized(k8, k_scale), block_table, row, 40)
        assert torch.equal(k, expected_k)
        assert torch.equal(v, gather(dequantized(v8, v_scale), block_table, row, 40))
    contiguous = fp8_routine.dequantized_sequence_kv(k8, v8, None, 1, 10, k_scale, v_scale)
    assert torch.equal(contiguous[0], dequantized(k8, k_scale)[1, :10])


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
@pytest.mark.parametrize("paged", [0, 256])
def test_the_calls_pass_samattns_own_checks(monkeypatch, fp8, paged):
    """The routine's inputs, on "meta" tensors, through the real flash_attn_with_kvcache's
    checks (and its fake): fp8 caches with (heads_k,) float32 scales, and the bf16 ones."""
    monkeypatch.setattr(common, "DEVICE", "meta")
    case = cases.decode_case(2, 1, 512, paged)
    q, k_cache, v_cache, cache_seqlens, block_table = routines.decode.inputs(case, torch.bfloat16)
    k8, k_scale = fp8_routine.quantize(k_cache, fp8)
    v8, v_scale = fp8_routine.quantize(v_cache, fp8)
    assert k_scale.shape == (case.heads_k,) and k_scale.device.type == "meta"
    kvcache = fp8_routine._kvcache()
    with common.value_checks(False):
        out = kvcache(q, k8, v8, cache_seqlens=cache_seqlens, block_table=block_table,
                      k_scale=k_scale, v_scale=v_scale)  # fmt: skip
        bf16_out = kvcache(
            q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table
        )
    assert out.shape == bf16_out.shape == q.shape and out.dtype == torch.bfloat16


# ---------------------------------------------------------- end to end ----
def test_decode_fp8_records(cpu_fp8, capsys):
    contiguous = ("bf16", "e4m3", small_case())
    paged = ("bf16", "e5m2", small_case(paged=16))
    b = run([contiguous, paged])
    assert not b.errors and not b.skipped
    first, second = b.records
    kv_bytes = 2 * 3 * 64 * 2 * 16
    copy = 2 * 2**20 / 1e9 / (COPY_MS / 1e3)
    for r, (_, fp8, case), ms in ((first, contiguous, FP8_MS), (second, paged, FP8_PAGED_MS)):
        assert r["op"] == "decode_fp8" and r["dtype"] == "bf16" and r["fp8"] == fp8
        assert r["family"] == "sm80" and r["forced"] is False
        assert r["shape"] == [3, 1, 64, 4, 2, 16] and r["paged"] == case.paged
        assert r["what"] == cases.decode_fp8_what(fp8, case)
        assert r["kv_bytes"] == kv_bytes and r["bf16_kv_bytes"] == 2 * kv_bytes
        assert r["ms"] == ms and r["bf16_ms"] == BF16_MS
        assert r["samattn_us"] == pytest.approx(ms * 1e3)
        assert r["baseline_us"] == pytest.approx(BF16_MS * 1e3)
        assert r["ratio_to_bf16"] == pytest.approx(BF16_MS / ms)
        assert r["ratio"] == pytest.approx(r["ratio_to_bf16"])  # samattn / baseline
        assert r["unit"] == "GB/s bf16-equiv"
        assert r["samattn"] == pytest.approx(2 * kv_bytes / 1e9 / (ms / 1e3))
        assert r["baseline"] == pytest.approx(2 * kv_bytes / 1e9 / (BF16_MS / 1e3))
        assert r["copy"] == pytest.approx(copy)
        assert r["copy_fraction"] == pytest.approx(kv_bytes / 1e9 / (ms / 1e3) / copy)
        assert r["bf16_copy_fraction"] == pytest.approx(2 * kv_bytes / 1e9 / (BF16_MS / 1e3) / copy)
        # The same attention on the dequantized (the bf16) cache, rounded to bf16.
        assert r["difference_to_reference"] < 1e-2
        assert r["bf16_difference_to_reference"] < 1e-2
        assert "bf16_family" not in r
    assert first["ratio_to_bf16"] == 2.0 and second["ratio_to_bf16"] == 1.25
    # Per family: one call of each with the value checks on (fp8 first), then the timed ones.
    dtypes = [call[0] for call in cpu_fp8]
    assert dtypes[:4] == [torch.float8_e4m3fn, torch.bfloat16] * 2
    assert dtypes[4:] == [torch.float8_e5m2, torch.bfloat16] * 2
    assert [call[2] for call in cpu_fp8] == [True, True, False, False] * 2
    assert cpu_fp8.checks.enabled is True
    for dtype, _, _, k_scale, v_scale in cpu_fp8:
        if dtype in FP8_DTYPES:  # per-KV-head float32 scales
            for scale in (k_scale, v_scale):
                assert scale.dtype == torch.float32 and scale.shape == (2,)
        else:
            assert k_scale is None and v_scale is None
    assert [call[1] for call in cpu_fp8] == [False] * 4 + [True] * 4
    assert b.timer.timed.count("<lambda>") == 1  # the copy, once per run
    json.dumps(b.records)
    out = capsys.readouterr().out
    assert "device-to-device copy" in out
    text = report.format_record(first)
    assert "e4m3 250.0 us, bf16 500.0 us" in text and "of copy (bf16" in text
    assert "2.00  GB/s bf16-equiv" in text and "MISMATCH" not in text
    summary = report.summarize(b)
    assert "decode_fp8 sm80 2 cases: 1.58x bf16 cache (geomean), 1.25 .. 2.00" in summary
    assert "target 1.80x" not in summary  # no case reads 256 MiB
    assert "decode_fp8  " not in summary.split("decode_fp8 sm80")[0]  # not a torch geomean
    assert "MISMATCH" not in summary and "ERROR" not in summary


def test_an_fp8_read_without_the_scales_is_flagged(cpu_fp8, monkeypatch):
    """The fp8 output is compared with attention on the dequantized cache: a kernel that
    forgets the scales differs from it."""

    def ignores_the_scales(q, k_cache, v_cache, k_scale=None, v_scale=None, **options):
        if k_cache.dtype in FP8_DTYPES:
            k_scale = v_scale = torch.ones(2)
        return reference_kvcache(q, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale, **options)

    monkeypatch.setattr(samattn, "flash_attn_with_kvcache", ignores_the_scales)
    torch.manual_seed(0)
    b = run([("bf16", "e4m3", small_case())])
    (r,) = b.records
    assert r["difference_to_reference"] > common.AGREEMENT_LIMIT
    assert r["bf16_difference_to_reference"] < 1e-2
    assert "MISMATCH" in report.format_record(r)
    assert "MISMATCH decode_fp8" in report.summarize(b)


def test_a_wrong_bf16_read_is_flagged_too(cpu_fp8, monkeypatch):
    def wrong_on_bf16(q, k_cache, v_cache, **options):
        if k_cache.dtype not in FP8_DTYPES:
            v_cache = v_cache.flip(1)
        return reference_kvcache(q, k_cache, v_cache, **options)

    monkeypatch.setattr(samattn, "flash_attn_with_kvcache", wrong_on_bf16)
    torch.manual_seed(0)
    b = run([("bf16", "e4m3", small_case())])
    (r,) = b.records
    assert r["difference_to_reference"] < 1e-2
    assert r["bf16_difference_to_reference"] > common.AGREEMENT_LIMIT
    assert "MISMATCH" in report.format_record(r)


def test_a_case_too_large_for_memory_is_skipped(cpu_fp8, monkeypatch, capsys):
    monkeypatch.setattr(common, "free_memory_bytes", lambda: 20_000)
    b = run([("bf16", "e4m3", small_case())], families=(None, "sm75"))
    assert not b.records and not b.errors and not cpu_fp8
    assert [s["family"] for s in b.skipped] == ["auto", "sm75"]
    skipped = b.skipped[0]
    assert skipped["op"] == "decode_fp8" and skipped["fp8"] == "e4m3" and skipped["paged"] == 0
    assert skipped["kv_bytes"] == 12288 and skipped["bf16_kv_bytes"] == 24576
    assert "60% of the" in skipped["reason"] and "bf16 and fp8 K/V caches" in skipped["reason"]
    assert "skipped decode_fp8 e4m3 b3 sq1 L64 contiguous" in capsys.readouterr().out


def test_a_family_without_fp8_caches_skips_before_timing(cpu_fp8, monkeypatch):
    def no_fp8(q, k_cache, v_cache, **options):
        if k_cache.dtype in FP8_DTYPES:
            raise samattn.UnsupportedError("sm75 runs no fp8 KV caches")
        return reference_kvcache(q, k_cache, v_cache, **options)

    monkeypatch.setattr(samattn, "flash_attn_with_kvcache", no_fp8)
    b = run([("bf16", "e4m3", small_case())])
    assert not b.records and not b.errors and b.timer.timed == ["<lambda>"]  # the copy only
    (skipped,) = b.skipped
    assert skipped["op"] == "decode_fp8" and "no fp8 KV caches" in skipped["reason"]


def test_a_library_without_k_scale_is_skipped(cpu_fp8, monkeypatch):
    def without_fp8(q, k_cache, v_cache, cache_seqlens=None, block_table=None):
        raise AssertionError("not called")

    monkeypatch.setattr(samattn, "flash_attn_with_kvcache", without_fp8)
    b = run([("bf16", "e4m3", small_case())])
    assert not b.records and not b.errors
    (skipped,) = b.skipped
    assert "takes no k_scale" in skipped["reason"]
    monkeypatch.delattr(samattn, "flash_attn_with_kvcache")
    b = run([("bf16", "e4m3", small_case())])
    assert "has no flash_attn_with_kvcache" in b.skipped[0]["reason"]


# ------------------------------------------------------------- summary ----
def fp8_record(fp8, batch, seqlen_k, paged, ratio, family="sm90", **extra):
    case = cases.decode_case(batch, 1, seqlen_k, paged)
    return {
        "op": "decode_fp8", "family": family, "forced": False, "dtype": "bf16", "fp8": fp8,
        "what": cases.decode_fp8_what(fp8, case), **case._asdict(),
        "kv_bytes": cases.decode_kv_bytes(case, 1), "bf16_kv_bytes": cases.decode_kv_bytes(case),
        "ratio_to_bf16": ratio, "difference_to_reference": 4e-3,
        "bf16_difference_to_reference": 3e-3, **extra,
    }  # fmt: skip


def test_summary_counts_the_cases_of_256_mib_or_more():
    records = [
        fp8_record("e4m3", 1, 8192, 0, 1.2),  # 32 MiB of bf16 cache: not counted
        fp8_record("e4m3", 8, 8192, 0, 1.8),  # exactly 256 MiB: counted, meets it
        fp8_record("e4m3", 8, 32768, 256, 1.5),
        fp8_record("e5m2", 8, 32768, 0, 1.95, difference_to_reference=0.03),
        fp8_record("e4m3", 8, 32768, 0, 1.7, family="sm80"),
        {"op": "decode", "family": "sm90", "ratio_to_bf16": 0.5},  # another op
    ]
    lines = report.decode_fp8_summary(records)
    assert lines[0] == (
        "  decode_fp8 sm80 target 1.80x bf16 cache, >= 256 MiB of bf16 cache: 0 of 1 cases "
        "meet it\n    below: e4m3 b8 sq1 L32k contiguous 1.70"
    )
    assert lines[2] == (
        "  decode_fp8 sm90 target 1.80x bf16 cache, >= 256 MiB of bf16 cache: 2 of 3 cases "
        "meet it\n    below: e4m3 b8 sq1 L32k page256 1.50"
    )
    assert lines[3].startswith("  decode_fp8 sm90 4 cases: ")
    assert "1.20 .. 1.95" in lines[3]
    assert lines[3].endswith("difference to reference at most 0.03 (bf16 0.003)")
    assert len(lines) == 4


def test_compare_tells_the_fp8_formats_apart():
    e4m3 = {**fp8_record("e4m3", 8, 32768, 0, 1.9), "shape": [8, 1, 32768, 32, 8, 128]}
    e5m2 = {**e4m3, "fp8": "e5m2"}
    assert compare.record_key(e4m3) != compare.record_key(e5m2)
    matched = compare.compare([e4m3, e5m2], [e5m2, e4m3])
    assert [(p.old["fp8"], p.new["fp8"]) for p in matched.pairs] == [
        ("e5m2", "e5m2"), ("e4m3", "e4m3"),
    ]  # fmt: skip
