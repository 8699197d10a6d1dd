"""Whether two wheels are byte-identical, and if not, what differs inside them.

    python ci/compare_wheels.py A.whl B.whl

Prints one line per difference: a member only in one wheel, a member whose bytes differ
(with how many bytes and, for an ELF file, in which sections), or zip metadata (order,
timestamps, permissions) when every member is equal. Exit status 0 when the files are
identical, 1 when not. `nox -s reproducible` builds a wheel twice and runs this.
"""

from __future__ import annotations

import argparse
import struct
import sys
import zipfile
from pathlib import Path


def elf_sections(data: bytes) -> list[tuple[str, int, int]]:
    """(name, offset, size) of each section of a 64-bit little-endian ELF file, else []."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)[:6] for i in range(shnum)]
    names_offset = headers[shstrndx][4]
    sections = []
    for name, _type, _flags, _addr, offset, size in headers:
        end = data.index(b"\0", names_offset + name)
        sections.append((data[names_offset + name : end].decode(), offset, size))
    return sections


def differing_bytes(a: bytes, b: bytes) -> int:
    """Bytes that differ at equal offsets, plus the length difference."""
    return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))


def where(a: bytes, b: bytes) -> str:
    """For ELF files of equal layout, the sections holding the differing bytes."""
    sections = elf_sections(a)
    if len(a) != len(b) or not sections or sections != elf_sections(b):
        return ""
    hits = []
    for name, offset, size in sections:
        count = differing_bytes(a[offset : offset + size], b[offset : offset + size])
        if count and name:
            hits.append(f"{name} {count}")
    return f" (sections: {', '.join(hits)})" if hits else ""


def differences(first: Path, second: Path) -> list[str]:
    """What differs between the two wheels; [] when the files are byte-identical."""
    if first.read_bytes() == second.read_bytes():
        return []
    found = []
    with zipfile.ZipFile(first) as za, zipfile.ZipFile(second) as zb:
        names_a, names_b = za.namelist(), zb.namelist()
        for name in sorted(set(names_a) ^ set(names_b)):
            found.append(f"only in {first.name if name in names_a else second.name}: {name}")
        for name in sorted(set(names_a) & set(names_b)):
            a, b = za.read(name), zb.read(name)
            if a != b:
                count = differing_bytes(a, b)
                found.append(f"{name}: {count} of {len(a)} bytes differ{where(a, b)}")
        if not found:
            if names_a != names_b:
                found.append("the members are equal but stored in another order")
            for info_a, info_b in zip(za.infolist(), zb.infolist()):
                if (info_a.date_time, info_a.external_attr, info_a.compress_type) != (
                    info_b.date_time,
                    info_b.external_attr,
                    info_b.compress_type,
                ):
                    found.append(f"{info_a.filename}: zip metadata (time, mode or compression)")
    return found or ["the members and their metadata are equal; the zip bytes are not"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    args = parser.parse_args()
    found = differences(args.first, args.second)
    if not found:
        print(f"identical: {args.first.name} and {args.second.name}")
        return 0
    for line in found:
        print(line)
    return 1


if __name__ == "__main__":
    sys.exit(main())
