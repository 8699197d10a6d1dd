"""The glibc symbol versions of libsamattn (CPU tier: no GPU needed).

The release platform is manylinux_2_28 (ci/variants.toml), so the library may import no
glibc symbol newer than GLIBC_2.28. On a glibc >= 2.34 host the build links against stubs
of the pre-2.34 libpthread, libdl and librt (cpp/cmake/glibc_compat.cmake and .py); here:

* the library under test imports nothing newer than the table's platform allows;
* the stub technique itself, end to end with this machine's compiler: a probe library
  that calls pthread, semaphore, dl and shm functions, linked against the stubs, imports
  them at their pre-2.34 versions from the old libraries' sonames, loads, and runs;
* the generator's and the checks' logic on planted input (highest compat version, the
  library a function moved from, moves only; a newer symbol is caught).

What no test here can show: that the library loads on a real glibc 2.28 system. That
needs such a system (the manylinux_2_28 image, or an old distribution).
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


glibc_compat = _module(ROOT / "cpp" / "cmake" / "glibc_compat.py", "_samattn_glibc_compat")


def _platform_glibc() -> str:
    """manylinux_2_28_x86_64 (the table's platform) -> "2.28"."""
    table = tomllib.loads((ROOT / "ci" / "variants.toml").read_text())
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", table["defaults"]["platform"])
    return f"{match[1]}.{match[2]}"


def _objdump() -> str:
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) not found")
    return objdump


def _host_libc() -> Path:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found")
    libc = subprocess.run(
        [gxx, "-print-file-name=libc.so.6"], capture_output=True, text=True
    ).stdout.strip()
    if not Path(libc).is_absolute() or not Path(libc).is_file():
        pytest.skip("g++ names no libc.so.6")
    return Path(libc).resolve()


# ----------------------------------------------------------- the library ----


def test_the_limit_of_the_build_is_the_tables_platform() -> None:
    """SAMATTN_GLIBC_MAX's default, in CMake and in pyproject.toml, is the platform's glibc."""
    cmake = (ROOT / "cpp" / "cmake" / "glibc_compat.cmake").read_text()
    assert re.search(r'samattn_list_setting\(SAMATTN_GLIBC_MAX "([\d.]+)"', cmake)[1] == (
        _platform_glibc()
    )
    defines = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["scikit-build"]
    assert defines["cmake"]["define"]["SAMATTN_GLIBC_MAX"]["default"] == _platform_glibc()
    assert defines["cmake"]["define"]["SAMATTN_GLIBC_COMPAT"]["default"] == "AUTO"


def test_the_library_needs_at_most_the_platforms_glibc() -> None:
    """What auditwheel's manylinux_2_28 policy checks, read from the library under test: a
    build on glibc >= 2.34 without the stubs imports pthread_create@GLIBC_2.34 and 45
    more, and fails here."""
    from samattn import _lib

    library = _lib.library_path()
    if not library.is_file():
        pytest.fail(f"{library} does not exist: build and install the wheel (nox -s tests)")
    symbols = glibc_compat.dynamic_symbols(_objdump(), library)
    imported = [s for s in symbols if s.undefined and glibc_compat.version_key(s.version)]
    assert imported, "no versioned glibc symbol read: objdump's format changed?"
    assert glibc_compat.newer_imports(symbols, _platform_glibc()) == []


# ------------------------------------------------------ the technique, live ----

PROBE = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/mman.h>

static void* post(void* semaphore) {
  sem_post(static_cast<sem_t*>(semaphore));
  return semaphore;
}

