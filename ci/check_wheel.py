"""Checks a samattn variant wheel before it is published (no GPU needed).

    python ci/check_wheel.py dist/samattn_cu130-0.1.0-py3-none-manylinux_2_28_x86_64.whl
    python ci/check_wheel.py WHEEL --release     the publishing gate (see below)
    python ci/check_wheel.py WHEEL --ci          CI's own small wheel (see below)

One line per check (ok, WARN or FAIL); exits 1 if any failed. The variant is read from
the distribution name (samattn_cu130 -> cu130) and compared with ci/variants.toml. What the
library should contain is read from the build itself (samattn/lib/build_info.json, written
by cpp/cmake/build_info.cmake), never from a list kept here:

  name, metadata  samattn-<variant>, the version of samattn/_version.py, requires torch and
                  no CUDA package, Python >= 3.9, tag py3-none-<platform>, PEP 639 license
  contents        the package, libsamattn.so and build_info.json, nothing grafted in
  licenses        LICENSE and NOTICE in .dist-info/licenses, CUTLASS's license in samattn/lib
  sbom            .dist-info/sboms/samattn.cdx.json (PEP 770) names what build_info says:
                  CUTLASS, CUDA runtime and nvcc versions, archs
  size            under PyPI's default limit (100 MiB)
  build info      the release list: the variant's archs and CUDA toolkit, every op group and
                  attention head dim the build knows (its known_ops, known_head_dims); the
                  families the archs imply
  fatbin          each kernel family has SASS for exactly the built archs, compute_80 PTX for
                  GPUs newer than the wheel, and every object was compiled for one family
  cuobjdump       the same, from NVIDIA's tool: cubins and PTX listed per arch, each
                  kernel in exactly its family's cubins, every sm80 kernel also as PTX,
                  and no kernel that is a trap (an instruction the arch lacks)
  dependencies    DT_NEEDED within the manylinux policy; no CUDA library (the runtime is
                  static, the driver is dlopen()ed), no RPATH
  symbols         no glibc, libstdc++ or libgcc symbol version newer than the wheel's
                  manylinux tag allows (auditwheel's policy), read from the library with
                  objdump; each newer one is listed (pthread_create@GLIBC_2.34 is what a
                  build on glibc >= 2.34 without cpp/cmake/glibc_compat.cmake imports)
  auditwheel      `auditwheel show` finds the tag no newer than the wheel's

--release makes the table's platform tag and the tools (cuobjdump, nvdisasm, auditwheel,
objdump) mandatory; without it a newer manylinux tag and a missing tool are warnings.
--ci checks everything but the release list (archs, op groups, head dims: a subset is
built), with the tag and the tools mandatory: CI runs it on the wheel it builds, so that
the gate itself is exercised on every change.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "ci"))
import variants  # noqa: E402

PYPI_SIZE_LIMIT = 100 * 2**20
# What libsamattn may link besides these: nothing. No CUDA library, no libtorch, no Python.
# CUTLASS's BSD-3-Clause license, copied into the wheel by CMakeLists.txt (NOTICE).
CUTLASS_LICENSE = "samattn/lib/licenses/CUTLASS-LICENSE.txt"
ALLOWED_NEEDED = {
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "librt.so.1",
    "libpthread.so.0",
    "libstdc++.so.6",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
}
# Libraries the NVIDIA driver provides: never grafted into the wheel (auditwheel --exclude).
DRIVER_LIBRARIES = ["libcuda.so.1", "libnvidia-*.so*", "libnvrtc*.so*"]


def _load_fatbin_reader():
    spec = importlib.util.spec_from_file_location("_fatbin", ROOT / "samattn" / "_fatbin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_fatbin_archs


class Report:
    def __init__(self, mode: str) -> None:
        self.mode = mode  # "release", "ci" or "" (a wheel built by hand)
        self.release = mode == "release"
        self.failed = 0

    def ok(self, check: str, detail: str) -> None:
        print(f"ok    {check:13} {detail}")

    def fail(self, check: str, detail: str) -> None:
        self.failed += 1
        print(f"FAIL  {check:13} {detail}")

    def warn(self, check: str, detail: str) -> None:
        print(f"WARN  {check:13} {detail}")

    def expect(self, check: str, condition: bool, detail: str) -> None:
        (self.ok if condition else self.fail)(check, detail)

    def missing_tool(self, check: str, detail: str) -> None:
        (self.fail if self.mode in ("release", "ci") else self.warn)(check, detail)


def find_tool(name: str) -> str | None:
    """On PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin, or from NVIDIA's pip wheels."""
    found = shutil.which(name)
    if found:
        return found
    candidates = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / name]
    for folder in sys.path:
        if folder and Path(folder).is_dir():
            candidates += sorted(Path(folder).glob(f"nvidia/*/bin/{name}"))
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def arch_number(arch: str) -> int:
    return int(re.match(r"\d+", arch)[0])


