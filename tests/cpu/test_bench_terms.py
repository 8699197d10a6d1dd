"""samattn.bench's score terms and masks section (--ops terms) and its README tables,
without a GPU.

The section runs end to end on small CPU tensors: samattn's functions are replaced by a
torch reference and the timer by one call, so what is checked is the bookkeeping: the case
grid, the padding masks, the records and their ratios, the SDPA baseline of the mask cases
(refused on the CPU, or stood in for), and the tables.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from cpu_helpers import OneCallTimer, ascii_lines, load_readme_table

import samattn
from samattn import bench
from samattn.bench import cases, common, report, routines, runner


def reference_flash_attn_func(q, k, v, causal=False, alibi_slopes=None, sinks=None,
                              attn_mask=None, **_):  # fmt: skip
    """flash_attn_func's contract on torch's math, in float32: (batch, seq, heads, d) in and
    out, ALiBi, sinks and an attn_mask (bool or additive, (batch, heads, sq, sk)-broadcast)."""
    qt, kt, vt = (t.transpose(1, 2).float() for t in (q, k, v))
    scores = qt @ kt.transpose(-1, -2) * q.shape[-1] ** -0.5
    sq, sk = scores.shape[-2:]
    i = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    if alibi_slopes is not None:
        scores = scores - alibi_slopes.reshape(-1, 1, 1) * (i - j).abs()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, -math.inf)
    elif attn_mask is not None:
        scores = scores + attn_mask
    if causal:
        scores = scores.masked_fill(j > i, -math.inf)
    if sinks is not None:
        sink = sinks.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink], dim=-1)
    weights = torch.softmax(scores, dim=-1)[..., :sk]
    return (weights @ vt).transpose(1, 2).to(q.dtype)


def reference_sdpa(query, key, value, attn_mask=None, **_):
    out = reference_flash_attn_func(
        *(t.transpose(1, 2) for t in (query, key, value)), attn_mask=attn_mask
    )
    return out.transpose(1, 2)


def plain_sdpa(backend_name, q, k, v, mask):
    """sdpa_with_backend's stand-in: torch's own choice of backend on the CPU."""
    assert backend_name == routines.terms.MASK_BASELINE_BACKEND
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


CASE = cases.AttentionCase(batch=2, heads=2, seqlen=64, d=32, causal=False)


def run_terms_on_cpu(monkeypatch, case=CASE, flash_attn_func=reference_flash_attn_func,
                     sdpa=reference_sdpa, features=cases.TERMS_FEATURES):  # fmt: skip
    monkeypatch.setattr(common, "DEVICE", "cpu")
    monkeypatch.setattr(samattn, "flash_attn_func", flash_attn_func)
    monkeypatch.setattr(samattn, "scaled_dot_product_attention", sdpa)

    def samattn_ms(self, family, fn, input_sets):
        return self.timer.median_ms(fn, input_sets), "sm80"

    monkeypatch.setattr(runner.Bench, "samattn_ms", samattn_ms)
    b = runner.Bench(OneCallTimer(), [None], features)
    routines.terms.run(b, ("bf16", case))
    return b


# ---------------------------------------------------------------- cases ----
def test_terms_grid_follows_the_issue():
    full = cases.TERMS_CASES["full"]
    assert len(full) == 3 * 3 * 2 and len(set(full)) == len(full)
    assert {dtype for dtype, _ in full} == {"bf16"}
    assert {case.d for _, case in full} == {64, 128, 256}
    assert {case.seqlen for _, case in full} == {1024, 4096, 16384}
    assert {case.causal for _, case in full} == {False, True}
    for _, case in full:
        assert case.batch * case.seqlen == 16384 and case.heads * case.d == 2048
    quick = cases.TERMS_CASES["quick"]
    assert quick and set(quick) <= set(full)
    assert "terms" in bench.OPS and bench.parse_args(["--ops", "terms"]).ops == ["terms"]


def test_padding_mask_pads_keys():
    torch.manual_seed(0)
    keep = common.padding_mask(5, 64, "cpu")
    assert keep.shape == (5, 1, 64, 64) and keep.dtype == torch.bool and keep.is_contiguous()
    lengths = keep[:, 0, 0].sum(-1)
    assert torch.all((lengths >= 32) & (lengths <= 64))
    for b in range(5):
        expected = torch.arange(64) < lengths[b]
        assert torch.equal(keep[b, 0], expected.expand(64, 64))  # every query row alike


def test_alibi_slopes_are_geometric():
    slopes = common.alibi_slopes(8, "cpu")
    assert slopes.dtype == torch.float32
    torch.testing.assert_close(slopes, torch.tensor([2.0 ** -(i + 1) for i in range(8)]))


# ------------------------------------------------------------- end to end ----
def test_terms_records_with_the_baseline_refused(monkeypatch):
    # On the CPU, SDPA has no EFFICIENT_ATTENTION kernel: the mask records keep samattn's
    # numbers and say why there is no baseline.
    b = run_terms_on_cpu(monkeypatch)
    assert not b.errors and not b.skipped
    terms = [r for r in b.records if r["op"] == "attention_terms"]
    masks = [r for r in b.records if r["op"] == "attention_mask"]
    assert [(r["feature"], r["direction"]) for r in terms] == [
        (feature, direction)
        for feature in cases.TERMS_FEATURES
        for direction in ("fwd", "bwd")
    ]  # fmt: skip
    for r in terms:
        assert (r["batch"], r["heads"], r["seqlen"], r["d"], r["causal"]) == tuple(CASE)
        assert r["family"] == "sm80" and r["forced"] is False and r["dtype"] == "bf16"
        tflop = routines.attention.attention_tflop(CASE, r["direction"])
        assert r["samattn"] == pytest.approx(tflop / 1e-3) and r["samattn_ms"] == 1.0
        assert r["baseline_ms"] == 1.0 and r["ratio"] == pytest.approx(1.0)  # plain / feature
        # The padding masks keep half of the keys or more; the other features have none.
        if r["feature"] in cases.MASK_FEATURES:
            assert 0.5 <= r["mask_keeps"] <= 1.0
        else:
            assert "mask_keeps" not in r
    assert [(r["feature"], r["direction"]) for r in masks] == [
        ("bool_mask", "fwd"), ("bool_mask", "bwd"), ("float_mask", "fwd"), ("float_mask", "bwd"),
    ]  # fmt: skip
    for r in masks:
        assert r["baseline"] is None and r["ratio"] is None and r["baseline_skipped"]
        assert r["samattn_call"] == "sdpa(attn_mask=...)"
        assert r["mask_shape"] == [2, 1, 64, 64]
    assert [r["mask_dtype"] for r in masks] == ["bool", "bool", "float32", "float32"]
    json.dumps(b.records)  # the records go to the JSON file as they are
    summary = report.summarize(b)
    assert "attention_terms sm80 alibi fwd: 1.00 .. 1.00, target 0.90 met by 1 of 1" in summary
    assert "ERROR" not in summary


def test_terms_features_narrow_the_section(monkeypatch):
    args = bench.parse_args(["--ops", "terms", "--terms-features", "sinks,alibi"])
    assert args.terms_features == ["sinks", "alibi"]
    assert bench.parse_args([]).terms_features == list(cases.TERMS_FEATURES)
    with pytest.raises(SystemExit):
        bench.parse_args(["--terms-features", "alibi,dropout"])
    b = run_terms_on_cpu(monkeypatch, features=args.terms_features)
    assert [(r["op"], r["feature"], r["direction"]) for r in b.records] == [
        ("attention_terms", feature, direction)
        for feature in ("sinks", "alibi")
        for direction in ("fwd", "bwd")
    ]  # fmt: skip


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mask_records_against_sdpa(monkeypatch, causal):
    monkeypatch.setattr(common, "sdpa_with_backend", plain_sdpa)
    case = CASE._replace(causal=causal)
    b = run_terms_on_cpu(monkeypatch, case)
    assert not b.errors
    masks = [r for r in b.records if r["op"] == "attention_mask"]
    assert len(masks) == 4
    for r in masks:
        assert r["ratio"] == pytest.approx(1.0) and "baseline_skipped" not in r
        # The same attention (the causal mask folded into SDPA's), rounded to bf16.
        assert r["difference_to_baseline"] < common.AGREEMENT_LIMIT, r
        expected = "flash_attn_func(causal=True, attn_mask=...)" if causal else "sdpa("
        assert r["samattn_call"].startswith(expected)
    assert "MISMATCH" not in report.summarize(b)


def test_a_wrong_mask_is_flagged(monkeypatch):
    monkeypatch.setattr(common, "sdpa_with_backend", plain_sdpa)

    def ignores_the_mask(query, key, value, attn_mask=None, **_):
        return reference_sdpa(query, key, value)

    torch.manual_seed(0)
    b = run_terms_on_cpu(monkeypatch, sdpa=ignores_the_mask)
    masks = [r for r in b.records if r["op"] == "attention_mask"]
    assert any(r["difference_to_baseline"] > common.AGREEMENT_LIMIT for r in masks)


def test_unsupported_features_are_skipped(monkeypatch):
    def no_sinks(q, k, v, sinks=None, **options):
        if sinks is not None:
            raise samattn.UnsupportedError("no sinks in this build")
        return reference_flash_attn_func(q, k, v, **options)

    b = run_terms_on_cpu(monkeypatch, flash_attn_func=no_sinks)
    assert not b.errors
    skipped = [(s["feature"], s["direction"]) for s in b.skipped]
    assert skipped == [("sinks", "fwd"), ("sinks", "bwd")]
    assert all(s["op"] == "attention_terms" for s in b.skipped)


# ------------------------------------------------------------ readme table ----
def terms_record(op, feature, direction, d, seqlen, causal, ratio, tflops=100.0):
    case = cases.attention_case(seqlen, d, causal)
    return {
        "op": op, "family": "sm80", "forced": False, "dtype": "bf16", "shape": list(case[:4]),
        **case._asdict(), "feature": feature, "direction": direction, "unit": "TFLOPS",
        "samattn": tflops, "baseline": tflops * ratio if ratio else None, "ratio": ratio,
    }  # fmt: skip


def test_readme_tables(tmp_path, capsys):
    table = load_readme_table()
    records = [
        terms_record("attention_terms", "alibi", "fwd", 128, 4096, False, 0.95),
        terms_record("attention_terms", "alibi", "bwd", 128, 4096, False, 0.91),
        terms_record("attention_terms", "bool_mask", "fwd", 128, 4096, False, 0.80),
        terms_record("attention_terms", "alibi", "fwd", 64, 1024, True, 0.99),
        terms_record("attention_mask", "bool_mask", "fwd", 128, 4096, False, 1.6, 250.0),
        terms_record("attention_mask", "bool_mask", "bwd", 128, 4096, False, None, 180.0),
    ]
    skipped = [{"case": "x", "op": "attention_terms", "family": "auto", "feature": "sinks",
                "reason": "samattn: no sinks in this build"}]  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"records": records, "skipped": skipped}))
    table.main([str(path), "attention_terms"])
    lines = ascii_lines(capsys.readouterr().out)
    assert lines[0] == (
        "| head dim | seqlen | batch x heads | causal | ALiBi fwd | ALiBi bwd | bool mask fwd "
        "| bool mask bwd | family |"
    )
    assert lines[2] == "| 64 | 1024 | 16 x 32 | yes | 0.99 | - | - | - | sm80 |"
    assert lines[3] == "| 128 | 4096 | 4 x 16 | no | 0.95 | 0.91 | 0.80 | - | sm80 |"
    assert "skipped: samattn: no sinks in this build" in lines
    table.main([str(path), "attention_mask"])
    lines = ascii_lines(capsys.readouterr().out)
    assert lines[2] == "| 128 | 4096 | 4 x 16 | no | 250 | 1.60 | 180 | - | sm80 |"
    # The whole file: attention's own table is not confused by them.
    table.main([str(path)])
    out = capsys.readouterr().out
    assert "| head dim | seqlen |" in out and "fwd TFLOPS | fwd / flash" not in out
