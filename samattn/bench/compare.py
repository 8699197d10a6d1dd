"""Two result files of samattn.bench side by side: every record that moved.

    python -m samattn.bench --compare OLD.json NEW.json [--threshold 5] [--report-only]
    python -m samattn.bench --compare OLD.json [the usual run options]   (runs, then compares)

Records are matched by what identifies a case (IDENTITY: op, family that ran, forced or
automatic, dtype, shape, causal, direction, feature, split-K choice, baseline, fp8 format,
...); when several records share those fields (e.g. a forced sm90 GEMM that hands the
problem to sm80, beside the forced sm80 one) they are matched in the order the files list
them. A record moved when its speed changed by more than the threshold: samattn's own
number (TFLOPS, GB/s; microseconds for the overhead records, where lower is better) by
default, or its ratio to torch with ``by="ratio"``. Both files must come from the same GPU.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

# The fields that identify a record's case (absent fields count as None).
IDENTITY = (
    "op",
    "family",
    "forced",
    "dtype",
    "shape",
    "causal",
    "direction",
    "feature",
    "split_k",
    "split_k_mode",
    "versus",
    "projection",
    "paged",
    "dropout_p",
    "fp8",
)
# Units whose numbers are times (lower is better); all others are rates.
TIME_UNITS = ("us", "ms")
DEFAULT_THRESHOLD = 0.05
COMPARED = ("samattn", "ratio")


class Change(NamedTuple):
    """A record of both files: `change` is the relative change of its speed (new / old - 1,
    oriented so that > 0 is faster), or None where either lacks the number."""

    old: dict[str, Any]
    new: dict[str, Any]
    change: float | None


class Comparison(NamedTuple):
    pairs: list[Change]  # every record of both files, in NEW's order
    only_old: list[dict[str, Any]]  # cases that NEW does not have (not measured again)
    only_new: list[dict[str, Any]]


def record_key(record: dict[str, Any]) -> tuple[str, ...]:
    return tuple(json.dumps(record.get(field), sort_keys=True) for field in IDENTITY)


def speed(record: dict[str, Any], by: str = "samattn") -> float | None:
    """The number compared, higher is better: samattn's rate, 1 / its time (unit us or ms),
    or its ratio to torch (already higher-is-better for every op)."""
    value = record.get(by)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    if by == "samattn" and record.get("unit") in TIME_UNITS:
        return 1.0 / value
    return float(value)


def compare(
    old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]], by: str = "samattn"
) -> Comparison:
    """The records of `old` and `new` matched (by record_key, then by order of appearance)."""
    if by not in COMPARED:
        raise ValueError(f"compare by one of {', '.join(COMPARED)}, not {by!r}")
    waiting: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for record in old:
        waiting.setdefault(record_key(record), []).append(record)
    pairs, only_new = [], []
    for record in new:
        candidates = waiting.get(record_key(record))
        if not candidates:
            only_new.append(record)
            continue
        before = candidates.pop(0)
        old_speed, new_speed = speed(before, by), speed(record, by)
        change = new_speed / old_speed - 1.0 if old_speed and new_speed else None
        pairs.append(Change(before, record, change))
    only_old = [record for records in waiting.values() for record in records]
    return Comparison(pairs, only_old, only_new)


def _value(record: dict[str, Any]) -> str:
    value = record.get("samattn")
    return "-" if value is None else f"{value:.4g} {record.get('unit', '')}".strip()


def _ratio(record: dict[str, Any]) -> str:
    value = record.get("ratio")
    return "-" if value is None else f"{value:.2f}"


def _time(record: dict[str, Any]) -> str | None:
    if record.get("samattn_ms") is not None:
        return f"{record['samattn_ms']:.4g} ms"
    if record.get("samattn_us") is not None:
        return f"{record['samattn_us']:.4g} us"
    return None


def describe(record: dict[str, Any]) -> str:
    """op, family (* automatic), dtype and case of a record, in a few words."""
    from .report import case_text

    family = str(record.get("family")) + ("" if record.get("forced") else "*")
    text = f"{record.get('op')} {family} {record.get('dtype')} {case_text(record)}"
    if record.get("direction") and record.get("direction") not in text:
        text += f" {record['direction']}"
    if record.get("split_k") is not None:
        text += f" split_k={record['split_k']} {record.get('split_k_mode')}"
    return text


def format_change(change: Change) -> str:
    """One line: the case, the change, samattn's number, ratio to torch and time, old -> new."""
    old, new = change.old, change.new
    line = (
        f"{change.change:+7.1%}  {describe(new)}: {_value(old)} -> {_value(new)}, "
        f"ratio to torch {_ratio(old)} -> {_ratio(new)}"
    )
    old_time, new_time = _time(old), _time(new)
    if old_time and new_time:
        line += f", time {old_time} -> {new_time}"
    return line


