"""Which samattn wheel variant is installed, and a clear error when two are.

Every variant (samattn-cu124, samattn-cu130) installs the same import package,
``samattn``, so a second ``pip install samattn-cuXXX`` silently overwrites the first one's
files, and uninstalling either one then breaks the other. Both leave their ``.dist-info``
folder next to the package, which is what :func:`check_single_variant` looks for.
"""

from __future__ import annotations

import re
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
# samattn-0.1.0.dist-info (a source build) or samattn_cu130-0.1.0.dist-info (a variant).
_DIST_INFO = re.compile(r"^(samattn(?:[-_]cu\d+)?)-[^-]+\.dist-info$", re.IGNORECASE)


# The CUDA release each wheel variant is built with (ci/variants.toml's `cuda`, which a CPU
# test compares with this): samattn.info() names the ones an older driver can still run.
VARIANT_CUDA: dict[str, tuple[int, int]] = {
    "samattn-cu124": (12, 4),
    "samattn-cu130": (13, 0),
}


class VariantConflictError(ImportError):
    """More than one samattn distribution is installed into the same folder."""


def installed_distributions(site_dir: Path = _PACKAGE_DIR.parent) -> list[str]:
    """The samattn distributions whose metadata sits in ``site_dir``, e.g. ``["samattn-cu130"]``,
    sorted; empty when samattn runs from a source tree."""
    names = []
    for entry in site_dir.glob("samattn*.dist-info"):
        match = _DIST_INFO.match(entry.name)
        if match:
            names.append(match[1].lower().replace("_", "-"))
    return sorted(set(names))


def check_single_variant(site_dir: Path = _PACKAGE_DIR.parent) -> None:
    """Raises VariantConflictError if two samattn distributions share ``site_dir``."""
    names = installed_distributions(site_dir)
    if len(names) > 1:
        raise VariantConflictError(
            f"samattn: several samattn wheels are installed in {site_dir}: {', '.join(names)}. "
            "They share the import package `samattn`, so the last one installed overwrote the "
            "others' files. Keep exactly one: `pip uninstall -y "
            f"{' '.join(names)}`, then `pip install` the one that matches your driver "
            "(see the README's install table)."
        )