// 0 when a thread posted a semaphore and dlopen found cos in libm; shm_unlink of a name
// that does not exist only has to return.
extern "C" int probe() {
  sem_t semaphore;
  pthread_t thread;
  if (sem_init(&semaphore, 0, 0) != 0) return 1;
  if (pthread_create(&thread, nullptr, post, &semaphore) != 0) return 2;
  if (sem_wait(&semaphore) != 0 || pthread_join(thread, nullptr) != 0) return 3;
  sem_destroy(&semaphore);
  void* libm = dlopen("libm.so.6", RTLD_NOW);
  if (libm == nullptr || dlsym(libm, "cos") == nullptr) return 4;
  dlclose(libm);
  shm_unlink("/samattn-glibc-compat-probe-that-does-not-exist");
  return 0;
}
"""
PROBED = {
    "pthread_create": "libpthread.so.0",
    "pthread_join": "libpthread.so.0",
    "sem_init": "libpthread.so.0",
    "sem_wait": "libpthread.so.0",
    "dlopen": "libdl.so.2",
    "dlsym": "libdl.so.2",
    "shm_unlink": "librt.so.1",
}


def test_a_probe_linked_against_the_stubs_imports_old_versions_and_runs(tmp_path: Path) -> None:
    objdump, libc = _objdump(), _host_libc()
    moved, _ = glibc_compat.moved_functions(glibc_compat.dynamic_symbols(objdump, libc))
    if not moved:
        pytest.skip(f"{libc} is older than glibc 2.34: nothing moved, no stubs needed")
    for name, library in PROBED.items():
        assert name in moved[library], f"{name} not stubbed in {library}"
    stubs = glibc_compat.build_stubs(moved, "g++", tmp_path / "stubs")
    (tmp_path / "probe.cpp").write_text(PROBE)
    probe = tmp_path / "libprobe.so"
    link = ["-Wl,--as-needed", "-Wl,-z,defs", *map(str, stubs.values())]
    compile_probe = [
        "g++",
        "-shared",
        "-fPIC",
        "-O2",
        "-o",
        str(probe),
        str(tmp_path / "probe.cpp"),
    ]
    subprocess.run([*compile_probe, *link], check=True)
    imported = {
        s.name: s.version
        for s in glibc_compat.dynamic_symbols(objdump, probe)
        if s.undefined and s.name in PROBED
    }
    assert imported == {name: moved[PROBED[name]][name] for name in PROBED}
    assert all(glibc_compat.version_key(v) < (2, 34) for v in imported.values())
    references = glibc_compat.version_references(objdump, probe)
    assert {"libpthread.so.0", "libdl.so.2", "librt.so.1"} <= set(references)
    assert glibc_compat.newer_imports(glibc_compat.dynamic_symbols(objdump, probe), "2.28") == []
    # The stubs' folder is nowhere in the probe: the real libraries answer at run time.
    dynamic = subprocess.run(["readelf", "-d", str(probe)], capture_output=True, text=True)
    assert "RPATH" not in dynamic.stdout and "RUNPATH" not in dynamic.stdout
    assert ctypes.CDLL(str(probe)).probe() == 0


def test_the_check_fails_on_a_newer_version_and_passes_otherwise(tmp_path: Path) -> None:
    """cpp/cmake/glibc_compat.py check, as the build runs it after each link."""
    objdump = _objdump()
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    source = tmp_path / "clock.cpp"
    source.write_text(
        '#include <time.h>\nextern "C" long f() { timespec t; '
        "clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec; }\n"
    )
    library = tmp_path / "libclock.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    script = [sys.executable, str(ROOT / "cpp" / "cmake" / "glibc_compat.py"), "check"]
    script += ["--objdump", objdump]
    passing = subprocess.run([*script, "--max", "2.28", str(library)], capture_output=True)
    assert passing.returncode == 0, passing.stderr
    # clock_gettime is GLIBC_2.17 on x86-64: too new for a limit of 2.16.
    failing = subprocess.run(
        [*script, "--max", "2.16", str(library)], capture_output=True, text=True
    )
    assert failing.returncode == 1 and "clock_gettime@GLIBC_2.17" in failing.stderr
    warning = subprocess.run(
        [*script, "--max", "2.16", "--warn-only", str(library)], capture_output=True, text=True
    )
    assert warning.returncode == 0 and "WARNING" in warning.stderr


# ------------------------------------------------------- planted listings ----

# objdump -T of a glibc 2.36 libc.so.6, a few lines: hidden (compat) versions in
# parentheses, the default without.
LIBC_LISTING = """
0000000000089380 g    DF .text\t0000000000000eed (GLIBC_2.2.5) pthread_create
0000000000089380 g    DF .text\t0000000000000eed  GLIBC_2.34  pthread_create
00000000000853c0 g    DF .text\t000000000000009d (GLIBC_2.3.4) dlmopen
00000000000853c0 g    DF .text\t000000000000009d  GLIBC_2.34  dlmopen
0000000000091c00 g    DF .text\t0000000000000100  GLIBC_2.34  timer_create
0000000000091c00 g    DF .text\t0000000000000100 (GLIBC_2.2.5) timer_create
0000000000091d00 g    DF .text\t0000000000000100 (GLIBC_2.3.3) timer_create
000000000008c370 g    DF .text\t00000000000002d6  GLIBC_2.2.5 pthread_mutex_lock
0000000000027280 g    DF .text\t0000000000000141  GLIBC_2.34  __libc_start_main
0000000000027280 g    DF .text\t0000000000000141 (GLIBC_2.2.5) __libc_start_main
0000000000110000 g    DF .text\t0000000000000100  GLIBC_2.34  closefrom
0000000000120000 g    DF .text\t0000000000000100 (GLIBC_2.9) ns_name_pack
0000000000120000 g    DF .text\t0000000000000100  GLIBC_2.34  ns_name_pack
0000000000000000      DF *UND*\t0000000000000000 (GLIBC_PRIVATE) _dl_argv
"""


def test_the_generator_redirects_moves_only() -> None:
    moved, other = glibc_compat.moved_functions(glibc_compat.parse_dynamic_symbols(LIBC_LISTING))
    assert moved == {
        "libpthread.so.0": {"pthread_create": "GLIBC_2.2.5"},
        "libdl.so.2": {"dlmopen": "GLIBC_2.3.4"},
        # Two compat versions: the newer was the default before the move.
        "librt.so.1": {"timer_create": "GLIBC_2.3.3"},
    }
    # Moved, but from libc itself or a library samattn does not use: left to the check.
    assert other == ["__libc_start_main", "ns_name_pack"]
    source, script = glibc_compat.stub_sources(moved["librt.so.1"])
    assert 'extern "C" void timer_create()' in source and "__builtin_trap" in source
    assert script == "GLIBC_2.3.3 { global: timer_create; local: *; };\n"


def test_the_check_reads_references_from_a_listing() -> None:
    listing = """
