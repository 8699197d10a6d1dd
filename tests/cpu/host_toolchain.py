"""Where the CPU tests that compile C++ with g++ find the CUDA runtime headers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def cuda_home() -> Path | None:
    """A CUDA toolkit with include/cuda_runtime_api.h: $CUDA_HOME, $CUDA_PATH, the one nvcc
    on PATH belongs to, or /usr/local/cuda; None without one."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parents[1]))
    candidates.append("/usr/local/cuda")
    for base in filter(None, candidates):
        if (Path(base) / "include" / "cuda_runtime_api.h").exists():
            return Path(base)
    return None
