"""Build and run the softmax host emulation (no GPU needed).

Copies the softmax sources into a scratch folder with the few device-only
lines replaced by host hooks (shim.h: inline PTX, the extern shared array,
<<<>>> launches), compiles check_softmax.cpp with g++ (C++20, threads) and
runs the given suites. It exercises the real plan, launch and kernel code:
indexing, partial vectors, reductions, split rows, NaN/inf semantics.

    python cpp/src/softmax/host_emulation/run.py [suite ...]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1]  # cpp/src
INCLUDE = HERE.parents[2] / "include"
SUITES = ["rows", "long", "split", "mixed", "columns", "ramp", "random"]


def cutlass_include() -> Path:
    import cutlass_library

    return Path(cutlass_library.__file__).parent / "source" / "include"


def emulated_sources(out: Path) -> None:
    (out / "softmax").mkdir(parents=True)
    (out / "common").mkdir()
    for name in ["problem.h", "launch_setup.h"]:
        shutil.copy(SRC / "common" / name, out / "common")
    for name in ["softmax_config.h", "softmax_plan.h"]:
        shutil.copy(SRC / "softmax" / name, out / "softmax")

    kernel = (SRC / "softmax" / "softmax_kernel.cuh").read_text()
    kernel = kernel.replace(
        "extern __shared__ uint4 row_cache_storage[];",
        "uint4* row_cache_storage = emu_dynamic_smem();",
    )
    kernel = kernel.replace(
        'asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));', "y = emu_ex2(x);"
    )
    kernel = re.sub(
        r'asm volatile\("st\.global\.v4\.b32.*?\);',
        "*reinterpret_cast<uint4*>(p) = make_uint4(word[0], word[1], word[2], word[3]);",
        kernel,
        flags=re.S,
    )
    if "asm" in kernel:
        raise SystemExit("softmax_kernel.cuh has inline asm that run.py does not replace")
    (out / "softmax" / "softmax_kernel.cuh").write_text('#include "shim.h"\n' + kernel)

    launch = (SRC / "softmax" / "softmax_launch.cuh").read_text()
    launch, count = re.subn(
        r"([\w:]+(?:<[^;{}]*?>)?)\s*<<<(.*?)>>>\((.*?)\);",
        lambda m: f"emu_launch({m.group(1).strip()}, {m.group(2)}, {m.group(3)});",
        launch,
        flags=re.S,
    )
    if count == 0:
        raise SystemExit("no <<<>>> launch found in softmax_launch.cuh")
    (out / "softmax" / "softmax_launch.cuh").write_text(launch)


def main() -> int:
    suites = sys.argv[1:] or SUITES
    cuda_include = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    with tempfile.TemporaryDirectory(prefix="softmax_emulation_") as scratch:
        out = Path(scratch)
        emulated_sources(out / "src")
        binary = out / "check_softmax"
        subprocess.run(
            [
                "g++",
                "-std=c++20",
                "-O2",
                "-pthread",
                "-Wno-attributes",
                "-Wno-deprecated-declarations",
            ]
            + [f"-I{p}" for p in (out / "src", HERE, INCLUDE, cutlass_include(), cuda_include)]
            + [str(HERE / "check_softmax.cpp"), "-o", str(binary)],
            check=True,
        )
        failed = 0
        for suite in suites:
            result = subprocess.run([str(binary), suite], capture_output=True, text=True)
            lines = result.stdout.splitlines()
            print("\n".join(line for line in lines if not line.startswith("ok")))
            failed += result.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
