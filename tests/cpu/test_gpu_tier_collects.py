"""The GPU tier's modules collect on a machine without a GPU.

tests/gpu/conftest.py turns a module that fails to collect into one skipped placeholder
when there is no GPU (so that a machine where samattn cannot load still runs the tier
as skips). That also hides a module broken by its own code, e.g. a parametrize that
clashes with conftest's `family`: CI would stay green while the GPU machine fails to
collect the module. Here every module must yield its real tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_gpu_module_collects_its_tests():
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--collect-only",
         "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "gpu")],
        # In the session's directory: nox runs outside the checkout, on the installed wheel.
        capture_output=True, text=True, cwd=os.getcwd(), timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    items = [line for line in result.stdout.splitlines() if "::" in line]
    placeholders = [line for line in items if line.endswith("::module")]
    assert not placeholders, f"modules that did not collect: {placeholders}"
    modules = {line.split("::")[0] for line in items}
    assert len(modules) >= 10 and len(items) > 1000, (len(modules), len(items))