def family_signature(gencode: str) -> tuple[frozenset, frozenset]:
    """'-gencode=arch=compute_80,code=[sm_80,sm_86,compute_80]' -> ({sm_80, sm_86},
    {compute_80}) as (number, arch-specific) pairs."""
    sass, ptx = set(), set()
    for codes in re.findall(r",code=\[?([\w,]+)", gencode):
        for kind, number, suffix in re.findall(r"\b(sm|compute)_(\d+)([af]?)\b", codes):
            (sass if kind == "sm" else ptx).add((int(number), suffix == "a"))
    return frozenset(sass), frozenset(ptx)


def cubin_names(signature: tuple[frozenset, frozenset]) -> set[str]:
    return {f"sm_{arch}{'a' if specific else ''}" for arch, specific in signature[0]}


# ------------------------------------------------------------------ checks ----


def check_metadata(report: Report, wheel: Path, zf: zipfile.ZipFile, variant: dict) -> None:
    stem, version, python_tag, abi_tag, platform = wheel.name[: -len(".whl")].split("-")
    expected_version = re.search(
        r'__version__ = "([^"]+)"', (ROOT / "samattn" / "_version.py").read_text()
    )[1]
    report.expect("name", stem == f"samattn_{variant['name']}", f"distribution {stem}")
    report.expect(
        "version", version == expected_version, f"{version} (_version.py: {expected_version})"
    )
    report.expect(
        "tag",
        (python_tag, abi_tag) == (variant["python_tag"], "none"),
        f"{python_tag}-{abi_tag}: one wheel for every CPython >= 3.9",
    )
    if platform == variant["platform"]:
        report.ok("platform", platform)
    elif report.mode in ("release", "ci"):
        report.fail("platform", f"{platform}, the table says {variant['platform']}")
    else:
        report.warn(
            "platform",
            f"{platform}, the release is {variant['platform']} (ci/repair_wheel.py sets it; "
            "the symbols line says what a newer tag needs)",
        )

    info = f"samattn_{variant['name']}-{version}.dist-info"
    metadata = zf.read(f"{info}/METADATA").decode()
    fields = defaultdict(list)
    for line in metadata.split("\n\n", 1)[0].splitlines():
        if ": " in line:
            key, value = line.split(": ", 1)
            fields[key].append(value)
    requires = fields["Requires-Dist"]
    runtime_requires = [r for r in requires if "extra ==" not in r]
    cuda_requires = [r for r in requires if re.match(r"(nvidia|cuda)", r, re.I)]
    report.expect(
        "license",
        fields["License-Expression"] == ["BSD-3-Clause"]
        and sorted(fields["License-File"]) == ["LICENSE", "NOTICE"],
        f"License-Expression {fields['License-Expression']}, "
        f"License-File {fields['License-File']} (PEP 639)",
    )
    report.expect(
        "metadata",
        fields["Name"] == [variant["distribution"]]
        and fields["Version"] == [version]
        and fields["Requires-Python"] == [">=3.9"]
        and [r.replace(" ", "") for r in runtime_requires] == ["torch>=2.4"]
        and not cuda_requires,
        f"Name {fields['Name']}, Requires-Python {fields['Requires-Python']}, "
        f"Requires-Dist {requires}",
    )
    wheel_file = zf.read(f"{info}/WHEEL").decode()
    report.expect(
        "WHEEL",
        "Root-Is-Purelib: false" in wheel_file
        and f"Tag: {python_tag}-{abi_tag}-{platform}" in wheel_file,
        "Root-Is-Purelib false, Tag matches the file name",
    )


