"""The CPU emulation of the SIMT GEMM kernel (cpp/src/gemm/simt/emulation), built with g++
and run here: no GPU, no nvcc, about 30 s on 2 cores.

It runs the kernel body with one host thread per CUDA thread, holds cp.async writes back
until their wait, and bounds- and alignment-checks every global access. A missing wait or
an out-of-bounds read passes on a GPU whenever the timing or the neighbouring memory is
kind, so the GPU tier cannot see them.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from host_toolchain import cuda_home

ROOT = Path(__file__).resolve().parents[2]


def test_simt_gemm_emulation(tmp_path):
    cuda = cuda_home()
    if shutil.which("g++") is None or importlib.util.find_spec("cutlass_library") is None:
        pytest.skip("needs g++ and the nvidia-cutlass wheel")
    if cuda is None:
        pytest.skip("needs the CUDA runtime headers (CUDA_HOME or nvcc on PATH)")
    env = dict(os.environ, CUDA_HOME=str(cuda), TMPDIR=str(tmp_path))
    result = subprocess.run(
        ["bash", "cpp/src/gemm/simt/emulation/run.sh"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.rstrip().endswith("all passed")
