"""Reads ci/variants.toml, the table of wheel variants (one per CUDA toolkit).

python ci/variants.py                 one line per variant
python ci/variants.py cu124           that variant as JSON (defaults filled in)
python ci/variants.py --matrix        all variants as a JSON list (CI matrices)
python ci/variants.py --check         validate the table (run by `nox -s lint`)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

TABLE = Path(__file__).resolve().with_name("variants.toml")
REQUIRED = ("cuda", "archs", "torch", "platform", "python_tag")


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
    return problems


def main(argv: list[str]) -> int:
    variants = load()
    if argv == ["--check"]:
        problems = check(variants)
        print("\n".join(problems) or f"{TABLE.name}: {len(variants)} variants OK")
        return 1 if problems else 0
    if argv == ["--matrix"]:
        print(json.dumps(list(variants.values())))
        return 0
    if len(argv) == 1 and argv[0] in variants:
        print(json.dumps(variants[argv[0]], indent=2))
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