def check_contents(report: Report, wheel: Path, zf: zipfile.ZipFile) -> None:
    names = set(zf.namelist())
    needed = {
        "samattn/__init__.py",
        "samattn/_variant.py",
        "samattn/lib/libsamattn.so",
        "samattn/lib/build_info.json",
    }
    missing = sorted(needed - names)
    report.expect(
        "contents", not missing, f"{len(names)} files" + (f"; missing {missing}" if missing else "")
    )
    shared = sorted(n for n in names if re.search(r"\.so(\.|$)", n))
    report.expect(
        "libraries",
        shared == ["samattn/lib/libsamattn.so"],
        f"shared libraries {shared} (nothing grafted by auditwheel)",
    )
    strays = sorted(n for n in names if not n.startswith(("samattn/", "samattn_")))
    report.expect(
        "layout",
        not strays,
        "only the samattn package and its .dist-info" + (f"; also {strays}" if strays else ""),
    )
    size = wheel.stat().st_size
    report.expect("size", size < PYPI_SIZE_LIMIT, f"{size / 2**20:.1f} MiB (PyPI: 100 MiB)")


def dist_info(zf: zipfile.ZipFile) -> str:
    return next(n.split("/")[0] for n in zf.namelist() if n.split("/")[0].endswith(".dist-info"))


def check_licenses(report: Report, zf: zipfile.ZipFile) -> None:
    names = set(zf.namelist())
    info = dist_info(zf)
    wanted = [f"{info}/licenses/LICENSE", f"{info}/licenses/NOTICE", CUTLASS_LICENSE]
    missing = [n for n in wanted if n not in names]
    cutlass = zf.read(CUTLASS_LICENSE).decode(errors="replace") if CUTLASS_LICENSE in names else ""
    notice = zf.read(wanted[1]).decode(errors="replace") if wanted[1] in names else ""
    report.expect(
        "licenses",
        not missing
        and "NVIDIA CORPORATION" in cutlass
        and "Redistribution and use" in cutlass
        and "CUTLASS" in notice,
        f"LICENSE, NOTICE (names CUTLASS), {CUTLASS_LICENSE}"
        + (f"; missing {missing}" if missing else ""),
    )


def check_sbom(report: Report, zf: zipfile.ZipFile, build_info: dict) -> None:
    path = f"{dist_info(zf)}/sboms/samattn.cdx.json"
    if path not in zf.namelist():
        report.fail("sbom", f"no {path} (PEP 770)")
        return
    try:
        sbom = json.loads(zf.read(path))
    except ValueError as error:
        report.fail("sbom", f"{path}: not JSON ({error})")
        return
    components = {c["bom-ref"]: c for c in sbom.get("components", [])}
    tools = {t["name"]: t for t in sbom.get("metadata", {}).get("tools", {}).get("components", [])}
    properties = {
        p["name"]: p["value"]
        for p in sbom.get("metadata", {}).get("component", {}).get("properties", [])
    }
    found = {
        "CUTLASS": components.get("cutlass", {}).get("version"),
        "CUDA runtime": components.get("cudart_static", {}).get("version"),
        "nvcc": tools.get("nvcc", {}).get("version"),
        "archs": properties.get("samattn:cuda_archs"),
    }
    built = {
        "CUTLASS": build_info.get("cutlass_version"),
        "CUDA runtime": build_info.get("cuda_toolkit_version"),
        "nvcc": build_info.get("nvcc_version"),
        "archs": ",".join(build_info["archs"]),
    }
    wrong = [f"{k} {found[k]} (built {built[k]})" for k in built if found[k] != built[k]]
    report.expect(
        "sbom",
        sbom.get("bomFormat") == "CycloneDX" and not wrong,
        f"{path}: "
        + ", ".join(f"{k} {v}" for k, v in found.items())
        + (f"; differs from build_info: {wrong}" if wrong else ""),
    )


