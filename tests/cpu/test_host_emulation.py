"""CPU emulations of GPU code, built with g++ and run here: no GPU, no nvcc.

The SIMT GEMM kernel (cpp/src/gemm/simt/emulation), about 30 s on 2 cores: it runs the
kernel body with one host thread per CUDA thread, holds cp.async writes back until their
wait, and bounds- and alignment-checks every global access. A missing wait or an
out-of-bounds read passes on a GPU whenever the timing or the neighbouring memory is kind,
so the GPU tier cannot see them.

The grouped GEMM's schedule (cpp/src/gemm/emulation), about 15 s: a warp of host threads.
The fp8 widening of GPUs before sm89 (cpp/src/attention/emulation), a second.
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


def test_group_schedule_emulation(tmp_path):
    """The grouped GEMM's device-side schedule (cpp/src/gemm/group.h), its warp of 32 lanes
    run as host threads (cpp/src/gemm/emulation/group_schedule_emulation.cpp): every row
    tile of every expert found exactly once within the grid for valid offsets, every answer
    inside the rows for invalid ones."""
    cuda = cuda_home()
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    if cuda is None:
        pytest.skip("needs the CUDA runtime headers (CUDA_HOME or nvcc on PATH)")
    binary = tmp_path / "group_schedule_emulation"
    build = subprocess.run(
        ["g++", "-std=c++17", "-O1", "-pthread", "-Icpp/src", "-Icpp/include",
         f"-I{cuda / 'include'}", "cpp/src/gemm/emulation/group_schedule_emulation.cpp",
         "-o", str(binary)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-4000:]
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    assert result.stdout.rstrip().endswith("all passed")


def test_fp8_widening_without_the_instruction(tmp_path):
    """fp8 KV caches on GPUs before sm89 widen their tiles by bit shifts
    (cpp/src/attention/fp8_bits.h), a path no GPU of the test matrix runs: every pair of
    bytes, e4m3 and e5m2, against the formats' definitions
    (cpp/src/attention/emulation/fp8_widen_check.cpp)."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    binary = tmp_path / "fp8_widen_check"
    build = subprocess.run(
        ["g++", "-std=c++17", "-O1", "-Icpp/src", "cpp/src/attention/emulation/fp8_widen_check.cpp",
         "-o", str(binary)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-4000:]
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.rstrip().endswith("all passed"), result.stdout
