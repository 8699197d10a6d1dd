"""ci/keep_mtimes.py: after a fresh copy of the tree, files whose content is unchanged get
their recorded times back (so a build resumes), and changed or new files keep theirs."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("keep_mtimes", ROOT / "ci" / "keep_mtimes.py")
keep_mtimes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(keep_mtimes)

OLD = 1_600_000_000_000_000_000  # ns: the first copy's time
COPY = 1_700_000_000_000_000_000  # ns: a later copy's time


def write(path: Path, text: str, mtime_ns: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_unchanged_files_get_their_time_back_and_changed_ones_keep_the_copys(tmp_path):
    tree, record = tmp_path / "tree", tmp_path / "tree" / "build" / "record.json"
    write(tree / "a.cu", "kernel a", OLD)
    write(tree / "src" / "b.h", "header b", OLD)
    write(tree / "build" / "a.o", "object", OLD + 10)  # build outputs are not recorded
    assert keep_mtimes.keep(record, tree) == (0, 2)  # first run: nothing recorded yet

    # A fresh copy: every file stamped anew; b.h edited, c.cu added.
    write(tree / "a.cu", "kernel a", COPY)
    write(tree / "src" / "b.h", "header b, edited", COPY)
    write(tree / "c.cu", "kernel c", COPY)
    assert keep_mtimes.keep(record, tree) == (1, 2)
    assert (tree / "a.cu").stat().st_mtime_ns == OLD  # older than a.o again: not rebuilt
    assert (tree / "src" / "b.h").stat().st_mtime_ns == COPY  # its dependents rebuild
    assert (tree / "c.cu").stat().st_mtime_ns == COPY

    # The next copy with b.h edited back: the record holds the edit, so b.h counts as changed.
    write(tree / "src" / "b.h", "header b", COPY + 1)
    write(tree / "a.cu", "kernel a", COPY + 1)
    assert keep_mtimes.keep(record, tree) == (2, 1)
    assert (tree / "src" / "b.h").stat().st_mtime_ns == COPY + 1
    assert (tree / "a.cu").stat().st_mtime_ns == OLD
    assert (tree / "c.cu").stat().st_mtime_ns == COPY


def test_build_outputs_and_git_are_not_walked(tmp_path):
    for name in ("build/x.o", "dist/x.whl", ".git/HEAD", "pkg/__pycache__/m.pyc", "pkg/m.py"):
        write(tmp_path / name, name, OLD)
    names = [p.relative_to(tmp_path).as_posix() for p in keep_mtimes.sources(tmp_path)]
    assert names == ["pkg/m.py"]
