"""Renames the distribution of a built wheel: samattn -> samattn-cu130.

    python ci/rename_wheel.py WHEEL DISTRIBUTION OUT_DIR      prints the new wheel's path

The build always produces the distribution `samattn` (pyproject.toml); each variant is
published as `samattn-<variant>` with the same import package `samattn`. Python packaging
fixes the name in pyproject.toml, so rather than editing that file per build, the built
wheel is rewritten: its file name, its .dist-info folder, `Name:` in METADATA, and RECORD
(paths and the METADATA hash). Every other member is copied byte for byte, with its
permissions.
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path


def normalized(distribution: str) -> str:
    """The file-name form of a distribution name (PEP 427/503): samattn-cu130 -> samattn_cu130."""
    return re.sub(r"[-_.]+", "_", distribution).lower()


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def rename_wheel(wheel: Path, distribution: str, out_dir: Path) -> Path:
    """Writes a copy of `wheel` whose distribution is `distribution` into out_dir."""
    old_stem, version, tags = wheel.name[: -len(".whl")].split("-", 2)
    new_stem = normalized(distribution)
    old_info, new_info = f"{old_stem}-{version}.dist-info", f"{new_stem}-{version}.dist-info"
    target = out_dir / f"{new_stem}-{version}-{tags}.whl"
    out_dir.mkdir(parents=True, exist_ok=True)

    def new_path(name: str) -> str:
        return new_info + name[len(old_info) :] if name.startswith(old_info + "/") else name

    with zipfile.ZipFile(wheel) as source:
        metadata = source.read(f"{old_info}/METADATA").decode()
        metadata, count = re.subn(
            r"^Name: .*$", f"Name: {distribution}", metadata, count=1, flags=re.M
        )
        if count != 1:
            raise SystemExit(f"{wheel}: METADATA has no Name field")
        metadata_bytes = metadata.encode()
        record_lines = []
        for line in source.read(f"{old_info}/RECORD").decode().splitlines():
            path, digest, size = line.rsplit(",", 2)
            path = new_path(path)
            if path == f"{new_info}/METADATA":
                digest, size = record_hash(metadata_bytes), str(len(metadata_bytes))
            record_lines.append(f"{path},{digest},{size}")
        record = ("\n".join(record_lines) + "\n").encode()

        with zipfile.ZipFile(target, "w") as output:
            for item in source.infolist():
                if item.filename == f"{old_info}/METADATA":
                    data = metadata_bytes
                elif item.filename == f"{old_info}/RECORD":
                    data = record
                else:
                    data = source.read(item)
                renamed = zipfile.ZipInfo(new_path(item.filename), item.date_time)
                renamed.external_attr = item.external_attr
                renamed.compress_type = item.compress_type
                output.writestr(renamed, data)
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    print(rename_wheel(Path(argv[0]), argv[1], Path(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
