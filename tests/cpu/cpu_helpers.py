"""Helpers the CPU tests share (imported as `cpu_helpers`; tests/cpu is on sys.path)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class OneCallTimer:
    """Calls fn once and reports 1 ms (or ms_by_fn[fn]); counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def input_set_count(self, set_bytes: int) -> int:
        return 1

    def median_ms(self, fn, input_sets) -> float:
        self.calls += 1
        fn(*input_sets[0])
        return 1.0


def ascii_lines(text: str) -> list[str]:
    """The table's lines with its multiplication signs and dashes as x and -."""
    return text.replace("\N{MULTIPLICATION SIGN}", "x").replace("\N{EN DASH}", "-").splitlines()


def load_readme_table():
    spec = importlib.util.spec_from_file_location(
        "readme_table", ROOT / "benchmarks" / "readme_table.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
