"""What is inside the built library and wheel (CPU tier: no GPU needed).

The build writes ``build_info.json`` next to ``libsamattn.so`` (archs, kernel
families with their nvcc ``-gencode`` flags and translation-unit counts, op
groups). These tests compare it with the device code really embedded in the
library:

* the fatbin carries SASS for exactly the requested archs, and compute_80 PTX
  exactly when the sm80 family has code;
* every fatbin container (one per object file) was compiled with one family's
  flags, and every family that has sources has code;
* with cuobjdump and nvdisasm available, from one disassembly of every cubin
  (cached per library): each kernel sits in the cubins of exactly its family's
  archs (sm80 kernels never in the sm_75 cubin, sm75 kernels in every cubin
  from sm_75 up, so they can be forced on newer GPUs), no function contains a
  trap (CuTe compiles an atom the target arch lacks into printf + trap,
  silently), and every sm90 GEMM and attention kernel issues wgmma and TMA loads;
* the wheel in dist/, if any, is under PyPI's default size limit.

The SASS checks are functions of a summary, and each is shown to fail on a
summary with a planted fault (test_checks_catch_planted_faults).
"""

from __future__ import annotations

import concurrent.futures
import errno
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import pytest

from samattn._fatbin import read_fatbin_archs

ROOT = Path(__file__).resolve().parents[2]
PYPI_SIZE_LIMIT = 100 * 2**20


def _library_path() -> Path:
    """$SAMATTN_LIBRARY, else the installed package's lib/libsamattn.so."""
    override = os.environ.get("SAMATTN_LIBRARY")
    if override:
        return Path(override).resolve()
    spec = importlib.util.find_spec("samattn")
    assert spec is not None and spec.submodule_search_locations, "samattn is not importable"
    return Path(next(iter(spec.submodule_search_locations))) / "lib" / "libsamattn.so"


LIBRARY = _library_path()
BUILD_INFO_PATH = LIBRARY.with_name("build_info.json")


@pytest.fixture(scope="module")
def library() -> Path:
    if not LIBRARY.is_file():
        pytest.fail(
            f"{LIBRARY} does not exist: build and install the wheel (nox -s build, nox -s tests) "
            "or set SAMATTN_LIBRARY"
        )
    return LIBRARY


@pytest.fixture(scope="module")
def build_info(library: Path) -> dict:
    if not BUILD_INFO_PATH.is_file():
        pytest.skip(f"no {BUILD_INFO_PATH.name} next to {library} (not built by this CMake)")
    return json.loads(BUILD_INFO_PATH.read_text())


@pytest.fixture(scope="module")
def fatbin(library: Path) -> dict:
    return read_fatbin_archs(library)


def _arch_number(arch: str) -> int:
    return int(re.match(r"\d+", arch)[0])


Signature = tuple[frozenset, frozenset]  # (SASS, PTX) sets of (arch, arch-specific)


def _family_signature(gencode: str) -> Signature:
    """'-gencode=arch=compute_80,code=[sm_80,sm_86,compute_80]' ->
    ({(80, False), (86, False)}, {(80, False)}): the (arch, arch-specific) pairs of
    the SASS and PTX entries that an object compiled with these flags carries."""
    sass, ptx = set(), set()
    for codes in re.findall(r",code=\[?([\w,]+)", gencode):
        for kind, number, suffix in re.findall(r"\b(sm|compute)_(\d+)([af]?)\b", codes):
            (sass if kind == "sm" else ptx).add((int(number), suffix == "a"))
    return frozenset(sass), frozenset(ptx)


def _describe(signature: Signature) -> str:
    """({(80, False), (90, True)}, {(80, False)}) -> 'sm_80,sm_90a + compute_80'."""
    names = [
        ",".join(f"{prefix}_{arch}{'a' if specific else ''}" for arch, specific in sorted(codes))
        for prefix, codes in zip(("sm", "compute"), signature)
    ]
    return " + ".join(n for n in names if n) or "nothing"


