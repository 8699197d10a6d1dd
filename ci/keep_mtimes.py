"""Let a build resume after the sources were copied anew: give back the modification times
of the files whose content did not change.

    python ci/keep_mtimes.py RECORD [ROOT]

A machine that receives a fresh copy of the checkout for every command (the GPU machine's
`run`) stamps every file with the copy's time, so ninja finds every object older than its
sources and compiles the whole library again, although the build folder survived. This
script reads RECORD (a JSON file kept in that build folder): for each file listed there
whose content (SHA-256) is still the same, it sets the modification time back to the
recorded one; a file that changed keeps its new time, so ninja recompiles what depends on
it and nothing else. It then writes RECORD anew for the tree as it is now. Run it before
every build in that folder, the first time too (no RECORD: it only writes one).

ROOT (default: the checkout) is walked without its build outputs and version control:
build/, dist/, .git/, .venv/, .nox/, __pycache__ folders.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

SKIPPED = {"build", "dist", ".git", ".venv", ".nox", "__pycache__", ".pytest_cache"}


def sources(root: Path) -> list[Path]:
    """Every file under root but build outputs and version control, sorted."""
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED)
        found += [Path(folder) / name for name in files]
    return sorted(found)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def keep(record_path: Path, root: Path) -> tuple[int, int]:
    """Restore the unchanged files' times from the record, then record the tree. Returns
    (files restored, files that changed or are new)."""
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        record = {}
    restored = changed = 0
    fresh = {}
    for path in sources(root):
        if path.is_symlink() or not path.is_file():
            continue
        name = path.relative_to(root).as_posix()
        sha = digest(path)
        kept = record.get(name)
        if kept is not None and kept[0] == sha:
            os.utime(path, ns=(kept[1], kept[1]))
            restored += 1
        else:
            changed += 1
        fresh[name] = [sha, path.stat().st_mtime_ns]
    record_path.parent.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps(fresh, indent=0, sort_keys=True))
    return restored, changed


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[1] if len(argv) == 2 else Path(__file__).resolve().parents[1]).resolve()
    restored, changed = keep(Path(argv[0]), root)
    print(f"keep_mtimes: {restored} files kept their recorded time, {changed} changed or new")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
