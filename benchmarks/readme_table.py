"""Print the README's benchmark tables (markdown) from a results JSON of samattn.bench:

    python benchmarks/readme_table.py benchmarks/results/h100.json [OP_PREFIX] [--family NAME]

GEMM and softmax: one row per case, in the file's order. Attention: one row per
head dim x seqlen x causal x dtype, with the forward and backward side by side.
Eager overhead (ops overhead_*): one row per call, host microseconds per call.
Decode (op decode): one row per seqlen_q x batch x cache length, the contiguous cache
and each page size side by side, then the small case's latencies (CUDA graph, host).
Score terms and masks (ops attention_terms, attention_mask): one row per head dim x seqlen
x causal, each feature's cost (plain time / time with it) forward and backward side by
side; then the masked calls' TFLOPS and ratio to SDPA with the same mask.
Rows show the automatically chosen family; --family sm75 (or sm80, ...) shows the
runs with that family forced instead. OP_PREFIX (e.g. softmax, attention) keeps only
the ops whose name starts with it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

TIMES = "\N{MULTIPLICATION SIGN}"
DASH = "\N{EN DASH}"  # a cell with no number
DTYPE_NAMES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "tf32": "float32 (tf32)"}
OP_NAMES = {"gemm": "gemm", "softmax_forward": "softmax fwd", "softmax_backward": "softmax bwd"}
ATTENTION_OPS = {"attention_forward": "fwd", "attention_backward": "bwd"}
TERMS_OPS = ("attention_terms", "attention_mask")
FEATURE_NAMES = {
    "alibi": "ALiBi", "sinks": "sinks", "bool_mask": "bool mask", "float_mask": "float mask",
}  # fmt: skip


def shape_text(op: str, shape: list[int]) -> str:
    if op == "gemm":
        batch, m, n, k = shape
        cube = f" {TIMES} ".join(map(str, (m, n, k)))
        return f"{batch} {TIMES} ({cube}) batched" if batch > 1 else cube
    return f" {TIMES} ".join(map(str, shape))


def note(record: dict) -> str:
    parts = [record["family"]]
    if record.get("config"):
        parts.append(record["config"].split()[0].removeprefix("tile="))
    if record["op"] == "gemm" and record["dtype"] == "f32":
        parts.append('exact fp32, vs "highest"')
    if "ratio_to_copy" in record:
        parts.append(f"{record['ratio_to_copy']:.2f} of copy ({record['copy']:.0f} GB/s)")
    return ", ".join(parts)


def selected(record: dict, family: str | None) -> bool:
    """The automatic family's records, or those with `family` forced."""
    if family is None:
        return not record["forced"]
    return record["forced"] and record["family"] == family