def implied_families(archs: list[str]) -> list[str]:
    """The kernel families cpp/cmake/families.cmake builds for these archs."""
    numbers = [(arch_number(a), a.endswith("a")) for a in archs]
    families = ["sm75"] if any(n == 75 for n, _ in numbers) else []
    if any(n >= 80 for n, _ in numbers):
        families.append("sm80")
    if (90, True) in numbers:
        families.append("sm90")
    return families


def known_from_cmake(setting: str) -> list[str]:
    """`set(SETTING a b c)` of this checkout's CMakeLists.txt: the full lists of a build
    whose build_info.json predates known_ops / known_head_dims."""
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(rf"set\({setting} ([^)]*)\)", text)[1].split()


def check_build_info(report: Report, build_info: dict, variant: dict) -> None:
    built_archs = build_info["archs"]
    if report.mode == "ci":
        report.ok("archs", f"built {';'.join(built_archs)} (--ci: the release list is not checked)")
    else:
        report.expect(
            "archs",
            built_archs == variant["archs"].split(";"),
            f"built {';'.join(built_archs)}, table {variant['archs']}",
        )
    families = implied_families(built_archs)
    report.expect(
        "families",
        sorted(build_info["families"]) == sorted(families),
        f"{build_info['families']} for archs {';'.join(built_archs)} (expected {families})",
    )
    cuda = ".".join(variant["cuda"].split(".")[:2])
    built_cuda = ".".join(build_info.get("cuda_toolkit_version", "?").split(".")[:2])
    report.expect(
        "toolkit",
        built_cuda == cuda,
        f"CUDA {build_info.get('cuda_toolkit_version')} (table {variant['cuda']}), "
        f"nvcc {build_info.get('nvcc_version')}",
    )
    for key, known_key, setting in (
        ("ops", "known_ops", "SAMATTN_KNOWN_OPS"),
        ("head_dims", "known_head_dims", "SAMATTN_KNOWN_HEAD_DIMS"),
    ):
        built = [str(x) for x in build_info.get(key, [])]
        known = [str(x) for x in build_info.get(known_key) or known_from_cmake(setting)]
        if key == "head_dims" and "attention" not in build_info["ops"]:
            report.ok(key, "no attention built")
        elif key not in build_info:
            unknown = f"not recorded (build_info.json predates `{key}`)"
            (report.fail if report.release else report.warn)(key, unknown)
        elif report.mode == "ci":
            report.expect(
                key,
                bool(built) and set(built) <= set(known),
                f"{key} {built}, a subset of {known} (--ci)",
            )
        else:
            report.expect(key, sorted(built) == sorted(known), f"{key} {built} (all: {known})")


def families_with_code(build_info: dict) -> dict[str, tuple[frozenset, frozenset]]:
    return {
        family: family_signature(flags)
        for family, flags in build_info["gencode"].items()
        if build_info["translation_units"].get(family, 0) > 0
    }


def check_fatbin(report: Report, library: Path, build_info: dict) -> None:
    fatbin = _load_fatbin_reader()(library)
    families = families_with_code(build_info)
    archs = sorted({arch_number(a) for a in build_info["archs"]})
    report.expect("SASS", fatbin["sass"] == archs, f"sm {fatbin['sass']} (built: {archs})")
    want_ptx = [80] if "sm80" in families else []
    report.expect(
        "PTX",
        fatbin["ptx"] == want_ptx,
        f"compute {fatbin['ptx']}: GPUs newer than {archs[-1]} JIT the sm80 family's PTX",
    )
    specific = sorted({e["arch"] for e in fatbin["entries"] if e["arch_specific"]})
    report.expect(
        "sm_90a",
        specific == ([90] if "sm90" in families else []),
        f"arch-specific cubins for {specific} (only the sm90 family's)",
    )
    by_container = defaultdict(lambda: (set(), set()))
    for entry in fatbin["entries"]:
        kinds = by_container[entry["container"]][0 if entry["kind"] == "sass" else 1]
        kinds.add((entry["arch"], entry["arch_specific"]))
    signatures = {(frozenset(s), frozenset(p)) for s, p in by_container.values()}
    known = set(families.values())
    strays = signatures - known
    report.expect(
        "objects",
        not strays and known <= signatures,
        f"{len(by_container)} objects, each with one family's code; families "
        f"{sorted(families)}" + (f"; strays {strays}" if strays else ""),
    )


