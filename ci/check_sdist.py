"""The source distribution builds a working wheel: sdist, then `pip wheel` of that sdist.

    python ci/check_sdist.py [ARCHS] [--ops OPS]      e.g. 80 --ops softmax

1. `python -m build --sdist` (without isolation: the pinned build requirements are installed)
   into build/sdist-check/; it must hold what a build from source needs (CMakeLists.txt,
   cpp/, the package, LICENSE and NOTICE) and nothing of a build tree, and its PKG-INFO the
   PEP 639 license fields.
2. `pip wheel samattn-VERSION.tar.gz` for ARCHS and OPS (default: the environment's
   SAMATTN_CUDA_ARCHS and SAMATTN_OPS, else 80 and softmax). pip unpacks the sdist under
   build/sdist-check/tmp, inside the checkout, so with CCACHE_BASEDIR at the checkout (as
   `nox -s build` sets it) every compile is a ccache hit of an earlier build of the same
   archs and ops: in CI this step costs a configure, cache hits and a link.
3. The wheel loads: its libsamattn answers `samattn.info()`-level queries (version, archs)
   from a fresh interpreter that sees only the wheel's files; and the wheel check
   (ci/check_wheel.py --ci, after ci/repair_wheel.py renames it to variant cu130 and tags
   it manylinux_2_28_x86_64) passes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "sdist-check"
REQUIRED = [
    "pyproject.toml",
    "CMakeLists.txt",
    "LICENSE",
    "NOTICE",
    "cpp/cmake/build_info.cmake",
    "cpp/cmake/compile_memory.py",
    "cpp/cmake/glibc_compat.py",
    "cpp/instantiations.cmake",
    "cpp/include/samattn/samattn.h",
    "samattn/__init__.py",
    "samattn/_version.py",
]
FORBIDDEN = re.compile(r"^(build|dist|\.nox|\.git|benchmarks/results)(/|$)|\.so$|\.o$")


def run(*command: str, **kwargs) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def check_sdist(sdist: Path) -> list[str]:
    problems = []
    with tarfile.open(sdist) as tar:
        top = sdist.name[: -len(".tar.gz")]
        names = {m.name[len(top) + 1 :] for m in tar.getmembers() if m.name.startswith(top + "/")}
        pkg_info = tar.extractfile(f"{top}/PKG-INFO").read().decode()
    problems += [f"missing {name}" for name in REQUIRED if name not in names]
    problems += [f"should not ship {name}" for name in sorted(names) if FORBIDDEN.search(name)]
    for field in ("License-Expression: BSD-3-Clause", "License-File: LICENSE"):
        if field not in pkg_info:
            problems.append(f"PKG-INFO lacks {field!r}")
    print(f"{sdist.name}: {len(names)} files, {sdist.stat().st_size / 2**10:.0f} KiB")
    return problems


def smoke_test(wheel: Path) -> None:
    """Imports the wheel's package from its unpacked files and loads its library."""
    unpacked = WORK / "unpacked"
    shutil.rmtree(unpacked, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(unpacked)
    code = (
        "import samattn, samattn._lib as lib, pathlib;"
        "path = pathlib.Path(lib.library_path());"
        f"assert str(path).startswith({str(unpacked)!r}), path;"
        "print('loaded', path.name, 'from the wheel: version', lib.version(),"
        " 'ops', lib.built_ops(), 'families', lib.built_families())"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SAMATTN_LIBRARY")}
    env["PYTHONPATH"] = str(unpacked)
    run(sys.executable, "-c", code, env=env, cwd=str(WORK))


def main(argv: list[str]) -> int:
    archs = os.environ.get("SAMATTN_CUDA_ARCHS") or "80"
    ops = os.environ.get("SAMATTN_OPS") or "softmax"
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--ops" and rest:
            ops = rest.pop(0)
        elif re.fullmatch(r"\d+[af]?([,;]\d+[af]?)*", arg):
            archs = arg
        else:
            print(__doc__, file=sys.stderr)
            return 2
    shutil.rmtree(WORK, ignore_errors=True)
    (WORK / "tmp").mkdir(parents=True)
    started = time.monotonic()
    build = [sys.executable, "-m", "build", "--sdist", "--no-isolation"]
    run(*build, "--outdir", str(WORK), str(ROOT))
    sdist = next(WORK.glob("samattn-*.tar.gz"))
    problems = check_sdist(sdist)
    print(f"sdist in {time.monotonic() - started:.0f}s")

    env = dict(os.environ)
    env.update(
        SAMATTN_CUDA_ARCHS=archs.replace(",", ";"),
        SAMATTN_OPS=ops.replace(",", ";"),
        TMPDIR=str(WORK / "tmp"),
        CCACHE_BASEDIR=os.environ.get("CCACHE_BASEDIR") or str(ROOT),
        CCACHE_NOHASHDIR="1",
    )
    if not env.get("CMAKE_BUILD_PARALLEL_LEVEL"):
        sys.path.insert(0, str(ROOT / "ci"))
        from compile_jobs import compile_jobs

        env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(compile_jobs()[0])
    began = time.monotonic()
    wheels = WORK / "wheels"
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    run(*pip, "-w", str(wheels), str(sdist), env=env, cwd=str(WORK))
    wheel = next(wheels.glob("samattn-*.whl"))
    took = time.monotonic() - began
    print(f"{wheel.name} from the sdist (archs {archs}, ops {ops}) in {took:.0f}s")
    smoke_test(wheel)
    repaired = WORK / "repaired"
    repair = [sys.executable, str(ROOT / "ci" / "repair_wheel.py"), str(wheel), str(repaired)]
    # The table's platform, as CI's own wheel: the glibc stubs keep it reachable here.
    run(*repair, "--variant", "cu130")
    check = [sys.executable, str(ROOT / "ci" / "check_wheel.py"), "--ci"]
    result = subprocess.run([*check, *map(str, repaired.glob("*.whl"))])
    if result.returncode:
        problems.append("ci/check_wheel.py --ci failed on the wheel built from the sdist")
    print("\n".join(problems) or f"sdist OK ({time.monotonic() - started:.0f}s in all)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
