"""Reads ci/variants.toml, the table of wheel variants (one per CUDA toolkit).

python ci/variants.py                 one line per variant
python ci/variants.py cu124           that variant as JSON (defaults filled in)
python ci/variants.py cu124 archs     one field (lists space-separated), for shell scripts
python ci/variants.py --matrix        all variants as a JSON list (CI matrices)
python ci/variants.py --names         the variant names as a JSON list (the wheels matrix)
python ci/variants.py --gpu-matrix    every (GPU runner, variant, torch) to test, as a JSON list
python ci/variants.py --check         validate the table (run by `nox -s lint`)
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

TABLE = Path(__file__).resolve().with_name("variants.toml")
REQUIRED = ("cuda", "driver", "archs", "torch", "platform", "python_tag")
# The first CUDA release that compiles each arch newer than Hopper.
FIRST_CUDA_FOR_ARCH = {100: (12, 8), 101: (12, 8), 120: (12, 8), 103: (12, 9), 121: (12, 9)}
# CUDA 12.4 and 12.6 accept GCC up to 13; the manylinux_2_28 image defaults to a newer one.
GCC_TOOLSET_13_GXX = "/opt/rh/gcc-toolset-13/root/usr/bin/g++"


def load(path: Path = TABLE) -> dict[str, dict[str, Any]]:
    """{variant: {"name", "distribution", "cuda", "archs", "torch", ...}}, defaults applied."""
    data = tomllib.loads(path.read_text())
    defaults = data.get("defaults", {})
    variants = {}
    for name, fields in data.get("variant", {}).items():
        variant = {**defaults, **fields, "name": name, "distribution": f"samattn-{name}"}
        variants[name] = variant
    return variants


def check(variants: dict[str, dict[str, Any]]) -> list[str]:
    """Problems in the table, as messages (empty when it is valid)."""
    problems = []
    if not variants:
        problems.append("no [variant.*] table")
    try:
        runners = tomllib.loads(TABLE.read_text())["gpu_tests"]["runners"]
        if not runners or not all(re.fullmatch(r"sm\d+", r) for r in runners):
            problems.append("[gpu_tests] runners must be labels like sm80")
    except KeyError:
        problems.append("no [gpu_tests] runners")
    for name, variant in variants.items():
        missing = [key for key in REQUIRED if key not in variant]
        if missing:
            problems.append(f"{name}: missing {', '.join(missing)}")
            continue
        major_minor = re.fullmatch(r"(\d+)\.(\d+)(\.\d+)?", variant["cuda"])
        if not re.fullmatch(r"cu\d{3}", name) or not major_minor:
            problems.append(f"{name}: names are cuXYZ and cuda is X.Y[.Z]")
        elif name != f"cu{major_minor[1]}{major_minor[2]}":
            problems.append(f"{name}: cuda {variant['cuda']} does not match the name")
        if not all(re.fullmatch(r"\d+[af]?", a) for a in variant["archs"].split(";")):
            problems.append(f"{name}: archs must look like 75;80;90a")
        if not variant["torch"] or not all(
            re.fullmatch(r"\d+\.\d+(\.\d+)?", t) for t in variant["torch"]
        ):
            problems.append(f"{name}: torch must list versions like 2.4.1")
        if major_minor:
            cuda = (int(major_minor[1]), int(major_minor[2]))
            for arch in variant["archs"].split(";"):
                number = int(re.match(r"\d+", arch)[0])
                if number > 90 and cuda < FIRST_CUDA_FOR_ARCH.get(number, (99, 0)):
                    problems.append(f"{name}: CUDA {variant['cuda']} cannot compile sm_{arch}")
        if not any(key in variant for key in ("pip", "rpm", "deb")):
            problems.append(f"{name}: no toolkit source (pip, rpm or deb)")
        if not all(re.fullmatch(r"[\w.-]+==[\w.]+", p) for p in variant.get("pip", [])):
            problems.append(f"{name}: pip packages must be pinned with ==")
    return problems


def field(variant: dict[str, Any], key: str) -> str:
    """One field as shell scripts want it; `host_cxx` is derived (the g++ nvcc accepts)."""
    if key == "host_cxx":
        cuda = tuple(int(x) for x in variant["cuda"].split(".")[:2])
        if cuda < (12, 8) and Path(GCC_TOOLSET_13_GXX).exists():
            return GCC_TOOLSET_13_GXX
        return shutil.which("g++") or "g++"
    value = variant[key]
    return " ".join(value) if isinstance(value, list) else str(value)


def gpu_matrix(path: Path = TABLE) -> list[dict[str, str]]:
    """Every (runner, variant, torch) the GPU gate runs, for a CI matrix's `include`."""
    runners = tomllib.loads(path.read_text())["gpu_tests"]["runners"]
    return [
        {"arch": runner, "variant": name, "torch": torch}
        for runner in runners
        for name, variant in load(path).items()
        for torch in variant["torch"]
    ]


def main(argv: list[str]) -> int:
    variants = load()
    if argv == ["--check"]:
        problems = check(variants)
        print("\n".join(problems) or f"{TABLE.name}: {len(variants)} variants OK")
        return 1 if problems else 0
    if argv == ["--matrix"]:
        print(json.dumps(list(variants.values())))
        return 0
    if argv == ["--gpu-matrix"]:
        print(json.dumps(gpu_matrix()))
        return 0
    if argv == ["--names"]:
        print(json.dumps(list(variants)))
        return 0
    if len(argv) == 1 and argv[0] in variants:
        print(json.dumps(variants[argv[0]], indent=2))
        return 0
    if len(argv) == 2 and argv[0] in variants:
        if argv[1] != "host_cxx" and argv[1] not in variants[argv[0]]:
            print(f"{argv[0]} has no field {argv[1]!r}", file=sys.stderr)
            return 2
        print(field(variants[argv[0]], argv[1]))
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name, variant in variants.items():
        torch = ", ".join(variant["torch"])
        print(f"{name}: CUDA {variant['cuda']}, archs {variant['archs']}, torch {torch}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
