"""The command line of samattn.bench: options, the run, the JSON file, --compare."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

import samattn

from .. import _checks, _lib
from . import compare, report
from .cases import OPS, TERMS_FEATURES
from .routines import ROUTINES
from .runner import Bench
from .timing import Timer

FAMILIES = ("auto", *_lib.FAMILY_CODES)  # "auto": the library's own choice for the GPU


def runnable_families(cc: tuple[int, int]) -> list[str]:
    """The families built into the library that a GPU of compute capability `cc` runs,
    newest first: those the library accepts, forced, for some op in some dtype
    (samattn_select_family: the family's arch, its dtypes, the build)."""
    found = []
    for name in reversed(_lib.built_families()):
        code = _lib.FAMILY_CODES[name]
        for op in _lib.OP_CODES:
            if any(_accepts(op, dtype, cc, code) for dtype in _checks.DTYPE_CODES.values()):
                found.append(name)
                break
    return found


def _accepts(op: str, dtype_code: int, cc: tuple[int, int], family_code: int) -> bool:
    try:
        _lib.select_family(op, dtype_code, cc, family_code, True)
    except (ValueError, RuntimeError):  # UnsupportedError is a RuntimeError
        return False
    return True


def default_families() -> list[str]:
    """--families without the option: automatic selection and every family this GPU runs
    forced, so that a family's regression shows in every run."""
    return ["auto", *runnable_families(torch.cuda.get_device_capability())]


def _list_argument(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in allowed]
        if unknown or not items:
            raise argparse.ArgumentTypeError(
                f"{text!r}: choose from {', '.join(allowed)} (comma-separated)"
            )
        return items

    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m samattn.bench",
        description="Benchmark samattn against torch (cuBLAS, torch.softmax, SDPA's flash and "
        "cuDNN attention) on this GPU, or compare two result files (--compare).",
    )
    parser.add_argument(
        "--ops",
        type=_list_argument(OPS),
        default=list(OPS),
        help=f"{','.join(OPS)} (default: all)",
    )
    parser.add_argument(
        "--families",
        type=_list_argument(FAMILIES),
        default=None,
        help="kernel families to measure, e.g. sm80,sm75 or auto,sm75; auto is the family "
        "samattn picks for this GPU, the others are forced (default: auto and every family "
        "built into the library that this GPU can run)",
    )
    parser.add_argument(
        "--json",
        default="benchmarks/results/",
        help="results file, or a folder (ending in /) for <gpu>.json "
        "(default: benchmarks/results/<gpu>.json)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of the ratios here")
    parser.add_argument(
        "--terms-features",
        type=_list_argument(TERMS_FEATURES),
        default=list(TERMS_FEATURES),
        help=f"the features --ops terms measures: {','.join(TERMS_FEATURES)} (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    comparing = parser.add_argument_group(
        "comparison", "--compare OLD NEW compares two result files of one GPU (no GPU needed); "
        "--compare OLD runs the benchmark first and compares its results with OLD. Exit "
        "status 1 when a record got slower by more than the threshold."
    )  # fmt: skip
    comparing.add_argument(
        "--compare", nargs="+", metavar="JSON", default=None, help="OLD.json [NEW.json]"
    )
    comparing.add_argument(
        "--threshold",
        type=float,
        default=compare.DEFAULT_THRESHOLD * 100,
        metavar="PERCENT",
        help="a record moved when its speed changed by more than this (default: 5)",
    )
    comparing.add_argument(
        "--compare-by",
        choices=compare.COMPARED,
        default="samattn",
        help="samattn: samattn's own TFLOPS, GB/s or microseconds (default); ratio: its "
        "ratio to torch measured in the same run",
    )
    comparing.add_argument(
        "--report-only",
        action="store_true",
        help="exit status 0 even when records got slower",
    )
    comparing.add_argument(
        "--compare-any-gpu",
        action="store_true",
        help="compare files of two different GPUs",
    )
    args = parser.parse_args(argv)
    if args.compare is not None and len(args.compare) > 2:
        parser.error("--compare takes OLD.json and at most one NEW.json")
    if args.threshold < 0:
        parser.error("--threshold is a percentage >= 0")
    return args


def _compare(args: argparse.Namespace, old: str, new: str | Path) -> int:
    return compare.compare_files(
        old, new, threshold=args.threshold / 100, by=args.compare_by,
        report_only=args.report_only, any_gpu=args.compare_any_gpu,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.compare is not None and len(args.compare) == 2:
        return _compare(args, *args.compare)
    if not torch.cuda.is_available():
        print("samattn.bench: torch sees no CUDA GPU; nothing to measure", file=sys.stderr)
        return 2
    command = "python -m samattn.bench" + ("" if not argv else " " + shlex.join(argv))
    env = report.environment(command)
    json_path = Path(args.json)
    if args.json.endswith("/") or json_path.is_dir():
        json_path = json_path / f"{report.gpu_slug(env['gpu'])}.json"
    print(
        f"samattn {env['samattn']} on {env['gpu']} (cc {env['cc']}), torch {env['torch']}, "
        f"CUDA {env['cuda']}; families built: {', '.join(samattn.built_families())}"
    )
    names = args.families if args.families is not None else default_families()
    print(f"families measured: {', '.join(dict.fromkeys(names))}")
    print(f"command: {command}\n")

    size = "quick" if args.quick else "full"
    families = [None if name == "auto" else name for name in dict.fromkeys(names)]
    bench = Bench(Timer(args.quick), families, args.terms_features)
    started = time.perf_counter()
    print(report.TABLE_HEADER, flush=True)
    for op, routine in ROUTINES.items():
        if op not in args.ops:
            continue
        if routine.HEADER:
            print(f"\n{routine.HEADER}", flush=True)
        for case in routine.cases(size):
            routine.run(bench, case)
            if routine.FREES_MEMORY:
                torch.cuda.empty_cache()
    print(report.summarize(bench))
    print(f"\n{len(bench.records)} records in {time.perf_counter() - started:.0f} s")

    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(
        json.dumps({**env, "records": bench.records, "skipped": bench.skipped}, indent=1) + "\n"
    )
    print(f"results: {json_path}")
    if args.plot is not None and bench.records:
        report.write_plot(bench.records, env["gpu"], args.plot)
    status = 1 if bench.errors else 0
    if args.compare is not None:
        print()
        status = max(status, _compare(args, args.compare[0], json_path))
    return status
