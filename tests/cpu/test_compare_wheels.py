"""ci/compare_wheels.py: identical wheels pass; a difference is named down to the member and,
for an ELF file, its section."""

from __future__ import annotations

import importlib.util
import os
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("compare_wheels", ROOT / "ci" / "compare_wheels.py")
compare_wheels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_wheels)


def wheel(path: Path, members: dict[str, bytes], date=(2026, 1, 1, 0, 0, 0)) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(zipfile.ZipInfo(name, date), data)
    return path


def test_identical_wheels_have_no_differences(tmp_path):
    members = {"pkg/__init__.py": b"x = 1\n", "pkg/lib/a.so": b"\0" * 100}
    a, b = wheel(tmp_path / "a.whl", members), wheel(tmp_path / "b.whl", members)
    assert compare_wheels.differences(a, b) == []


def test_a_changed_and_a_missing_member_are_named(tmp_path):
    a = wheel(tmp_path / "a.whl", {"pkg/x.py": b"abcd", "pkg/y.py": b"y"})
    b = wheel(tmp_path / "b.whl", {"pkg/x.py": b"abXd"})
    assert compare_wheels.differences(a, b) == [
        "only in a.whl: pkg/y.py",
        "pkg/x.py: 1 of 4 bytes differ",
    ]


def test_equal_members_with_other_timestamps_are_zip_metadata(tmp_path):
    a = wheel(tmp_path / "a.whl", {"pkg/x.py": b"abcd"})
    b = wheel(tmp_path / "b.whl", {"pkg/x.py": b"abcd"}, date=(2026, 2, 2, 0, 0, 0))
    assert compare_wheels.differences(a, b) == [
        "pkg/x.py: zip metadata (time, mode or compression)"
    ]


def test_a_difference_in_an_elf_file_names_its_section(tmp_path):
    elf = Path(os.path.realpath(sys.executable)).read_bytes()
    sections = {name: (offset, size) for name, offset, size in compare_wheels.elf_sections(elf)}
    offset, size = sections[".rodata"]
    changed = bytearray(elf)
    changed[offset + size // 2] ^= 0xFF
    a = wheel(tmp_path / "a.whl", {"lib.so": elf})
    b = wheel(tmp_path / "b.whl", {"lib.so": bytes(changed)})
    assert compare_wheels.differences(a, b) == [
        f"lib.so: 1 of {len(elf)} bytes differ (sections: .rodata 1)"
    ]