def _op_counts(records: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for record in records:
        counts[str(record.get("op"))] = counts.get(str(record.get("op")), 0) + 1
    return ", ".join(f"{op} {count}" for op, count in counts.items())


def report(
    old: dict[str, Any],
    new: dict[str, Any],
    threshold: float = DEFAULT_THRESHOLD,
    by: str = "samattn",
    out: Callable[[str], None] = print,
) -> int:
    """Prints every record of `new` whose speed moved by more than `threshold` (a fraction)
    against `old` (result files as dicts), slowest first; returns the number that got
    slower by more than the threshold."""
    result = compare(old.get("records", []), new.get("records", []), by)
    slower = sorted((c for c in result.pairs if c.change is not None and c.change < -threshold),
                    key=lambda c: c.change)  # fmt: skip
    faster = sorted((c for c in result.pairs if c.change is not None and c.change > threshold),
                    key=lambda c: -c.change)  # fmt: skip
    unknown = [c for c in result.pairs if c.change is None]
    what = "samattn's own number" if by == "samattn" else "the ratio to torch"
    out(
        f"compared {len(result.pairs)} records by {what}, threshold {threshold:.1%}: "
        f"{len(slower)} slower, {len(faster)} faster, "
        f"{len(result.pairs) - len(slower) - len(faster) - len(unknown)} within the threshold"
    )
    out(f"  old: {old.get('date', '?')}  {old.get('command', '?')}")
    out(f"  new: {new.get('date', '?')}  {new.get('command', '?')}")
    for title, changes in (("slower", slower), ("faster", faster)):
        if changes:
            out(f"{title}:")
            out("\n".join("  " + format_change(c) for c in changes))
    if unknown:
        out(f"not comparable (a number missing in one file): {len(unknown)}")
        out("\n".join(f"  {describe(c.new)}" for c in unknown))
    if result.only_old:
        counts = _op_counts(result.only_old)
        out(f"only in old (not measured in new): {len(result.only_old)} ({counts})")
    if result.only_new:
        out(f"only in new: {len(result.only_new)} ({_op_counts(result.only_new)})")
    return len(slower)


def load(path: str | Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise ValueError(f"{path}: not a results file of samattn.bench (no 'records' list)")
    return data


def compare_files(
    old_path: str | Path,
    new_path: str | Path,
    threshold: float = DEFAULT_THRESHOLD,
    by: str = "samattn",
    report_only: bool = False,
    any_gpu: bool = False,
    out: Callable[[str], None] = print,
) -> int:
    """The exit status of ``--compare OLD NEW``: 0 when nothing got slower by more than
    `threshold` (or report_only), 1 when something did, 2 when the files cannot be
    compared (unreadable, or from two GPUs unless any_gpu)."""
    try:
        old, new = load(old_path), load(new_path)
    except (OSError, ValueError) as error:
        out(f"samattn.bench --compare: {error}")
        return 2
    if old.get("gpu") != new.get("gpu") and not any_gpu:
        out(
            f"samattn.bench --compare: {old_path} is from {old.get('gpu')!r} and {new_path} from "
            f"{new.get('gpu')!r}; compare runs of one GPU (--compare-any-gpu to do it anyway)"
        )
        return 2
    out(f"samattn.bench --compare {old_path} {new_path} ({new.get('gpu')})")
    slower = report(old, new, threshold, by, out)
    if slower and not report_only:
        out(f"{slower} records got slower by more than {threshold:.1%}")
        return 1
    return 0