def _families_with_code(build_info: dict) -> dict[str, Signature]:
    if not build_info["ops"]:
        return {}
    return {
        family: _family_signature(flags)
        for family, flags in build_info["gencode"].items()
        if build_info["translation_units"].get(family, 0) > 0
    }


def _container_signatures(fatbin: dict) -> dict[int, Signature]:
    sass, ptx = defaultdict(set), defaultdict(set)
    for entry in fatbin["entries"]:
        kinds = sass if entry["kind"] == "sass" else ptx
        kinds[entry["container"]].add((entry["arch"], entry["arch_specific"]))
    containers = set(sass) | set(ptx)
    return {c: (frozenset(sass[c]), frozenset(ptx[c])) for c in containers}


# ------------------------------------------------------------ build info ----


def test_library_size_is_reported(library: Path, fatbin: dict) -> None:
    by_kind = defaultdict(int)
    for entry in fatbin["entries"]:
        by_kind[entry["kind"]] += entry["size"]
    print(
        f"\n{library}: {library.stat().st_size / 2**20:.1f} MiB; fatbin SASS "
        f"{by_kind['sass'] / 2**20:.1f} MiB for sm {fatbin['sass']}, PTX "
        f"{by_kind['ptx'] / 2**20:.1f} MiB for compute {fatbin['ptx']}, "
        f"{fatbin['containers']} containers"
    )
    assert library.stat().st_size > 0


def test_build_info_is_complete(build_info: dict) -> None:
    for key in ("version", "archs", "families", "ops", "gencode", "translation_units"):
        assert key in build_info, f"build_info.json lacks {key!r}"
    assert build_info["archs"], "no arch requested"
    assert set(build_info["gencode"]) == set(build_info["families"])


def test_build_info_version_matches_package(build_info: dict) -> None:
    from samattn._version import __version__

    assert build_info["version"] == __version__


# ---------------------------------------------------------------- fatbin ----


def test_fatbin_archs_match_the_build(build_info: dict, fatbin: dict) -> None:
    families = _families_with_code(build_info)
    if not families:
        assert fatbin["entries"] == [], "a build with no kernels has device code"
        return
    expected_sass = sorted({arch for sass, _ in families.values() for arch, _ in sass})
    expected_ptx = sorted({arch for _, ptx in families.values() for arch, _ in ptx})
    assert fatbin["sass"] == expected_sass
    assert fatbin["ptx"] == expected_ptx
    if "sm75" in families or "sm80" in families:
        # The portable families carry SASS for every requested arch.
        assert fatbin["sass"] == sorted({_arch_number(a) for a in build_info["archs"]})
    if "sm80" in families:
        assert fatbin["ptx"] == [80], "the sm80 family must embed compute_80 PTX for newer GPUs"
    arch_specific = {e["arch"] for e in fatbin["entries"] if e["arch_specific"]}
    assert arch_specific == ({90} if "sm90" in families else set())


def test_every_object_is_compiled_for_one_family(build_info: dict, fatbin: dict) -> None:
    families = _families_with_code(build_info)
    by_signature = {signature: family for family, signature in families.items()}
    containers = _container_signatures(fatbin)
    strays = sorted({_describe(s) for s in containers.values() if s not in by_signature})
    expected = {family: _describe(s) for family, s in families.items()}
    assert not strays, f"objects compiled with no family's flags: {strays}; families: {expected}"
    present = {by_signature[s] for s in containers.values()}
    missing = set(families) - present
    assert not missing, f"families with sources but no device code: {missing}"


# ------------------------------------------------------------------- SASS ----
# The SASS checks read one summary of the library's device code: per function of every
# cubin, its arch, whether it is a kernel (an entry), and the distinct opcodes it uses.
# nvdisasm takes about 0.3 s of a core per cubin, minutes for a full wheel: the summary
# disassembles each cubin once, as many at a time as there are cores, and is cached per
# library content, so that a rerun on the same library reads a JSON file.

