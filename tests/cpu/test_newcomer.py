"""The first half hour of a new contributor: the README's first commands, ./setup.sh's
help, and the table of known register spills that `nox -s build` reads."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _readme_code_blocks() -> list[tuple[int, str]]:
    """(offset, body) of every fenced code block of README.md."""
    text = (ROOT / "README.md").read_text()
    return [(m.start(), m[1]) for m in re.finditer(r"```\w*\n(.*?)```", text, re.S)]


def test_readme_starts_with_the_two_commands():
    _, first = _readme_code_blocks()[0]
    commands = [line.split("#")[0].strip() for line in first.splitlines()]
    assert [c for c in commands if c] == ["./setup.sh", ".venv/bin/nox -s tests"]


def test_no_wheel_install_command_before_the_install_section():
    text = (ROOT / "README.md").read_text()
    install = text.index("\n## Install\n")
    for offset, body in _readme_code_blocks():
        if offset < install:
            assert "pip install samattn" not in body


def test_setup_script_help():
    result = subprocess.run(
        ["bash", str(ROOT / "setup.sh"), "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    for word in ("--release", "--archs", "--no-venv", "SAMATTN_ATTENTION_HEAD_DIMS"):
        assert word in result.stdout


def test_known_spills_table_is_read_by_the_build():
    pytest.importorskip("nox")
    spec = importlib.util.spec_from_file_location("_samattn_noxfile", ROOT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    known = noxfile._known_spills()
    assert known, "docs/build.md lists no spills, or its table no longer parses"
    assert all(stores >= 0 and loads >= 0 for stores, loads in known.values())
