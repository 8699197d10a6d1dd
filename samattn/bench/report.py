"""What samattn.bench prints and writes: one line per record, the summary, the run's
environment, the plot."""

from __future__ import annotations

import datetime
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import samattn

from .. import _lib
from .cases import DECODE_FP8_TARGET, DECODE_FP8_TARGET_BYTES
from .common import AGREEMENT_LIMIT, shape_text

if TYPE_CHECKING:
    from .runner import Bench

TABLE_HEADER = (
    f"{'op':<17} {'family':<6} {'dtype':<5} {'shape':<22} "
    f"{'samattn':>9} {'torch':>9} {'ratio':>6}  unit   "
    "(* automatic family; gemm shape: batch x M x N x K)"
)

# The targets for the sm80 family's attention: samattn / SDPA flash backend.
ATTENTION_TARGETS = {"attention_forward": 1.0, "attention_backward": 0.9}

# Issue 16's targets: a feature costs at most 10% (ratio plain / feature >= 0.9); with a
# mask, at least 1.5x SDPA with the same mask.
TERMS_TARGETS = {"attention_terms": 0.9, "attention_mask": 1.5}

# Issue 15's decode targets: (field, target, which records, what they are).
DECODE_TARGETS = (
    ("copy_fraction", 0.8, lambda r: r["kv_bytes"] >= 256 * 2**20, "of copy, >= 256 MiB read"),
    ("ratio", 1.0, lambda r: not r["paged"], "x sdpa, contiguous"),
    ("ratio_to_contiguous", 0.95, lambda r: r["paged"], "of contiguous, paged"),
)


def _family_text(r: dict[str, Any]) -> str:
    return r["family"] + ("" if r["forced"] else "*")


def _number(value: float | None, width: int, digits: int) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def case_text(r: dict[str, Any]) -> str:
    """A record's case in a few words: its `what`, else its shape (causal, versus)."""
    if "what" in r:
        return r["what"]
    text = shape_text(r["shape"]) + (" causal" if r.get("causal") else "")
    return text + (f" vs {r['versus']}" if "versus" in r else "")


# A record's differences to torch or to a reference (decode_fp8: of both of its calls).
DIFFERENCES = (
    "difference_to_baseline",
    "difference_to_reference",
    "bf16_difference_to_reference",
)


def _mismatch(r: dict[str, Any]) -> bool:
    return any(r.get(key) is not None and r[key] > AGREEMENT_LIMIT for key in DIFFERENCES)


def _difference(r: dict[str, Any]) -> float:
    return max(r[key] for key in DIFFERENCES if r.get(key) is not None)


def _decode_text(r: dict[str, Any]) -> str:
    """A decode record's extras: GPU time, share of the copy bandwidth, the paged / contiguous
    ratio and the small case's latencies."""
    text = f"  {r['samattn_us']:.1f} us, {r['copy_fraction']:.2f} of copy"
    if r.get("baseline_us"):
        text += f", sdpa {r['baseline_us']:.1f} us ({r.get('baseline_backend') or '?'})"
    if r.get("ratio_to_contiguous") is not None:
        text += f", {r['ratio_to_contiguous']:.2f} of contiguous"
    latencies = [
        f"{name} {r[key]:.1f}"
        for name, key in (
            ("graph", "samattn_graph_us"),
            ("sdpa graph", "baseline_graph_us"),
            ("host", "samattn_host_us"),
            ("sdpa host", "baseline_host_us"),
            ("host checked", "samattn_host_checked_us"),
        )
        if r.get(key) is not None
    ]
    if latencies:
        text += f"; us per call: {', '.join(latencies)}"
    return text


def _decode_fp8_text(r: dict[str, Any]) -> str:
    """A decode_fp8 record's extras: both GPU times, both shares of the copy bandwidth and
    both differences to their fp32 references."""
    text = (
        f"  {r['fp8']} {r['samattn_us']:.1f} us, bf16 {r['baseline_us']:.1f} us; "
        f"{r['copy_fraction']:.2f} of copy (bf16 {r['bf16_copy_fraction']:.2f})"
    )
    if r.get("bf16_family"):
        text += f"; bf16 ran {r['bf16_family']}"
    return (
        text + f"; difference {r['difference_to_reference']:.2g} "
        f"(bf16 {r['bf16_difference_to_reference']:.2g})"
    )