SUMMARY_FORMAT = 1  # part of the cache key: bump when what a summary holds changes


class Function(NamedTuple):
    """One function of one cubin."""

    arch: str  # the cubin's: "sm_75", "sm_90a"
    name: str  # mangled
    entry: bool  # a kernel (__global__), not a device function
    instructions: int  # not counting NOP, BRA and EXIT
    opcodes: frozenset  # with modifiers, without predicates: {"HGMMA.64x128x16.F32.BF16", ...}


class SassSummary(NamedTuple):
    functions: list  # [Function, ...] of every cubin
    ptx_kernels: frozenset  # the entries of the embedded PTX
    cubins: dict  # {arch: number of cubins disassembled}


class Expected(NamedTuple):
    """What the build says the library holds."""

    families: dict  # {family: Signature} of the families with code
    cubins: dict  # {arch: number of SASS entries in the fatbin}
    ops: frozenset = frozenset({"gemm", "softmax", "attention"})  # the op groups built


def _find_cuda_tool(name: str) -> str | None:
    """On PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin, or from NVIDIA's pip wheels."""
    found = shutil.which(name)
    if found:
        return found
    candidates = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / name]
    for folder in sys.path:  # site-packages, a virtualenv's and the system's
        if folder and Path(folder).is_dir():
            candidates += sorted(Path(folder).glob(f"nvidia/*/bin/{name}"))
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


# Starting a process can fail for a moment under memory pressure, or in a sandbox while
# other threads run (seen as EFAULT, "Bad address", from exec on CI machines).
_TRANSIENT_START_ERRORS = (errno.EFAULT, errno.EAGAIN, errno.ENOMEM)


def _run(*command: str, cwd: str | None = None) -> str:
    for attempt in range(5):
        try:
            result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=1800)
            break
        except OSError as error:
            if error.errno not in _TRANSIENT_START_ERRORS or attempt == 4:
                raise
            time.sleep(0.5 * 2**attempt)
    assert result.returncode == 0, f"{' '.join(command)} failed: {result.stderr[-2000:]}"
    return result.stdout


_TARGET = re.compile(r"^\s*\.target\s+(sm_\w+)", re.M)
_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)", re.M)
# "/*0120*/  @!P0 BPT.TRAP 0x1 ;" -> "BPT.TRAP"
_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P(?:T|\d+)\s+)?([A-Z][\w.]*)")
_NOT_COUNTED = ("NOP", "BRA", "EXIT")


# Cubins of the older ELF format (CUDA 12.4's) have no .target line in nvdisasm's output:
# their arch is in the header flags, EF_CUDA_ACCELERATORS marking an arch-specific one.
_HEADER_FLAGS = re.compile(r'^\s*\.headerflags\s+@"([^"]*)"', re.M)
_HEADER_ARCH = re.compile(r"\bEF_CUDA_SM(\d+)\b")


def _cubin_arch(text: str) -> str:
    target = _TARGET.search(text)
    if target:
        return target[1]
    flags = _HEADER_FLAGS.search(text)
    arch = _HEADER_ARCH.search(flags[1]) if flags else None
    assert arch, "nvdisasm output with neither a .target line nor an EF_CUDA_SM header flag"
    return f"sm_{arch[1]}" + ("a" if "EF_CUDA_ACCELERATORS" in flags[1].split() else "")


def parse_nvdisasm(text: str) -> tuple[str, list[Function]]:
    """The arch and the functions of one cubin, from `nvdisasm -c` output."""
    arch = _cubin_arch(text)
    headers = list(_SECTION.finditer(text))
    functions = []
    for header, following in zip(headers, [*headers[1:], None]):
        name = header[1]
        body = text[header.end() : following.start() if following else len(text)]
        opcodes = _OPCODE.findall(body)
        entry = re.search(rf"\.other\s+{re.escape(name)},\s*@\"[^\"]*STO_CUDA_ENTRY", body)
        counted = sum(not op.startswith(_NOT_COUNTED) for op in opcodes)
        functions.append(Function(arch, name, entry is not None, counted, frozenset(opcodes)))
    return arch, functions