def run_cuobjdump(cuobjdump: str, library: Path, *options: str, nvdisasm: str | None = None):
    env = dict(os.environ)
    if nvdisasm:  # cuobjdump -sass runs nvdisasm from PATH
        env["PATH"] = f"{Path(nvdisasm).parent}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        [cuobjdump, *options, str(library)], capture_output=True, text=True, env=env, timeout=900
    )
    if result.returncode != 0 and "does not contain device code" in result.stderr:
        return ""
    if result.returncode != 0:
        raise RuntimeError(f"cuobjdump {' '.join(options)}: {result.stderr[-500:]}")
    return result.stdout


def check_cuobjdump(report: Report, library: Path, build_info: dict) -> None:
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    if not cuobjdump or not nvdisasm:
        report.missing_tool(
            "cuobjdump",
            "cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)",
        )
        return
    families = families_with_code(build_info)
    if not families:
        report.ok("cuobjdump", "no kernels built (SAMATTN_OPS=none)")
        return
    listing = run_cuobjdump(cuobjdump, library, "--list-elf", "--list-ptx")
    cubins = set(re.findall(r"\.(sm_\d+a?)\.cubin", listing))
    ptx = set(re.findall(r"\.(sm_\d+a?)\.ptx", listing))
    want_cubins = set().union(*(cubin_names(s) for s in families.values()))
    want_ptx = {"sm_80"} if "sm80" in families else set()
    report.expect(
        "cubins",
        cubins == want_cubins and ptx == want_ptx,
        f"cuobjdump lists cubins {sorted(cubins)}, PTX {sorted(ptx)}",
    )

    kernel_archs: dict[str, set[str]] = defaultdict(set)
    arch = None
    for line in run_cuobjdump(cuobjdump, library, "-symbols").splitlines():
        fields = line.split()
        if line.startswith("arch = "):
            arch = fields[-1]
        elif len(fields) >= 5 and fields[0] == "FUNC" and fields[3] == "ENTRY":
            kernel_archs[fields[-1]].add(arch)
    ptx_kernels = set(
        re.findall(
            r"^\.(?:visible\s+)?\.?entry\s+(\w+)", run_cuobjdump(cuobjdump, library, "-ptx"), re.M
        )
    )
    if not kernel_archs:
        report.missing_tool(
            "kernels",
            "this cuobjdump lists no cubin symbols (CUDA 13.0's on "
            "compressed fatbins): use the pip nvidia-cuda-cuobjdump",
        )
        return
    problems = []
    sm80 = cubin_names(families["sm80"]) if "sm80" in families else set()
    lowest = {"sm75": "sm_75", "sm90": "sm_90a"}
    for name, archs in kernel_archs.items():
        owner = next((f for f, a in lowest.items() if a in archs and f in families), None)
        if name in ptx_kernels:
            owner, expected = "sm80", sm80
        elif owner:
            expected = cubin_names(families[owner])
        else:
            problems.append(f"{name}: of no family, in {sorted(archs)}")
            continue
        if archs != expected:
            problems.append(f"{owner} kernel {name} in {sorted(archs)}, not {sorted(expected)}")
    counts = defaultdict(int)
    for name in kernel_archs:
        counts["sm80" if name in ptx_kernels else "other"] += 1
    missing_ptx = (
        sm80 and {k for k, a in kernel_archs.items() if a == sm80} - ptx_kernels
    ) or set()
    problems += [f"sm80 kernel {k} has no PTX" for k in sorted(missing_ptx)]
    report.expect(
        "kernels",
        not problems,
        f"{len(kernel_archs)} kernels, each in exactly its "
        f"family's cubins ({counts['sm80']} sm80 with PTX)"
        + ("".join(f"\n        {p}" for p in problems[:10])),
    )

    traps = []
    for family, signature in sorted(families.items()):
        # The family's own (lowest) arch: a trap comes from its PTX, so it is in every cubin.
        number, specific = min(signature[0])
        arch = f"sm_{number}{'a' if specific else ''}"
        sass = run_cuobjdump(cuobjdump, library, "-sass", "-arch", arch, nvdisasm=nvdisasm)
        function = None
        for line in sass.splitlines():
            stripped = line.strip()
            if stripped.startswith("Function : "):
                function = stripped.split(": ", 1)[1]
            elif function and re.match(r"/\*[0-9a-f]{4,}\*/\s+BPT\.TRAP", stripped):
                traps.append(f"{family} {arch} {function}")
                function = None
    report.expect(
        "traps",
        not traps,
        "no kernel contains a trap (an instruction its arch "
        "lacks)" + "".join(f"\n        {t}" for t in traps[:10]),
    )