def format_record(r: dict[str, Any]) -> str:
    """One line of the table that a run prints (TABLE_HEADER)."""
    line = (
        f"{r['op']:<17} {_family_text(r):<6} {r['dtype']:<5} {case_text(r):<22} "
        f"{r['samattn']:>9.1f} {_number(r['baseline'], 9, 1)} {_number(r['ratio'], 6, 2)}  "
        f"{r['unit']}"
    )
    if "split_k" in r:
        line += f"  split_k={r['split_k']} {r['split_k_mode']}"
    if "ratio_to_copy" in r:
        line += f"  ({r['ratio_to_copy']:.2f} of copy at {r['copy']:.0f} GB/s)"
    if r["op"] == "decode":
        line += _decode_text(r)
    if r["op"] == "decode_fp8":
        line += _decode_fp8_text(r)
    if "cudnn" in r:
        line += f"  cudnn {_number(r['cudnn'], 0, 1)} ratio {_number(r['ratio_to_cudnn'], 0, 2)}"
    for key in ("baseline_skipped", "cudnn_skipped"):
        if key in r:
            line += f"  ({key.split('_')[0]} refused: {r[key].splitlines()[0][:80]})"
    if _mismatch(r):
        line += f"  MISMATCH: differs from torch by {_difference(r):.2g}"
    return line


def decode_summary(records: list[dict[str, Any]]) -> list[str]:
    """Per family, how many decode cases meet each of issue 15's targets, and which not."""
    lines = []
    for family in sorted({r["family"] for r in records if r["op"] == "decode"}):
        rows = [r for r in records if r["op"] == "decode" and r["family"] == family]
        for key, target, applies, what in DECODE_TARGETS:
            measured = [r for r in rows if applies(r) and r.get(key) is not None]
            below = [r for r in measured if r[key] < target]
            if not measured:
                continue
            lines.append(
                f"  decode {family} target {target:.2f} {what}: "
                f"{len(measured) - len(below)} of {len(measured)} cases meet it"
                + "".join(f"\n    below: {case_text(r)} {r[key]:.2f}" for r in below)
            )
    return lines


def decode_fp8_summary(records: list[dict[str, Any]]) -> list[str]:
    """Per family: how many decode_fp8 cases reading >= 256 MiB of bf16 cache are at least
    1.8x as fast as the bf16 cache (issue 48), which are not, and the range of the ratios
    and of the differences to the fp32 references over all its cases."""
    lines = []
    fp8_records = [r for r in records if r["op"] == "decode_fp8" and r["ratio_to_bf16"]]
    for family in sorted({r["family"] for r in fp8_records}):
        rows = [r for r in fp8_records if r["family"] == family]
        large = [r for r in rows if r["bf16_kv_bytes"] >= DECODE_FP8_TARGET_BYTES]
        below = [r for r in large if r["ratio_to_bf16"] < DECODE_FP8_TARGET]
        if large:
            lines.append(
                f"  decode_fp8 {family} target {DECODE_FP8_TARGET:.2f}x bf16 cache, "
                f">= {DECODE_FP8_TARGET_BYTES / 2**20:.0f} MiB of bf16 cache: "
                f"{len(large) - len(below)} of {len(large)} cases meet it"
                + "".join(f"\n    below: {case_text(r)} {r['ratio_to_bf16']:.2f}" for r in below)
            )
        ratios = [r["ratio_to_bf16"] for r in rows]
        geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines.append(
            f"  decode_fp8 {family} {len(rows)} cases: {geomean:.2f}x bf16 cache (geomean), "
            f"{min(ratios):.2f} .. {max(ratios):.2f}; difference to reference at most "
            f"{max(r['difference_to_reference'] for r in rows):.2g} "
            f"(bf16 {max(r['bf16_difference_to_reference'] for r in rows):.2g})"
        )
    return lines


def terms_summary(records: list[dict[str, Any]]) -> list[str]:
    """Per op (attention_terms, attention_mask), family, feature and direction: the range
    of the ratios and how many cases meet issue 16's target, and which not."""
    lines = []
    rows: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        if r["op"] in TERMS_TARGETS and r["ratio"] is not None:
            key = (r["op"], r["family"], r["feature"], r["direction"])
            rows.setdefault(key, []).append(r)
    for (op, family, feature, direction), group in sorted(rows.items()):
        target = TERMS_TARGETS[op]
        ratios = [r["ratio"] for r in group]
        below = [r for r in group if r["ratio"] < target]
        lines.append(
            f"  {op} {family} {feature} {direction}: {min(ratios):.2f} .. {max(ratios):.2f}, "
            f"target {target:.2f} met by {len(group) - len(below)} of {len(group)}"
            + "".join(f"\n    below: {case_text(r)} {r['ratio']:.2f}" for r in below)
        )
    return lines