def op_table(records: list[dict]) -> list[str]:
    lines = [
        "| op | shape | dtype | samattn | torch | ratio | family, note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in records:
        unit = r["unit"]
        lines.append(
            f"| {OP_NAMES.get(r['op'], r['op'])} | {shape_text(r['op'], r['shape'])} "
            f"| {DTYPE_NAMES[r['dtype']]} | {r['samattn']:.0f} {unit} | {r['baseline']:.0f} "
            f"| {r['ratio']:.2f} | {note(r)} |"
        )
    return lines


def _ratio(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}"


def attention_table(records: list[dict], skipped: Sequence[dict] = ()) -> list[str]:
    """Rows head dim x seqlen x causal (per dtype): samattn's forward and backward TFLOPS and
    their ratios to SDPA's flash (FlashAttention-2) and cuDNN backends; a dash where a
    direction was skipped or a baseline refused the case."""
    rows: dict[tuple, dict[str, dict]] = {}
    for r in records:
        key = (r["dtype"], r["d"], r["seqlen"], r["causal"])
        rows.setdefault(key, {})[ATTENTION_OPS[r["op"]]] = r
    lines = [
        f"| dtype | head dim | seqlen | batch {TIMES} heads | causal | fwd TFLOPS | fwd / flash "
        "| fwd / cudnn | bwd TFLOPS | bwd / flash | bwd / cudnn | family |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    order = {"bf16": 0, "f16": 1}
    for key in sorted(rows, key=lambda k: (order.get(k[0], 2), k[1], k[2], k[3])):
        dtype, d, seqlen, causal = key
        by_direction = rows[key]
        any_record = next(iter(by_direction.values()))
        cells = []
        for direction in ("fwd", "bwd"):
            r = by_direction.get(direction)
            if r is None:
                cells += [DASH] * 3
            else:
                cells += [f"{r['samattn']:.0f}", _ratio(r["ratio"]), _ratio(r["ratio_to_cudnn"])]
        families = sorted({r["family"] for r in by_direction.values()})
        lines.append(
            f"| {DTYPE_NAMES[dtype]} | {d} | {seqlen} | {any_record['batch']} {TIMES} "
            f"{any_record['heads']} | {'yes' if causal else 'no'} | {' | '.join(cells)} "
            f"| {', '.join(families)} |"
        )
    reasons = sorted({s["reason"].splitlines()[0] for s in skipped})
    lines += [f"\nskipped: {reason}" for reason in reasons]
    return lines


def _case_rows(records: list[dict]) -> dict[tuple, dict[tuple, dict]]:
    """{(d, seqlen, causal): {(feature, direction): record}}, in the README's order."""
    rows: dict[tuple, dict[tuple, dict]] = {}
    for r in records:
        rows.setdefault((r["d"], r["seqlen"], r["causal"]), {})[(r["feature"], r["direction"])] = r
    return {key: rows[key] for key in sorted(rows)}


def _case_cells(key: tuple, by_feature: dict[tuple, dict]) -> str:
    d, seqlen, causal = key
    any_record = next(iter(by_feature.values()))
    return (
        f"| {d} | {seqlen} | {any_record['batch']} {TIMES} {any_record['heads']} "
        f"| {'yes' if causal else 'no'} |"
    )


def terms_table(records: list[dict], skipped: Sequence[dict] = ()) -> list[str]:
    """The score terms' and masks' cost: per head dim x seqlen x causal, plain time / time
    with each feature (0.90: it costs 10%), forward and backward; a dash where a case was
    skipped (the reasons below the table)."""
    features = [f for f in FEATURE_NAMES if any(r["feature"] == f for r in records)]
    headers = "".join(f" {FEATURE_NAMES[f]} fwd | {FEATURE_NAMES[f]} bwd |" for f in features)
    lines = [
        f"| head dim | seqlen | batch {TIMES} heads | causal |{headers} family |",
        "| --- " * (5 + 2 * len(features)) + "|",
    ]
    for key, by_feature in _case_rows(records).items():
        cells = [
            _ratio(by_feature[(f, direction)]["ratio"]) if (f, direction) in by_feature else DASH
            for f in features
            for direction in ("fwd", "bwd")
        ]
        families = sorted({r["family"] for r in by_feature.values()})
        lines.append(
            f"{_case_cells(key, by_feature)} {' | '.join(cells)} | {', '.join(families)} |"
        )
    reasons = sorted({s["reason"].splitlines()[0] for s in skipped})
    return lines + [f"\nskipped: {reason}" for reason in reasons]


def mask_table(records: list[dict]) -> list[str]:
    """The masked calls against SDPA with the same mask: per head dim x seqlen x causal and
    mask kind, samattn's TFLOPS and SDPA's time / samattn's, forward and backward."""
    features = [f for f in FEATURE_NAMES if any(r["feature"] == f for r in records)]
    headers = "".join(
        f" {FEATURE_NAMES[f]} {direction} TFLOPS | {FEATURE_NAMES[f]} {direction} / SDPA |"
        for f in features
        for direction in ("fwd", "bwd")
    )
    lines = [
        f"| head dim | seqlen | batch {TIMES} heads | causal |{headers} family |",
        "| --- " * (5 + 4 * len(features)) + "|",
    ]
    for key, by_feature in _case_rows(records).items():
        cells = []
        for f in features:
            for direction in ("fwd", "bwd"):
                r = by_feature.get((f, direction))
                cells += [DASH] * 2 if r is None else [f"{r['samattn']:.0f}", _ratio(r["ratio"])]
        families = sorted({r["family"] for r in by_feature.values()})
        lines.append(
            f"{_case_cells(key, by_feature)} {' | '.join(cells)} | {', '.join(families)} |"
        )
    return lines


def _us(value: float | None) -> str:
    return DASH if value is None else f"{value:.1f}"


def bytes_text(n: int) -> str:
    """4194304 -> "4 MiB", 34359738368 -> "32 GiB"."""
    if n >= 2**30:
        return f"{n / 2**30:.4g} GiB"
    return f"{n / 2**20:.4g} MiB"


def length_text(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def decode_table(records: list[dict], skipped: Sequence[dict] = ()) -> list[str]:
    """Rows seqlen_q x batch x cache length: the contiguous cache's GPU time, K/V bandwidth,
    its share of the copy bandwidth and its ratio to SDPA (SDPA's time / samattn's), then per
    page size the paged time and its ratio to contiguous (contiguous time / paged time); a
    dash where a case was skipped. Then the small case's latencies."""
    rows: dict[tuple, dict[int, dict]] = {}
    for r in records:
        rows.setdefault((r["seqlen_q"], r["batch"], r["seqlen_k"]), {})[r["paged"]] = r
    pages = sorted({r["paged"] for r in records if r["paged"]})
    page_headers = "".join(f" page {p} µs | page {p} / contiguous |" for p in pages)
    lines = [
        "| q len | batch | cache | K+V read | µs | GB/s | of copy | SDPA µs | / SDPA |"
        f"{page_headers} family |",
        "| --- " * (9 + 2 * len(pages) + 1) + "|",
    ]
    for key in sorted(rows):
        seqlen_q, batch, seqlen_k = key
        by_page = rows[key]
        any_record = next(iter(by_page.values()))
        r = by_page.get(0)
        if r is None:
            cells = [DASH] * 5
        else:
            cells = [
                _us(r["samattn_us"]), f"{r['samattn']:.0f}", f"{r['copy_fraction']:.2f}",
                _us(r.get("baseline_us")), _ratio(r.get("ratio")),
            ]  # fmt: skip
        for page in pages:
            paged = by_page.get(page)
            if paged is None:
                cells += [DASH] * 2
            else:
                cells += [_us(paged["samattn_us"]), _ratio(paged.get("ratio_to_contiguous"))]
        families = sorted({r["family"] for r in by_page.values()})
        lines.append(
            f"| {seqlen_q} | {batch} | {length_text(seqlen_k)} "
            f"| {bytes_text(any_record['kv_bytes'])} | {' | '.join(cells)} "
            f"| {', '.join(families)} |"
        )
    small = [r for r in records if "samattn_graph_us" in r]
    if small:
        lines += [
            "",
            "| case | graph µs samattn | graph µs SDPA | host µs samattn | host µs SDPA "
            "| host µs samattn, value checks on | family |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in small:
            cells = [
                _us(r.get(key))
                for key in (
                    "samattn_graph_us", "baseline_graph_us", "samattn_host_us",
                    "baseline_host_us", "samattn_host_checked_us",
                )
            ]  # fmt: skip
            lines.append(f"| {decode_text(r)} | {' | '.join(cells)} | {r['family']} |")
    for s in skipped:
        lines.append(f"\nskipped {decode_text(s)}: {s['reason'].splitlines()[0]}")
    return lines


def decode_text(r: dict) -> str:
    """ "batch 1, q len 1, 1k cache, page 16" (or contiguous)."""
    layout = f"page {r['paged']}" if r["paged"] else "contiguous"
    return (
        f"batch {r['batch']}, q len {r['seqlen_q']}, {length_text(r['seqlen_k'])} cache, {layout}"
    )


def overhead_table(records: list[dict]) -> list[str]:
    """Host time per eager call against torch's op, and the GPU time per call queued back to
    back and in a CUDA graph."""
    lines = [
        "| call | host µs samattn | host µs torch | torch / samattn | queued GPU µs samattn "
        "| queued GPU µs torch | graph GPU µs samattn | graph GPU µs torch | family |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in records:
        cells = [
            _us(r.get(f"{who}_{how}_us"))
            for how in ("queued", "graph")
            for who in ("samattn", "baseline")
        ]
        lines.append(
            f"| {r['what']} | {r['samattn']:.1f} | {r['baseline']:.1f} | {r['ratio']:.2f} "
            f"| {' | '.join(cells)} | {r['family']} |"
        )
    return lines


def _skipped(data: dict, op: str, prefix: str, family: str | None) -> list[dict]:
    """The skipped cases of `op` (when it starts with `prefix`) with `family` forced, or
    the automatic family's."""
    if not op.startswith(prefix):
        return []
    return [
        s
        for s in data.get("skipped", [])
        if s.get("op") == op and s.get("family") == (family or "auto")
    ]


def tables(data: dict, prefix: str = "", family: str | None = None) -> list[str]:
    """The markdown lines for every op of `data` whose name starts with `prefix`."""
    records = [r for r in data["records"] if r["op"].startswith(prefix) and selected(r, family)]
    overhead = [r for r in records if r["op"].startswith("overhead_")]
    decode = [r for r in records if r["op"] == "decode"]
    terms = [r for r in records if r["op"] == "attention_terms"]
    masks = [r for r in records if r["op"] == "attention_mask"]
    others = [
        r
        for r in records
        if r["op"] not in ATTENTION_OPS and r["op"] not in TERMS_OPS and r not in overhead + decode
    ]
    attention = [r for r in records if r["op"] in ATTENTION_OPS]
    skipped = [
        s
        for s in data.get("skipped", [])
        if s.get("op") in ATTENTION_OPS
        and s["op"].startswith(prefix)
        and s.get("family") == (family or "auto")
    ]
    lines = op_table(others) if others else []
    if attention or skipped:
        lines += [""] if lines else []
        lines += attention_table(attention, skipped)
    terms_skipped = _skipped(data, "attention_terms", prefix, family)
    if terms or terms_skipped:
        lines += [""] if lines else []
        lines += terms_table(terms, terms_skipped)
    if masks:
        lines += [""] if lines else []
        lines += mask_table(masks)
    decode_skipped = _skipped(data, "decode", prefix, family)
    if decode or decode_skipped:
        lines += [""] if lines else []
        lines += decode_table(decode, decode_skipped)
    if overhead:
        lines += [""] if lines else []
        lines += overhead_table(overhead)
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="a results file of python -m samattn.bench")
    parser.add_argument("prefix", nargs="?", default="", help="only ops starting with this")
    parser.add_argument("--family", default=None, help="the records with this family forced")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        data = json.load(f)
    print("\n".join(tables(data, args.prefix, args.family)))


if __name__ == "__main__":
    main()
