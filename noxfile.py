"""Developer and CI entry points: `nox -s build|tests|bench|lint`.

    nox -s build                 wheel into dist/ for every arch (75;80;86;89;90a)
    nox -s build -- 80           ... for a subset: -- 75,80   -- 90a --ops gemm
    nox -s tests                 install the newest wheel in dist/ (building one if
                                 there is none) and run tests/cpu and tests/gpu (which
                                 skips itself without a GPU); extra args go to pytest,
                                 e.g. -- tests/cpu/test_binary.py -x
    nox -s bench -- ARGS         python -m samattn.bench ARGS against that wheel
    nox -s lint                  ruff check, ruff format --check, clang-format

By default the sessions run in the current interpreter (nox's `none` backend),
reusing its torch, cmake, ninja, scikit-build-core and pytest: that works on a
machine with no package registry. SAMATTN_NOX_VENV=venv gives each session a
virtualenv that still sees the interpreter's packages (--system-site-packages);
`nox --force-venv-backend ...` overrides both. `tests` and `bench` install the
samattn wheel (never its dependencies) into the session's environment.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
DIST = ROOT / "dist"
ALL_ARCHS = "75;80;86;89;90a"
ALL_OPS = "gemm;softmax;attention"
# One CuTe translation unit takes about this much memory to compile.
GB_PER_COMPILE_JOB = 2.2

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"

_BACKEND = os.environ.get("SAMATTN_NOX_VENV", "none")
if _BACKEND not in ("none", "venv", "virtualenv", "uv"):
    raise SystemExit(f"SAMATTN_NOX_VENV={_BACKEND!r}: use none, venv, virtualenv or uv")
_VENV_PARAMS = [] if _BACKEND == "none" else ["--system-site-packages"]


def _session(func):
    return nox.session(venv_backend=_BACKEND, venv_params=_VENV_PARAMS)(func)


# ---------------------------------------------------------------- helpers ----


def _has_venv(session: nox.Session) -> bool:
    return isinstance(session.virtualenv, nox.virtualenv.VirtualEnv)


def _pip_install(session: nox.Session, *args: str) -> None:
    """pip install into the session's environment (the interpreter's own with `none`)."""
    if _has_venv(session):
        session.install(*args)
    else:
        session.run("python", "-m", "pip", "install", *args, external=True)


def _session_python_has(session: nox.Session, modules: list[str]) -> bool:
    """Whether the session's interpreter can import every module."""
    code = f"import importlib.util; print(all(importlib.util.find_spec(m) for m in {modules!r}))"
    out = session.run("python", "-c", code, silent=True, external=True) or ""
    return out.strip().endswith("True")


def _cmake_ok() -> bool:
    """A cmake >= 3.26 on PATH (pip's cmake package provides one)."""
    cmake = shutil.which("cmake")
    if cmake is None:
        return False
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"version (\d+)\.(\d+)", out)
    return bool(match) and (int(match[1]), int(match[2])) >= (3, 26)


