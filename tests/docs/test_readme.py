"""README.md, which the site does not build: its relative links lead somewhere and it stays
a landing page (docs/design.md section 5). Run by `nox -s docs`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 300
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_relative_links_resolve():
    broken = []
    for target in LINK.findall(README.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # external links are not checked (CI reaches only PyPI and Debian)
        if not (ROOT / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"README.md links to files that do not exist: {broken}"


def test_readme_is_a_landing_page():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines: move detail to docs/ ({MAX_LINES})"
