"""How many compile jobs a build can run at once: min(cores, available memory / peak per job).

    python ci/compile_jobs.py [BUILD_DIR ...]     prints the number of jobs
    python ci/compile_jobs.py --explain [...]     and, on stderr, where the numbers came from

The peak per job is the largest one recorded by earlier compiles (cpp/cmake/compile_memory.py
writes <build dir>/compile_memory.tsv; default: every build/*/ of the checkout), plus 10 %.
With no record, or a record of ccache hits only (every peak under 1 GiB says nothing about a
real compile), it is DEFAULT_GB_PER_JOB: the attention backward and sm90 GEMM units peak at
3.4-3.7 GB (measured with nvcc 13.0). SAMATTN_GB_PER_COMPILE_JOB overrides both.

A record made by subset builds alone (`--ops softmax`) under-estimates a full build: delete
build/*/compile_memory.tsv or set SAMATTN_GB_PER_COMPILE_JOB. noxfile.py, ci/gpu_session.sh and
the release builds (pyproject.toml's cibuildwheel environment) use this.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GB_PER_JOB = 3.8
# A compile that needs less than this was a ccache hit or a host-only file.
MEANINGFUL_PEAK_GB = 1.0
MARGIN = 1.1


def recorded_peak_gb(build_dirs: list[Path]) -> float | None:
    """The largest peak (GB) in the build dirs' compile_memory.tsv, or None if none counts."""
    peaks = []
    for folder in build_dirs:
        record = folder / "compile_memory.tsv"
        if not record.is_file():
            continue
        for line in record.read_text().splitlines():
            kib = line.split("\t", 1)[0]
            if kib.isdigit():
                peaks.append(int(kib) * 1024 / 1e9)
    peak = max(peaks, default=0.0)
    return peak if peak >= MEANINGFUL_PEAK_GB else None


def gb_per_job(build_dirs: list[Path]) -> tuple[float, str]:
    """(GB per compile job, where it came from)."""
    override = os.environ.get("SAMATTN_GB_PER_COMPILE_JOB")
    if override:
        return float(override), "SAMATTN_GB_PER_COMPILE_JOB"
    peak = recorded_peak_gb(build_dirs)
    if peak is None:
        return DEFAULT_GB_PER_JOB, "default (no compile of 1 GB or more recorded)"
    return peak * MARGIN, f"recorded peak {peak:.2f} GB + {MARGIN - 1:.0%}"


def available_gb() -> float | None:
    """MemAvailable, or less where a cgroup (a container's memory limit) allows less."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024 / 1e9)
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        if limit.isdigit() and used.isdigit():
            found.append((int(limit) - int(used)) / 1e9)
    except OSError:
        pass
    return min(found, default=None)


def compile_jobs(build_dirs: list[Path] | None = None) -> tuple[int, str]:
    """(jobs, explanation) for a build on this machine."""
    if build_dirs is None:
        build_dirs = sorted(p for p in (ROOT / "build").glob("*") if p.is_dir())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_job, source = gb_per_job(build_dirs)
    memory = available_gb()
    jobs = cores or 1
    if memory is not None:
        jobs = min(jobs, int(memory / per_job))
    jobs = max(1, jobs)
    memory_text = f"{memory:.1f} GB available" if memory is not None else "memory unknown"
    return jobs, f"{jobs} jobs: {cores} cores, {memory_text}, {per_job:.2f} GB per job ({source})"


def main(argv: list[str]) -> int:
    explain = "--explain" in argv
    folders = [Path(a) for a in argv if a != "--explain"]
    jobs, why = compile_jobs(folders or None)
    if explain:
        print(why, file=sys.stderr)
    print(jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