def _geomean_lines(groups: dict[tuple[str, str, str], list[float]]) -> list[str]:
    lines = []
    for (op, dtype, family), ratios in sorted(groups.items()):
        geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines.append(
            f"  {op:<17} {dtype:<5} {family:<6} geomean {geomean:5.2f}  "
            f"min {min(ratios):5.2f}  max {max(ratios):5.2f}  ({len(ratios)} shapes)"
        )
    return lines


def summarize(bench: Bench) -> str:
    """Geometric mean, min and max of the ratios per op x dtype x family, the targets met,
    mismatches, skipped cases and errors."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in bench.records:
        # terms_summary's and decode_fp8_summary's (samattn against itself) apart
        if r["ratio"] is not None and r["op"] not in (*TERMS_TARGETS, "decode_fp8"):
            op = r["op"] + (f" vs {r['versus']}" if "versus" in r else "")
            groups.setdefault((op, r["dtype"], r["family"]), []).append(r["ratio"])
    lines = ["", "summary: samattn / torch (above 1: samattn is faster)"]
    lines += _geomean_lines(groups)
    copies = [r["ratio_to_copy"] for r in bench.records if "ratio_to_copy" in r]
    if copies:
        lines.append(f"  softmax forward vs copy bandwidth: {min(copies):.2f} .. {max(copies):.2f}")
    cudnn: dict[tuple[str, str, str], list[float]] = {}
    for r in bench.records:
        if r.get("ratio_to_cudnn") is not None:
            cudnn.setdefault((r["op"], r["dtype"], r["family"]), []).append(r["ratio_to_cudnn"])
    if cudnn:
        lines.append("summary: samattn / sdpa CUDNN_ATTENTION")
    lines += _geomean_lines(cudnn)
    for op, target in ATTENTION_TARGETS.items():
        rows = [r for r in bench.records if r["op"] == op and r["family"] == "sm80"]
        below = [r for r in rows if r["ratio"] is not None and r["ratio"] < target]
        if rows:
            lines.append(
                f"  {op} sm80 target {target:.1f}x flash: {len(rows) - len(below)} of "
                f"{len(rows)} cases meet it"
                + "".join(
                    f"\n    below: {r['dtype']} {case_text(r)} {r['ratio']:.2f}" for r in below
                )
            )
    lines += decode_summary(bench.records)
    lines += decode_fp8_summary(bench.records)
    lines += terms_summary(bench.records)
    for r in bench.records:
        if _mismatch(r):
            lines.append(f"  MISMATCH {r['op']} {r['dtype']} {case_text(r)} {r['family']}")
    lines += [f"  skipped {s['case']}: {s['reason'].splitlines()[0]}" for s in bench.skipped]
    lines += [f"  ERROR {e}" for e in bench.errors]
    return "\n".join(lines)


def gpu_slug(name: str) -> str:
    """ "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def environment(command: str) -> dict[str, Any]:
    """The run's GPU, versions, command line and date: the head of the JSON file."""
    device = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(device)
    runtime, driver = _lib.cuda_versions()
    return {
        "gpu": torch.cuda.get_device_name(device),
        "cc": f"{major}.{minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "samattn": samattn.__version__,
        "samattn_cuda_runtime": f"{runtime // 1000}.{runtime % 1000 // 10}",
        "driver_cuda": f"{driver // 1000}.{driver % 1000 // 10}",
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_plot(records: list[dict[str, Any]], gpu: str, path: Path) -> None:
    """A horizontal bar per record: samattn / torch, with the line at 1."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"note: matplotlib is not installed; no plot written to {path}")
        return
    records = [r for r in records if r["ratio"] is not None]
    labels = [f"{r['op']} {r['dtype']} {case_text(r)} [{r['family']}]" for r in records]
    colors = {
        "gemm": "tab:blue",
        "softmax_forward": "tab:green",
        "softmax_backward": "tab:olive",
        "attention_forward": "tab:red",
        "attention_backward": "tab:purple",
        "decode": "tab:cyan",
        "decode_fp8": "darkcyan",
        "attention_terms": "tab:orange",
        "attention_mask": "tab:brown",
        "attention_dropout": "tab:pink",
    }
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.25 * len(records)))
    ax.barh(
        range(len(records)),
        [r["ratio"] for r in records],
        color=[colors.get(r["op"], "tab:gray") for r in records],
    )
    ax.set_xscale("log", base=2)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(records)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("samattn / torch (higher is better; * automatic family)")
    ax.set_title(f"samattn vs torch on {gpu}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot: {path}")