def _cores() -> int:
    """The cores this process may run on (a container's share, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def summarize_sass(library: Path, workers: int | None = None) -> SassSummary:
    """Disassembles every cubin of the library (cuobjdump -xelf, then nvdisasm on each, as
    many at a time as there are cores) and lists the PTX kernels. Skips the calling test
    without the CUDA tools."""
    cuobjdump, nvdisasm = _find_cuda_tool("cuobjdump"), _find_cuda_tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        pytest.skip(
            "cuobjdump and nvdisasm not found: pip install nvidia-cuda-cuobjdump "
            "nvidia-cuda-nvdisasm, or put a CUDA toolkit on PATH"
        )

    def disassemble(cubin: Path) -> tuple[str, list[Function]]:
        # -ndf: no dataflow analysis, which only annotates branch targets.
        return parse_nvdisasm(_run(nvdisasm, "-c", "-ndf", str(cubin)))

    def ptx_kernels() -> frozenset:
        ptx = _run(cuobjdump, "-ptx", str(library))
        return frozenset(re.findall(r"^\.(?:visible\s+)?\.?entry\s+(\w+)", ptx, re.M))

    with tempfile.TemporaryDirectory(prefix="samattn-cubins-") as folder:
        _run(cuobjdump, "-xelf", "all", str(library), cwd=folder)
        # Largest first, so that no big cubin starts last and runs alone.
        cubins = sorted(Path(folder).glob("*.cubin"), key=lambda c: -c.stat().st_size)
        for cubin in cubins:
            with open(cubin, "rb") as f:
                assert f.read(4) == b"\x7fELF", (
                    f"{cuobjdump} -xelf wrote {cubin.name}, which is no ELF file (still "
                    "compressed?): try the pinned pip tools of ci/requirements-dev.txt"
                )
        with concurrent.futures.ThreadPoolExecutor(workers or _cores()) as pool:
            ptx = pool.submit(ptx_kernels)
            parts = list(pool.map(disassemble, cubins))
            counts: dict[str, int] = defaultdict(int)
            for arch, _ in parts:
                counts[arch] += 1
            functions = [f for _, part in parts for f in part]
            return SassSummary(functions, ptx.result(), dict(counts))


def _content_key(path: Path) -> str:
    digest = hashlib.sha256(f"summary format {SUMMARY_FORMAT}\n".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()[:32]


def cached_sass_summary(library: Path, folder: Path) -> SassSummary:
    """summarize_sass, read from or written to folder/<hash of the library's bytes>.json.

    One process at a time makes it (a lock file): pytest-xdist workers that all start it
    wait for the first and read its file, instead of each disassembling on every core."""
    path = folder / f"{_content_key(library)}.json"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            data = json.loads(path.read_text())
            functions = [Function(*f[:4], frozenset(f[4])) for f in data["functions"]]
            return SassSummary(functions, frozenset(data["ptx_kernels"]), data["cubins"])
        return _write_sass_summary(library, path)


def _write_sass_summary(library: Path, path: Path) -> SassSummary:
    summary = summarize_sass(library)
    data = {
        "library": str(library),
        "functions": [[*f[:4], sorted(f.opcodes)] for f in summary.functions],
        "ptx_kernels": sorted(summary.ptx_kernels),
        "cubins": summary.cubins,
    }
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(data))
    partial.replace(path)  # atomic: a concurrent run reads no half-written file
    return summary


def _cache_folder(config: pytest.Config) -> Path:
    """Under pytest's cache folder, or the temp folder when the cache plugin is off (as in
    ci/gpu_session.sh)."""
    cache = getattr(config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir("samattn-sass"))
    folder = Path(tempfile.gettempdir()) / "samattn-test-cache" / "sass"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


_started: dict[Path, concurrent.futures.Future] = {}


def start_sass_summary(config: pytest.Config) -> None:
    """Starts making the summary in a background thread. tests/conftest.py calls it once the
    tests are collected and runs the tests that read it last, so that the disassembly
    (mostly other processes, on the other cores) overlaps the rest of the session."""
    if LIBRARY.is_file() and LIBRARY not in _started:
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sass-summary")
        _started[LIBRARY] = pool.submit(cached_sass_summary, LIBRARY, _cache_folder(config))
        pool.shutdown(wait=False)


@pytest.fixture(scope="module")
def sass(library: Path, pytestconfig: pytest.Config) -> SassSummary:
    """The library's SASS summary (a skip or failure while making it is this fixture's)."""
    started = _started.get(library)
    if started is not None:
        return started.result()
    return cached_sass_summary(library, _cache_folder(pytestconfig))


def _sass_arch_name(arch: int, specific: bool) -> str:
    return f"sm_{arch}{'a' if specific else ''}"


def _sass_arch_names(signature: Signature) -> set[str]:
    return {_sass_arch_name(arch, specific) for arch, specific in signature[0]}


@pytest.fixture(scope="module")
def expected(build_info: dict, fatbin: dict) -> Expected:
    cubins: dict[str, int] = defaultdict(int)
    for entry in fatbin["entries"]:
        if entry["kind"] == "sass":
            cubins[_sass_arch_name(entry["arch"], entry["arch_specific"])] += 1
    return Expected(_families_with_code(build_info), dict(cubins), frozenset(build_info["ops"]))


def coverage_problems(expected: Expected, sass: SassSummary) -> list[str]:
    """Cubins of the fatbin that were not disassembled (the checks would not see them)."""
    if sass.cubins != expected.cubins:
        return [f"disassembled cubins {sass.cubins}, the fatbin has {expected.cubins}"]
    return []


def placement_problems(expected: Expected, sass: SassSummary) -> list[str]:
    """Kernels outside exactly their family's cubins: sm80 kernels never in the sm_75
    cubin, sm75 kernels in every cubin from sm_75 up (so they can be forced on newer
    GPUs), and no kernel of no family."""
    families = expected.families
    kernel_archs: dict[str, set[str]] = defaultdict(set)
    for function in sass.functions:
        if function.entry:
            kernel_archs[function.name].add(function.arch)
    if not families:
        return [f"kernel {name} in a build without kernels" for name in kernel_archs]
    problems = []
    if "sm80" in families:
        # Only the sm80 family embeds PTX, so its PTX entries name its kernels.
        if not sass.ptx_kernels:
            problems.append("the sm80 family has sources but its PTX holds no kernel")
        archs = _sass_arch_names(families["sm80"])
        for name in sorted(sass.ptx_kernels):
            if kernel_archs.get(name) != archs:
                problems.append(f"sm80 kernel {name} in {sorted(kernel_archs.get(name, ()))}")
    # The other families' lowest arch appears in no other family's cubins.
    lowest = {"sm75": "sm_75", "sm90": "sm_90a"}
    for family, arch in lowest.items():
        if family in families:
            archs = _sass_arch_names(families[family])
            for name, found in sorted(kernel_archs.items()):
                if arch in found and (found != archs or name in sass.ptx_kernels):
                    problems.append(f"{family} kernel {name} in {sorted(found)}")
    for name, found in sorted(kernel_archs.items()):
        if name not in sass.ptx_kernels and not found & set(lowest.values()):
            problems.append(f"kernel {name} of no family, in {sorted(found)}")
    return problems


def trap_problems(expected: Expected, sass: SassSummary) -> list[str]:
    """Functions of any cubin that contain a trap. In a release build the only traps come
    from CuTe's CUTE_INVALID_CONTROL_PATH (printf + trap where the target arch lacks an
    instruction: the classic result of compiling an sm80 atom for sm75) or a stray
    __trap()."""
    return [
        f"{f.arch} {f.name} ({f.instructions} instructions)"
        for f in sass.functions
        if any(op.startswith("BPT.TRAP") for op in f.opcodes)
    ]


def _wgmma_and_tma_problems(
    expected: Expected, sass: SassSummary, op: str, marker: str, what: str
) -> list[str]:
    """With an sm90 family that built `op`: its sm_90a kernels (names containing `marker`)
    without wgmma (HGMMA) or TMA loads (UTMALDG), or none in the sm_90a cubins at all."""
    if "sm90" not in expected.families or op not in expected.ops:
        return []
    kernels = [f for f in sass.functions if f.arch == "sm_90a" and f.entry]
    found = [f for f in kernels if marker in f.name]
    if not found:
        return [f"no {what} kernel in the sm_90a cubins ({len(kernels)} kernels there)"]
    return [
        f"{f.name[:120]} without {'HGMMA' if has_tma else 'UTMALDG'}"
        for f in found
        if not (
            (has_tma := any(op.startswith("UTMALDG") for op in f.opcodes))
            and any(op.startswith("HGMMA") for op in f.opcodes)
        )
    ]


def sm90_gemm_problems(expected: Expected, sass: SassSummary) -> list[str]:
    """With an sm90 family: sm_90a GEMM kernels (CUTLASS's GemmUniversal) without wgmma
    (HGMMA) or TMA loads (UTMALDG), or no GEMM kernel in the sm_90a cubins at all."""
    return _wgmma_and_tma_problems(expected, sass, "gemm", "GemmUniversal", "GEMM")


def sm90_attention_problems(expected: Expected, sass: SassSummary) -> list[str]:
    """With an sm90 family: sm_90a attention forward kernels (those of a FlashFwdSm90Config,
    whose name the mangled kernel name carries) without wgmma or TMA loads, or none."""
    return _wgmma_and_tma_problems(
        expected, sass, "attention", "FlashFwdSm90Config", "attention forward"
    )


def test_every_cubin_is_disassembled(expected: Expected, sass: SassSummary) -> None:
    assert not coverage_problems(expected, sass)
    print(f"\n{sum(sass.cubins.values())} cubins {sass.cubins}, {len(sass.functions)} functions")


def test_kernels_sit_in_their_familys_cubins(expected: Expected, sass: SassSummary) -> None:
    problems = placement_problems(expected, sass)
    assert not problems, "\n".join(problems[:20])


def test_no_kernel_is_a_trap(expected: Expected, sass: SassSummary) -> None:
    traps = trap_problems(expected, sass)
    assert not traps, "functions containing a trap:\n" + "\n".join(traps[:20])


def test_sm90_gemm_runs_on_wgmma_and_tma(expected: Expected, sass: SassSummary) -> None:
    """The sm90 family is sm_90a SASS only, and every GEMM kernel in it issues wgmma
    (HGMMA) and TMA loads (UTMALDG): a kernel on mma.sync or plain loads would be on the
    slow path without failing any accuracy test."""
    families = expected.families
    if "sm90" not in families:
        pytest.skip("this build has no sm90 family (90a is not among its archs)")
    assert _sass_arch_names(families["sm90"]) == {"sm_90a"}
    assert not families["sm90"][1], "the sm90 family must not embed PTX"
    problems = sm90_gemm_problems(expected, sass)
    assert not problems, f"{len(problems)} sm90 GEMM problems:\n" + "\n".join(problems[:10])


def test_sm90_attention_runs_on_wgmma_and_tma(expected: Expected, sass: SassSummary) -> None:
    """Every sm90 attention forward kernel issues wgmma (HGMMA) and TMA loads (UTMALDG), as
    the sm90 GEMM's do."""
    if "sm90" not in expected.families or "attention" not in expected.ops:
        pytest.skip("this build has no sm90 attention (90a or attention not built)")
    problems = sm90_attention_problems(expected, sass)
    assert not problems, f"{len(problems)} sm90 attention problems:\n" + "\n".join(problems[:10])


# The checks above on planted faults: each must fail where the library would be wrong.
EXPECTED = Expected(
    {
        "sm75": _family_signature("-gencode=arch=compute_75,code=[sm_75,sm_90]"),
        "sm80": _family_signature("-gencode=arch=compute_80,code=[sm_90,compute_80]"),
        "sm90": _family_signature("-gencode=arch=compute_90a,code=[sm_90a]"),
    },
    {"sm_75": 1, "sm_90": 2, "sm_90a": 1},
)
CHECKS = {
    "coverage": coverage_problems,
    "placement": placement_problems,
    "traps": trap_problems,
    "sm90 gemm": sm90_gemm_problems,
    "sm90 attention": sm90_attention_problems,
}


def _function(arch: str, name: str, *opcodes: str, entry: bool = True) -> Function:
    return Function(arch, name, entry, len(opcodes), frozenset(opcodes))


def _good_summary() -> SassSummary:
    """What a library built as EXPECTED that passes every check could look like."""
    functions = [
        _function("sm_75", "softmax75", "FADD", "EXIT"),
        _function("sm_90", "softmax75", "FADD", "EXIT"),
        _function("sm_90", "gemm80", "HMMA.16816.F32", "LDGSTS.E.BYPASS.128"),
        _function("sm_90", "helper", "FMUL", entry=False),
        _function("sm_90a", "GemmUniversal90", "HGMMA.64x128x16.F32", "UTMALDG.2D"),
        _function(
            "sm_90a", "flash_fwd_sm90<FlashFwdSm90Config>", "HGMMA.64x128x16.F32", "UTMALDG.4D"
        ),
    ]
    return SassSummary(functions, frozenset({"gemm80"}), {"sm_75": 1, "sm_90": 2, "sm_90a": 1})


def _without(summary: SassSummary, arch: str, name: str) -> SassSummary:
    kept = [f for f in summary.functions if (f.arch, f.name) != (arch, name)]
    return summary._replace(functions=kept)


def _with(summary: SassSummary, *functions: Function) -> SassSummary:
    return summary._replace(functions=[*summary.functions, *functions])


def test_checks_pass_a_good_summary() -> None:
    for name, check in CHECKS.items():
        assert check(EXPECTED, _good_summary()) == [], name


GOOD = _good_summary()
PLANTED = {
    # cuobjdump extracted fewer cubins than the fatbin has (the checks would see nothing)
    "cubin missing": (GOOD._replace(cubins={"sm_75": 1, "sm_90": 1, "sm_90a": 1}), "coverage"),
    "arch missing": (GOOD._replace(cubins={"sm_75": 1, "sm_90": 2}), "coverage"),
    # an sm80 kernel in the sm_75 cubin (sm80 atoms compiled for sm75 become traps)
    "sm80 kernel in sm_75": (_with(GOOD, _function("sm_75", "gemm80", "HMMA")), "placement"),
    # an sm75 kernel missing from a newer cubin cannot be forced on that GPU
    "sm75 kernel not in sm_90": (_without(GOOD, "sm_90", "softmax75"), "placement"),
    "sm80 kernel without SASS": (_without(GOOD, "sm_90", "gemm80"), "placement"),
    "kernel of no family": (_with(GOOD, _function("sm_90", "stray", "FADD")), "placement"),
    "no PTX kernel": (GOOD._replace(ptx_kernels=frozenset()), "placement"),
    "trap in a kernel": (
        _with(_without(GOOD, "sm_75", "softmax75"), _function("sm_75", "softmax75", "BPT.TRAP")),
        "traps",
    ),
    "trap in a device function": (
        _with(GOOD, _function("sm_90", "helper2", "BPT.TRAP", entry=False)),
        "traps",
    ),
    "sm90 gemm on mma.sync": (
        _with(GOOD, _function("sm_90a", "GemmUniversalX", "HMMA.16816.F32", "UTMALDG.2D")),
        "sm90 gemm",
    ),
    "sm90 gemm without TMA": (
        _with(GOOD, _function("sm_90a", "GemmUniversalY", "HGMMA.64x64x16.F32", "LDG.E")),
        "sm90 gemm",
    ),
    "no sm90 gemm": (_without(GOOD, "sm_90a", "GemmUniversal90"), "sm90 gemm"),
    "sm90 attention on mma.sync": (
        _with(GOOD, _function("sm_90a", "fwd<FlashFwdSm90ConfigX>", "HMMA.16816.F32", "UTMALDG")),
        "sm90 attention",
    ),
    "sm90 attention without TMA": (
        _with(GOOD, _function("sm_90a", "fwd<FlashFwdSm90ConfigY>", "HGMMA.64x64x16.F32", "LDG")),
        "sm90 attention",
    ),
    "no sm90 attention": (
        _without(GOOD, "sm_90a", "flash_fwd_sm90<FlashFwdSm90Config>"),
        "sm90 attention",
    ),
}


@pytest.mark.parametrize("fault", PLANTED)
def test_checks_catch_planted_faults(fault: str) -> None:
    summary, failing = PLANTED[fault]
    for name, check in CHECKS.items():
        problems = check(EXPECTED, summary)
        assert bool(problems) == (name == failing), (name, problems)


NVDISASM_SAMPLE = """\
\t.target\tsm_90a
\t.section\t.text._Z6kernelPf,"ax",@progbits
\t.other\t_Z6kernelPf,@"STO_CUDA_ENTRY STV_DEFAULT"
_Z6kernelPf:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/              @!P0 BPT.TRAP 0x1 ;
        /*0020*/                   HGMMA.64x128x16.F32.BF16 gdesc[UR4], RZ, !UPT ;
        /*0030*/                   EXIT ;
\t.section\t.text._Z6helperv,"ax",@progbits
\t.other\t_Z6helperv,@"STV_DEFAULT"
        /*0000*/              @UP0 UTMALDG.2D [UR8], [UR4] ;
        /*0010*/                   NOP ;
"""


def test_parse_nvdisasm() -> None:
    arch, (kernel, helper) = parse_nvdisasm(NVDISASM_SAMPLE)
    assert arch == "sm_90a"
    opcodes = {"MOV", "BPT.TRAP", "HGMMA.64x128x16.F32.BF16", "EXIT"}
    assert kernel == Function("sm_90a", "_Z6kernelPf", True, 3, frozenset(opcodes))
    assert helper == Function("sm_90a", "_Z6helperv", False, 1, frozenset({"UTMALDG.2D", "NOP"}))


# The older ELF format (CUDA 12.4's cubins) as nvdisasm 13 prints it: no .target line.
_OLD_FORMAT = '\t.headerflags\t@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS {}"\n'


@pytest.mark.parametrize(
    ("flags", "arch"),
    [
        ("EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)", "sm_90a"),
        ("EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM80)", "sm_90"),
        ("EF_CUDA_SM75 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM75)", "sm_75"),
    ],
)
def test_parse_nvdisasm_of_the_older_elf_format(flags: str, arch: str) -> None:
    text = _OLD_FORMAT.format(flags) + NVDISASM_SAMPLE.split("\n", 1)[1]
    parsed, (kernel, _) = parse_nvdisasm(text)
    assert parsed == arch and kernel.arch == arch


# ----------------------------------------------------------------- wheel ----


def test_wheel_is_under_the_pypi_size_limit() -> None:
    wheels = sorted((ROOT / "dist").glob("samattn*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        pytest.skip("no wheel in dist/")
    wheel = wheels[-1]
    size = wheel.stat().st_size
    print(f"\n{wheel.name}: {size / 2**20:.1f} MiB")
    assert size < PYPI_SIZE_LIMIT, f"{wheel.name} is {size / 2**20:.1f} MiB, PyPI allows 100 MiB"