def check_dependencies(report: Report, library: Path) -> None:
    readelf = shutil.which("readelf")
    if not readelf:
        report.missing_tool("needed", "readelf not found (binutils)")
        return
    dynamic = subprocess.run(
        [readelf, "-dW", str(library)], capture_output=True, text=True, check=True
    ).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", dynamic)
    rpath = re.findall(r"\((?:RPATH|RUNPATH)\).*\[(.+?)\]", dynamic)
    extra = sorted(set(needed) - ALLOWED_NEEDED)
    report.expect(
        "needed",
        not extra and not rpath,
        f"{', '.join(needed)}"
        + (f"; not allowed: {extra}" if extra else "")
        + (f"; RPATH {rpath}" if rpath else ""),
    )


def imported_versions(library: Path) -> list[tuple[str, str, str]] | None:
    """(symbol, prefix, version) of each versioned symbol libsamattn imports
    (pthread_create, GLIBC, 2.2.5); None without objdump."""
    objdump = shutil.which("objdump")
    if not objdump:
        return None
    dynamic = subprocess.run(
        [objdump, "-T", str(library)], capture_output=True, text=True, check=True
    ).stdout
    return sorted(
        {
            (match[5], match[1] or match[3], match[2] or match[4])
            for match in re.finditer(
                r"\*UND\*\s+\S+\s+(?:\(([A-Z]+)_([\d.]+)\)|([A-Z]+)_([\d.]+))\s+(\S+)", dynamic
            )
        }
    )


def policy_symbol_versions(platform: str) -> dict[str, list[str]] | None:
    """{prefix: allowed versions} of auditwheel's policy for a manylinux tag
    (manylinux_2_28_x86_64); None for another tag or without auditwheel."""
    spec = importlib.util.find_spec("auditwheel")
    if spec is None or not platform.startswith("manylinux_"):
        return None
    policy_file = Path(spec.origin).parent / "policy" / "manylinux-policy.json"
    policy_name = platform.rsplit("_", 1)[0].replace("_x86", "")
    policies = {p["name"]: p for p in json.loads(policy_file.read_text())}
    if policy_name not in policies:
        return None
    return policies[policy_name]["symbol_versions"]["x86_64"]


def newer_symbols(imported: list[tuple[str, str, str]], allowed: dict[str, list[str]]) -> list[str]:
    """The imported symbols (name@PREFIX_version) that a policy's versions do not allow."""
    return sorted(
        f"{name}@{prefix}_{version}"
        for name, prefix, version in imported
        if prefix in allowed and version not in allowed[prefix]
    )


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def check_symbols(report: Report, wheel: Path, library: Path, variant: dict) -> None:
    """No symbol version newer than the wheel's manylinux tag allows, and with --release or
    --ci none newer than the table's platform allows (without them, for a wheel not yet
    tagged, a warning), read from the library itself: glibc, libstdc++, libgcc. Built on
    glibc >= 2.34 without cpp/cmake/glibc_compat.cmake's stubs, this is where
    pthread_create@GLIBC_2.34 and the like show up."""
    claimed = wheel.name[: -len(".whl")].split("-")[-1]
    targets = {}  # platform -> whether a newer symbol fails
    if claimed.startswith("manylinux_"):
        targets[claimed] = True
    if report.mode in ("release", "ci") or not targets:
        targets.setdefault(variant["platform"], report.mode in ("release", "ci"))
    imported = imported_versions(library)
    for target, failing in targets.items():
        allowed = policy_symbol_versions(target)
        if imported is None or allowed is None:
            report.missing_tool(
                "symbols", f"objdump (binutils) or auditwheel's policy for {target} not found"
            )
            continue
        newest: dict[str, str] = {}
        for _, prefix, version in imported:
            if prefix in allowed and _version_tuple(version) > _version_tuple(
                newest.get(prefix, "0")
            ):
                newest[prefix] = version
        detail = "newest imported " + ", ".join(f"{p}_{v}" for p, v in sorted(newest.items()))
        newer = newer_symbols(imported, allowed)
        if not newer:
            report.ok("symbols", f"{detail}: all allowed by {target}")
            continue
        by_version = defaultdict(list)
        for symbol in newer:
            name, version = symbol.split("@")
            by_version[version].append(name)
        detail += f"; {len(newer)} beyond {target}:"
        for version, names in sorted(by_version.items()):
            more = f" and {len(names) - 6} more" if len(names) > 6 else ""
            detail += f"\n        {version}: {', '.join(names[:6])}{more}"
        (report.fail if failing else report.warn)("symbols", detail)