0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.2.5) pthread_create
0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.29) exp
0000000000000000      DO *UND*\t0000000000000000 (GLIBC_2.32) __libc_single_threaded
0000000000000000      DF *UND*\t0000000000000000 (GLIBCXX_3.4.29) _ZNSt6thread4joinEv
0000000000000000  w   D  *UND*\t0000000000000000  Base        __gmon_start__
"""
    symbols = glibc_compat.parse_dynamic_symbols(listing)
    assert glibc_compat.newer_imports(symbols, "2.28") == [
        "__libc_single_threaded@GLIBC_2.32",
        "exp@GLIBC_2.29",
    ]
    assert glibc_compat.newer_imports(symbols, "2.32") == []


# --------------------------------------------------------- the wheel gate ----


def test_the_wheel_gate_judges_the_tag_in_the_right_direction() -> None:
    """ci/check_wheel.py: a wheel may claim a tag newer than the oldest one its library
    allows (manylinux_2_28 for a library auditwheel finds manylinux_2_24), never older; and
    its own reading of the symbols names what the claimed tag does not allow."""
    sys.path.insert(0, str(ROOT / "ci"))
    try:
        check_wheel = _module(ROOT / "ci" / "check_wheel.py", "_samattn_check_wheel_glibc")
    finally:
        sys.path.remove(str(ROOT / "ci"))
    rank = check_wheel._policy_rank
    assert rank("manylinux_2_28_x86_64") >= rank("manylinux_2_24_x86_64")
    assert not rank("manylinux_2_28_x86_64") >= rank("manylinux_2_34_x86_64")
    allowed = check_wheel.policy_symbol_versions("manylinux_2_28_x86_64")
    if allowed is None:
        pytest.skip("auditwheel not installed")
    imported = [
        ("pthread_create", "GLIBC", "2.2.5"),
        ("dlopen", "GLIBC", "2.34"),
        ("_ZNSt6thread4joinEv", "GLIBCXX", "3.4.21"),
        ("_ZNSt3pmr15memory_resourceD2Ev", "GLIBCXX", "3.4.26"),
    ]
    assert check_wheel.newer_symbols(imported, allowed) == [
        "_ZNSt3pmr15memory_resourceD2Ev@GLIBCXX_3.4.26",
        "dlopen@GLIBC_2.34",
    ]
