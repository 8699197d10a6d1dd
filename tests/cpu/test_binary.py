"""What is inside the built library and wheel (CPU tier: no GPU needed).

The build writes ``build_info.json`` next to ``libsamattn.so`` (archs, kernel
families with their nvcc ``-gencode`` flags and translation-unit counts, op
groups). These tests compare it with the device code really embedded in the
library:

* the fatbin carries SASS for exactly the requested archs, and compute_80 PTX
  exactly when the sm80 family has code;
* every fatbin container (one per object file) was compiled with one family's
  flags, and every family that has sources has code;
* with cuobjdump (and nvdisasm) available: each kernel sits in the cubins of
  exactly its family's archs (sm80 kernels never in the sm_75 cubin, sm75
  kernels in every cubin from sm_75 up, so they can be forced on newer GPUs),
  and no kernel is a trap (CuTe compiles an atom the target arch lacks into
  printf + trap, silently);
* the wheel in dist/, if any, is under PyPI's default size limit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

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


# ------------------------------------------------------------- cuobjdump ----


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


def _cuobjdump(library: Path, *options: str, disassemble: bool = False) -> str:
    cuobjdump = _find_cuda_tool("cuobjdump")
    nvdisasm = _find_cuda_tool("nvdisasm") if disassemble else "unneeded"
    if cuobjdump is None or nvdisasm is None:
        pytest.skip(
            "cuobjdump (and nvdisasm for SASS) not found: pip install nvidia-cuda-cuobjdump "
            "nvidia-cuda-nvdisasm, or put a CUDA toolkit on PATH"
        )
    env = dict(os.environ)
    if disassemble:  # cuobjdump -sass runs nvdisasm from PATH
        env["PATH"] = f"{Path(nvdisasm).parent}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        [cuobjdump, *options, str(library)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, f"cuobjdump {options} failed: {result.stderr[-2000:]}"
    return result.stdout


@lru_cache(maxsize=4)
def _kernel_archs(library: Path) -> dict[str, set[str]]:
    """Kernel -> the archs ('sm_80', 'sm_90a') of the cubins that define it (from the
    cubins' symbol tables: fast, no disassembly)."""
    archs: dict[str, set[str]] = defaultdict(set)
    arch = None
    for line in _cuobjdump(library, "-symbols").splitlines():
        fields = line.split()
        if line.startswith("arch = "):
            arch = fields[-1]
        elif len(fields) >= 5 and fields[0] == "FUNC" and fields[3] == "ENTRY":
            archs[fields[-1]].add(arch)
    return archs


@lru_cache(maxsize=4)
def _ptx_kernels(library: Path) -> set[str]:
    ptx = _cuobjdump(library, "-ptx")
    return set(re.findall(r"^\.(?:visible\s+)?\.?entry\s+(\w+)", ptx, re.M))


def _sass_kernels(library: Path, arch: str) -> dict[str, list[str]]:
    """{kernel: [instruction, ...]} over the cubins of one arch."""
    kernels: dict[str, list[str]] = {}
    function = None
    for line in _cuobjdump(library, "-sass", "-arch", arch, disassemble=True).splitlines():
        stripped = line.strip()
        if stripped.startswith("Function : "):
            function = stripped.split(": ", 1)[1]
            kernels[function] = []
        elif function and (match := re.match(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", stripped)):
            kernels[function].append(match[1])
    return kernels


def _sass_arch_names(signature: Signature) -> set[str]:
    return {f"sm_{arch}{'a' if specific else ''}" for arch, specific in signature[0]}


def test_kernels_sit_in_their_familys_cubins(library: Path, build_info: dict) -> None:
    families = _families_with_code(build_info)
    kernel_archs = _kernel_archs(library)
    if not families:
        assert not kernel_archs
        return
    if not kernel_archs:
        # Seen with the CUDA 13.0 toolkit's cuobjdump (the GPU machine's) on compressed
        # fatbins: it lists no cubin symbols. The pip cuobjdump (13.2+) that CI uses does.
        pytest.skip("cuobjdump -symbols listed no kernels in this library's cubins")
    ptx_kernels = _ptx_kernels(library)
    problems = []
    if "sm80" in families:
        # Only the sm80 family embeds PTX, so its PTX entries name its kernels.
        assert ptx_kernels, "the sm80 family has sources but its PTX holds no kernel"
        expected = _sass_arch_names(families["sm80"])
        for name in ptx_kernels:
            if kernel_archs.get(name) != expected:
                problems.append(f"sm80 kernel {name} in {sorted(kernel_archs.get(name, ()))}")
    # The other families' lowest arch appears in no other family's cubins.
    lowest = {"sm75": "sm_75", "sm90": "sm_90a"}
    for family, arch in lowest.items():
        if family in families:
            expected = _sass_arch_names(families[family])
            for name, archs in kernel_archs.items():
                if arch in archs and (archs != expected or name in ptx_kernels):
                    problems.append(f"{family} kernel {name} in {sorted(archs)}")
    for name, archs in kernel_archs.items():
        if name not in ptx_kernels and not archs & set(lowest.values()):
            problems.append(f"kernel {name} of no family, in {sorted(archs)}")
    assert not problems, "\n".join(problems[:20])


def test_no_kernel_is_a_trap(library: Path, build_info: dict) -> None:
    # In a release build the only traps come from CuTe's CUTE_INVALID_CONTROL_PATH
    # (printf + trap where the target arch lacks an instruction: the classic result of
    # compiling an sm80 atom for sm75) or a stray __trap(). Such code comes from the
    # family's virtual arch, so one cubin arch per family shows it.
    families = _families_with_code(build_info)
    traps = []
    for signature in families.values():
        arch = min(_sass_arch_names(signature), key=lambda a: int(re.search(r"\d+", a)[0]))
        for name, instructions in _sass_kernels(library, arch).items():
            if any(i.startswith("BPT.TRAP") for i in instructions):
                real = [i for i in instructions if not i.startswith(("NOP", "BRA", "EXIT"))]
                traps.append(f"{arch} {name} ({len(real)} instructions)")
    assert not traps, "kernels containing a trap:\n" + "\n".join(traps[:20])


def test_sm90_gemm_runs_on_wgmma_and_tma(library: Path, build_info: dict) -> None:
    """The sm90 family is sm_90a SASS only, and every GEMM kernel in it issues wgmma
    (HGMMA) and TMA loads (UTMALDG): a kernel on mma.sync or plain loads would be on the
    slow path without failing any accuracy test."""
    families = _families_with_code(build_info)
    if "sm90" not in families:
        pytest.skip("this build has no sm90 family (90a is not among its archs)")
    assert _sass_arch_names(families["sm90"]) == {"sm_90a"}
    assert not families["sm90"][1], "the sm90 family must not embed PTX"
    kernels = _sass_kernels(library, "sm_90a")
    gemm = {name: ins for name, ins in kernels.items() if "GemmUniversal" in name}
    assert gemm, f"no GEMM kernel in the sm_90a cubins ({len(kernels)} kernels there)"
    lacking = [
        name[:120]
        for name, instructions in gemm.items()
        if not any(i.startswith("HGMMA") for i in instructions)
        or not any(i.startswith("UTMALDG") for i in instructions)
    ]
    assert not lacking, f"{len(lacking)} sm90 GEMM kernels without HGMMA or UTMALDG:\n" + "\n".join(
        lacking[:10]
    )


# ----------------------------------------------------------------- wheel ----


def test_wheel_is_under_the_pypi_size_limit() -> None:
    wheels = sorted((ROOT / "dist").glob("samattn*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        pytest.skip("no wheel in dist/")
    wheel = wheels[-1]
    size = wheel.stat().st_size
    print(f"\n{wheel.name}: {size / 2**20:.1f} MiB")
    assert size < PYPI_SIZE_LIMIT, f"{wheel.name} is {size / 2**20:.1f} MiB, PyPI allows 100 MiB"