def check_auditwheel(report: Report, wheel: Path) -> None:
    """`auditwheel show` finds the tag no older than the library needs: the claimed tag
    may be newer (manylinux_2_28 for a library that would allow manylinux_2_24), never
    older."""
    auditwheel = shutil.which("auditwheel")
    if not auditwheel:
        report.missing_tool("auditwheel", "auditwheel not found (pip install auditwheel)")
        return
    result = subprocess.run([auditwheel, "show", str(wheel)], capture_output=True, text=True)
    text = " ".join(result.stdout.split())
    consistent = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    claimed = wheel.name[: -len(".whl")].split("-")[-1]
    report.expect(
        "auditwheel",
        result.returncode == 0
        and bool(consistent)
        and _policy_rank(claimed) >= _policy_rank(consistent[1]),
        f"auditwheel show: the library allows {consistent[1] if consistent else '?'}, "
        f"the wheel claims {claimed}",
    )


def _policy_rank(platform: str) -> tuple[int, int]:
    """manylinux_2_28_x86_64 -> (2, 28); another tag (linux_x86_64: not repaired) ranks above
    every manylinux one. A wheel may claim a tag of the rank auditwheel finds or newer."""
    match = re.match(r"manylinux_(\d+)_(\d+)_", platform)
    return (int(match[1]), int(match[2])) if match else (999, 999)


def check_wheel(wheel: Path, mode: str = "") -> int:
    report = Report(mode)
    match = re.match(r"samattn_(cu\d+)-", wheel.name)
    table = variants.load()
    if not match or match[1] not in table:
        print(
            f"{wheel.name}: not a samattn_<variant> wheel of ci/variants.toml ({', '.join(table)})"
        )
        return 1
    variant = table[match[1]]
    print(
        f"{wheel.name} ({variant['distribution']}, CUDA {variant['cuda']}, archs "
        f"{variant['archs']})"
    )
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory() as tmp:
        check_metadata(report, wheel, zf, variant)
        check_contents(report, wheel, zf)
        check_licenses(report, zf)
        if "samattn/lib/libsamattn.so" in zf.namelist():
            library = Path(zf.extract("samattn/lib/libsamattn.so", tmp))
            build_info = json.loads(zf.read("samattn/lib/build_info.json"))
            check_sbom(report, zf, build_info)
            check_build_info(report, build_info, variant)
            check_fatbin(report, library, build_info)
            check_cuobjdump(report, library, build_info)
            check_dependencies(report, library)
            check_symbols(report, wheel, library, variant)
            check_auditwheel(report, wheel)
    print(
        f"{wheel.name}: "
        + (f"{report.failed} checks FAILED" if report.failed else "all checks passed")
    )
    return 1 if report.failed else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", nargs="+", type=Path)
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument(
        "--release",
        action="store_true",
        help="the table's platform tag and every tool are mandatory",
    )
    modes.add_argument(
        "--ci",
        action="store_true",
        help="a subset build: all but the release list (archs, ops, head dims)",
    )
    args = parser.parse_args(argv)
    mode = "release" if args.release else "ci" if args.ci else ""
    return max(check_wheel(wheel, mode) for wheel in args.wheels)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