def _compile_jobs() -> int:
    """Parallel compile jobs: min(cores, available memory / GB_PER_COMPILE_JOB)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    available_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available_gb = int(line.split()[1]) / 1024**2
    except OSError:
        pass
    jobs = cores or 1
    if available_gb is not None:
        jobs = min(jobs, int(available_gb / GB_PER_COMPILE_JOB))
    return max(1, jobs)


def _parse_build_args(args: list[str]) -> tuple[str, str]:
    """`[ARCHS] [--ops OPS]` -> (SAMATTN_CUDA_ARCHS, SAMATTN_OPS), lists joined by ';'."""
    archs = os.environ.get("SAMATTN_CUDA_ARCHS") or ALL_ARCHS
    ops = os.environ.get("SAMATTN_OPS") or ALL_OPS
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--ops" and rest:
            ops = rest.pop(0)
        elif arg.startswith("--ops="):
            ops = arg.split("=", 1)[1]
        elif re.fullmatch(r"\d+[af]?([,;]\d+[af]?)*", arg):
            archs = arg
        else:
            raise SystemExit(
                f"nox -s build: unexpected argument {arg!r} (use: [75,80,...] [--ops gemm,...])"
            )
    return archs.replace(",", ";"), ops.replace(",", ";")


def _load_fatbin_module():
    """samattn/_fatbin.py by path: importing the package would need the library."""
    spec = importlib.util.spec_from_file_location(
        "_samattn_fatbin", ROOT / "samattn" / "_fatbin.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _describe_wheel(wheel: Path) -> None:
    import zipfile

    size_mib = wheel.stat().st_size / 2**20
    print(f"wheel: {wheel} ({size_mib:.1f} MiB)")
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory() as tmp:
        names = [n for n in zf.namelist() if n.endswith("libsamattn.so")]
        if not names:
            print("  no libsamattn.so in the wheel!")
            return
        lib = Path(zf.extract(names[0], tmp))
        info = _load_fatbin_module().read_fatbin_archs(lib)
        print(
            f"  {names[0]}: {lib.stat().st_size / 2**20:.1f} MiB, "
            f"SASS {info['sass']}, PTX {info['ptx']}, {info['containers']} fatbin containers"
        )


def _build_wheel(session: nox.Session, archs: str, ops: str) -> Path:
    env = {
        "SAMATTN_CUDA_ARCHS": archs,
        "SAMATTN_OPS": ops,
        "CMAKE_BUILD_PARALLEL_LEVEL": os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL")
        or str(_compile_jobs()),
        # ccache: paths relative to the checkout, and no working directory in the key
        # (-lineinfo would put it there), so that every clone shares the cache.
        "CCACHE_BASEDIR": os.environ.get("CCACHE_BASEDIR") or str(ROOT),
        "CCACHE_NOHASHDIR": os.environ.get("CCACHE_NOHASHDIR") or "1",
    }
    session.log(
        f"building archs={archs} ops={ops} with {env['CMAKE_BUILD_PARALLEL_LEVEL']} jobs "
        f"(ccache: {'yes' if shutil.which('ccache') else 'not installed'})"
    )
    requirements = ["scikit_build_core", "cutlass_library", "ninja"]
    offline_ready = _session_python_has(session, requirements) and _cmake_ok()
    # -v lets CMake's configure output and ninja's [n/N] progress reach the terminal.
    command = ["python", "-m", "pip", "wheel", str(ROOT), "--no-deps", "-w", str(DIST), "-v"]
    if offline_ready:
        command.append("--no-build-isolation")
    else:
        session.log("build requirements not all installed: isolated build (needs PyPI)")
    session.run(*command, env=env, external=True)
    wheel = _newest_wheel()  # pip (re)wrote it just now
    _describe_wheel(wheel)
    return wheel


def _newest_wheel() -> Path | None:
    wheels = sorted(DIST.glob("samattn*.whl"), key=lambda p: p.stat().st_mtime)
    return wheels[-1] if wheels else None


def _install_wheel(session: nox.Session) -> None:
    wheel = _newest_wheel()
    if wheel is None:
        session.log("no wheel in dist/: building one for every arch first")
        wheel = _build_wheel(session, *_parse_build_args([]))
    session.log(f"installing {wheel.name} (without its dependencies: torch is reused)")
    _pip_install(session, "--no-deps", "--force-reinstall", str(wheel))


def _run_outside_checkout(session: nox.Session, *args: str) -> None:
    """Runs `python ARGS` from an empty folder, so `import samattn` finds the installed
    package and not the source tree (which has no library)."""
    with tempfile.TemporaryDirectory() as tmp, session.chdir(tmp):
        session.run("python", *args, external=True)


# --------------------------------------------------------------- sessions ----


@_session
def build(session: nox.Session) -> None:
    """Builds the wheel into dist/: `-- [ARCHS] [--ops OPS]`, e.g. `-- 75,80 --ops gemm`."""
    _build_wheel(session, *_parse_build_args(session.posargs))


@_session
def tests(session: nox.Session) -> None:
    """CPU tier always; GPU tier runs when torch sees a GPU. Extra args go to pytest
    (test paths relative to the checkout select what runs)."""
    _install_wheel(session)
    has_gpu = session.run(
        "python", "-c", "import torch; print(torch.cuda.is_available())", silent=True, external=True
    )
    if "True" not in (has_gpu or ""):
        # tests/gpu is still collected (a broken test module fails here too) and skips itself.
        session.log("torch sees no GPU: the GPU tier will be skipped")
    # pytest runs outside the checkout: test paths given as arguments are made absolute,
    # and replace the default tiers.
    args, paths = [], []
    for arg in session.posargs:
        path = arg.split("::")[0]
        if "/" in path and not arg.startswith("-") and (ROOT / path).exists():
            paths.append(str(ROOT / arg))
        else:
            args.append(arg)
    paths = paths or [str(ROOT / "tests" / "cpu"), str(ROOT / "tests" / "gpu")]
    config = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT)]
    _run_outside_checkout(session, "-m", "pytest", *config, *paths, *args)


@_session
def bench(session: nox.Session) -> None:
    """Benchmarks against torch: `-- ARGS` go to `python -m samattn.bench`."""
    _install_wheel(session)
    _run_outside_checkout(session, "-m", "samattn.bench", *session.posargs)


@_session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, clang-format --dry-run --Werror over cpp/, and the
    variant table (ci/variants.toml)."""
    missing = [tool for tool in ("ruff", "clang-format") if shutil.which(tool) is None]
    if missing:
        _pip_install(session, *missing)
    session.run("ruff", "check", str(ROOT), external=True)
    session.run("ruff", "format", "--check", str(ROOT), external=True)
    sources = sorted(
        str(p)
        for ext in ("*.h", "*.cuh", "*.cu", "*.cpp", "*.hpp")
        for p in (ROOT / "cpp").rglob(ext)
    )
    if sources:
        session.run("clang-format", "--dry-run", "--Werror", *sources, external=True)
    else:
        session.log("no C++/CUDA sources under cpp/")
    session.run("python", str(ROOT / "ci" / "variants.py"), "--check", external=True)


if __name__ == "__main__":
    sys.exit("run this file with nox: nox -s build|tests|bench|lint")
