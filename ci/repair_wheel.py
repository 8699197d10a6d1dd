"""Turns a freshly built wheel into a variant's release wheel: rename, then auditwheel.

    python ci/repair_wheel.py WHEEL DEST_DIR --variant cu130 [--plat auto]

1. The distribution `samattn` becomes `samattn-<variant>` (ci/rename_wheel.py).
2. `auditwheel repair` checks the library against the manylinux policy and sets the tag:
   --plat defaults to the variant's platform (manylinux_2_28_x86_64), which fails loudly
   if the library needs a newer glibc. Every build asks for it: in the manylinux_2_28
   image, and on a newer glibc, where the library is linked against stubs of the pre-2.34
   libpthread, libdl and librt (cpp/cmake/glibc_compat.cmake) and so needs glibc 2.17 at
   most. `--plat auto` takes the oldest tag the library allows instead: manylinux_2_24
   today (GLIBCXX_3.4.21), which is not the table's platform; manylinux_2_34 for a build
   with SAMATTN_GLIBC_COMPAT=OFF on glibc >= 2.34. --only-plat: exactly that one tag.
   Without it auditwheel adds every older policy the library also satisfies, a compound
   tag (manylinux_2_26_x86_64.manylinux_2_28_x86_64) that is not the table's platform and
   that ci/check_release.py rejects. Libraries that the NVIDIA driver
   provides are never grafted in (--exclude); libsamattn links none of them anyway: the
   CUDA runtime is static and finds the driver with dlopen.

cibuildwheel's repair-wheel-command and `nox -s wheel` both run this.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import variants
from check_wheel import DRIVER_LIBRARIES
from rename_wheel import rename_wheel


def repair(wheel: Path, dest_dir: Path, variant: dict, plat: str | None = None) -> Path:
    """The release wheel of `variant` made from `wheel`, written into dest_dir."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        renamed = rename_wheel(wheel, variant["distribution"], Path(tmp))
        command = ["auditwheel", "repair", str(renamed), "-w", str(dest_dir)]
        command += ["--plat", plat or variant["platform"], "--only-plat"]
        for soname in DRIVER_LIBRARIES:
            command += ["--exclude", soname]
        print("+", " ".join(command), flush=True)
        subprocess.run(command, check=True)
    stem = renamed.name.rsplit("-", 1)[0]  # name-version-py3-none
    repaired = sorted(dest_dir.glob(f"{stem}-*.whl"), key=lambda p: p.stat().st_mtime)
    return repaired[-1]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("dest_dir", type=Path)
    parser.add_argument(
        "--variant",
        default=os.environ.get("SAMATTN_VARIANT"),
        help="a variant of ci/variants.toml (default: $SAMATTN_VARIANT)",
    )
    parser.add_argument("--plat", help="auditwheel's --plat (default: the variant's platform)")
    args = parser.parse_args(argv)
    table = variants.load()
    if args.variant not in table:
        parser.error(f"--variant (or SAMATTN_VARIANT) must be one of {', '.join(table)}")
    print(repair(args.wheel, args.dest_dir, table[args.variant], args.plat))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
