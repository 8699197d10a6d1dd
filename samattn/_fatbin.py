"""Which GPU archs a shared library carries code for, read from its fatbin.

Pure Python (``struct``), no CUDA tools: it works on a machine without a GPU
or a toolkit, e.g. in ``python -m samattn.info`` and the wheel-content tests.

Layout, as written by nvcc 12/13 (checked against ``cuobjdump --list-elf
--list-ptx``). The ELF section ``.nv_fatbin`` holds one fatbin container per
object file that had device code, back to back. All integers little-endian.

Container header (16 bytes)::

    0  u32 magic 0xBA55ED50     4  u16 version     6  u16 header size
    8  u64 size of the entries that follow the header

Entry header (64 bytes or more; its first u32 after ``kind`` gives the size)::

    0  u16 kind: 1 = PTX, 2 = ELF (SASS)      2  u16 version
    4  u32 header size                          8  u64 payload size (as stored)
    16 u32 compressed size (0 = stored plain)  20 u32 offset of extra header data
    24 u16 code version minor                   26 u16 code version major
    28 u32 arch (75 for sm_75 / compute_75)    32 u32, 36 u32: name offset, length
    40 u64 flags                                56 u64 uncompressed size

Flags seen: 0x1 64-bit, 0x10 Linux, 0x2000 / 0x8000 compressed payload,
0x100000 arch-specific target (``sm_90a``, ``compute_90a``), 0x200000
family-specific target (``sm_100f``).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["FATBIN_MAGIC", "read_fatbin_archs"]

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTION = ".nv_fatbin"

_CONTAINER_HEADER = struct.Struct("<IHHQ")
_ENTRY_HEADER = struct.Struct("<HHIQIIHHIIIQQQ")  # the 64 bytes described above

_KIND_PTX = 1
_KIND_ELF = 2
_FLAG_COMPRESSED = 0x2000 | 0x8000
_FLAG_ARCH_SPECIFIC = 0x100000
_FLAG_FAMILY_SPECIFIC = 0x200000


def read_fatbin_archs(path: str | Path) -> dict[str, Any]:
    """Lists the device code embedded in an ELF shared library or executable.

    Args:
        path: an ELF64 little-endian file (e.g. ``libsamattn.so``).

    Returns:
        ``{"sass": [75, 80, ...], "ptx": [80], "containers": int, "entries": [...]}``
        where ``sass`` and ``ptx`` are the sorted unique arch numbers and each
        entry is ``{"kind": "sass" | "ptx", "arch": int, "arch_specific": bool,
        "family_specific": bool, "compressed": bool, "size": int,
        "container": int}`` (``size``: payload bytes as stored;
        ``container``: index of the fatbin container, i.e. roughly the object
        file, it came from). A file with no ``.nv_fatbin`` section gives empty
        lists.

    Raises:
        ValueError: the file is not ELF64 little-endian, or the fatbin is
            malformed (truncated or inconsistent sizes).
    """
    with open(path, "rb") as f:
        section = _read_section(f, FATBIN_SECTION)
    entries = [] if section is None else _parse_containers(section)
    return {
        "sass": sorted({e["arch"] for e in entries if e["kind"] == "sass"}),
        "ptx": sorted({e["arch"] for e in entries if e["kind"] == "ptx"}),
        "containers": len({e["container"] for e in entries}),
        "entries": entries,
    }


def _read_section(f: BinaryIO, wanted: str) -> bytes | None:
    """Returns the bytes of the named ELF section, or None if it is absent."""
    ident = f.read(64)
    if len(ident) < 64 or ident[:4] != b"\x7fELF":
        raise ValueError(f"{f.name}: not an ELF file")
    if ident[4] != 2 or ident[5] != 1:
        raise ValueError(f"{f.name}: only 64-bit little-endian ELF is supported")
    (section_table_offset,) = struct.unpack_from("<Q", ident, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", ident, 0x3A)
    if count == 0 or entry_size < 64:
        return None

    f.seek(section_table_offset)
    table = f.read(entry_size * count)
    if len(table) < entry_size * count or names_index >= count:
        raise ValueError(f"{f.name}: truncated ELF section table")
    # Elf64_Shdr: name u32, type u32, flags u64, addr u64, offset u64, size u64, ...
    sections = [struct.unpack_from("<IIQQQQ", table, i * entry_size) for i in range(count)]

    def contents(section: tuple[int, ...]) -> bytes:
        f.seek(section[4])
        data = f.read(section[5])
        if len(data) != section[5]:
            raise ValueError(f"{f.name}: truncated ELF section")
        return data

    names = contents(sections[names_index])
    for section in sections:
        start = section[0]
        end = names.find(b"\0", start)
        if names[start:end].decode("ascii", "replace") == wanted:
            return contents(section)
    return None


def _parse_containers(data: bytes) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    container = 0
    pos = 0
    while pos + _CONTAINER_HEADER.size <= len(data):
        magic, _version, header_size, body_size = _CONTAINER_HEADER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:
            # Containers are 8-byte aligned; the linker may pad between them.
            pos += 8
            continue
        body = pos + header_size
        end = body + body_size
        if header_size < _CONTAINER_HEADER.size or end > len(data):
            raise ValueError(f"fatbin container at offset {pos} overruns the section")
        entries.extend(_parse_entries(data, body, end, container))
        container += 1
        pos = end
    return entries


def _parse_entries(data: bytes, pos: int, end: int, container: int) -> list[dict[str, Any]]:
    entries = []
    while pos < end:
        if pos + _ENTRY_HEADER.size > end:
            raise ValueError(f"fatbin entry header at offset {pos} is truncated")
        fields = _ENTRY_HEADER.unpack_from(data, pos)
        kind, header_size, payload_size, arch, flags = (
            fields[0],
            fields[2],
            fields[3],
            fields[8],
            fields[11],
        )
        if header_size < _ENTRY_HEADER.size or pos + header_size + payload_size > end:
            raise ValueError(f"fatbin entry at offset {pos} overruns its container")
        if kind in (_KIND_PTX, _KIND_ELF):
            entries.append(
                {
                    "kind": "ptx" if kind == _KIND_PTX else "sass",
                    "arch": arch,
                    "arch_specific": bool(flags & _FLAG_ARCH_SPECIFIC),
                    "family_specific": bool(flags & _FLAG_FAMILY_SPECIFIC),
                    "compressed": bool(flags & _FLAG_COMPRESSED),
                    "size": payload_size,
                    "container": container,
                }
            )
        # Other kinds (e.g. LTO IR) carry no runnable code; skip them.
        pos += header_size + payload_size
    return entries


if __name__ == "__main__":
    import json
    import sys

    for name in sys.argv[1:]:
        info = read_fatbin_archs(name)
        print(json.dumps({k: info[k] for k in ("sass", "ptx", "containers")}))
