"""Run flash-attn 2's own tests/test_flash_attn.py against samattn, and summarize it as JSON.

On the GPU machine (one H100), from the repository root. First, here: flash-attn's test
file into the ignored folder .fa/ (never committed: flash-attn's tests are flash-attn's),
and CUTLASS's wheel in .whl/ (nvidia_cutlass-4.2.0.0, for the build)::

    mkdir -p .fa && git -C /work/.mirror/Dao-AILab+flash-attention/repo \
        show HEAD:tests/test_flash_attn.py > .fa/test_flash_attn.py

Then two device calls, the second at once (the machine keeps build-fa/ while warm)::

    run(command="tests/flash_attn_compat/device_run.sh build", carry=[".whl", ".fa"],
        timeout_s=600)
    run(command="tests/flash_attn_compat/device_run.sh run", carry=[".fa"], timeout_s=600)

``device_run.sh run`` with no arguments is::

    python3 tests/flash_attn_compat/run_flash_attn_tests.py .fa/test_flash_attn.py \
        --families auto,sm90,sm80,sm75 --sample 240 --seed 46 --max-seconds 480 \
        --out $OUT/flash_attn_tests.json

(SAMATTN_LIBRARY=build-fa/libsamattn.so, this checkout on PYTHONPATH). With
``FA_HEAD_DIMS="64;128;256" tests/flash_attn_compat/device_run.sh all`` one call builds
fewer kernels and runs the cases of those head dims. einops, pytest and torch are in the
device image: no wheel to carry for the tests. Time: the file's collection (about 500,000
cases) takes a minute or two and is done once; each sampled case then runs once per
family; ``--max-seconds`` (from pytest's start) ends the run in time, and the JSON says
how many cases were not reached, from which the next run's ``--sample`` follows.

What it does, in one pytest process: puts the ``flash_attn`` package beside this script
first on ``sys.path`` (it routes to samattn), leaves out the two tests of flash-attn's C++
extension internals (``flash_attn_gpu``, ``_flash_attn_varlen_forward`` with
``seqused_k``, which samattn has no counterpart for), keeps a random sample of N cases
(``--sample``, ``--seed``; spread evenly over the test functions, whose case counts
differ by orders of magnitude; run in a seeded random order, so that a run stopped by
``--max-seconds`` still spreads over every test function), and runs each case once per
family: ``auto`` (the automatic choice) and sm75, sm80, sm90 forced with
``samattn.use_family`` (SAMATTN_FAMILY's equivalent; the backward follows its forward),
bfloat16 cases left out of sm75, which has no bfloat16 attention. Cases whose head dim
runs in kernels the build left out (SAMATTN_ATTENTION_HEAD_DIMS; read from the build's
build_info.json, or ``--head-dims``) are left out before sampling. The JSON has, per
family, the passed, failed and skipped counts per test function, the family that ran
(``ran_on``, from samattn's last call), skip reasons, and per failure the case, the
first line of its error and the "max diff" lines the test printed; and the list of
cases. ``--max-seconds`` counts from the start of pytest (collection included); the
cases not reached are counted as not run.

``--functions`` collects only the named test functions (faster: e.g. the dropout
cases are ``--functions test_flash_attn_qkvpacked,test_flash_attn_output,
test_flash_attn_varlen_qkvpacked,test_flash_attn_varlen_output -k 0.17``).
``--collect-only --fake-capability 9.0`` checks the collection and sampling on a machine
without a GPU. This file is also the pytest plugin that the run loads (``-p``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
FAMILIES = ("auto", "sm75", "sm80", "sm90")
# Tests of flash-attn's C++ extension's own entry points, which samattn does not have.
INTERNAL_TESTS = (
    "test_flash_attn_varlen_paged_kv_num_splits",
    "test_flash_attn_generator_arg_must_be_none",
)
# The head dims samattn's kernels are instantiated for: a head dim runs in the next one.
KERNEL_HEAD_DIMS = (32, 64, 96, 128, 192, 256)
# The test's printed diagnostics kept for a failure.
DIFF_MARKERS = ("max diff", "Actual dropout fraction")
MAX_DIFF_LINES = 12


# ----------------------------------------------------------- the plugin ----
def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("samattn flash-attn compat")
    group.addoption("--fa-families", default="auto")
    group.addoption("--fa-sample", type=int, default=0)
    group.addoption("--fa-seed", type=int, default=0)
    group.addoption("--fa-json", default=None)
    group.addoption("--fa-max-seconds", type=float, default=0.0)
    group.addoption("--fa-fake-capability", default=None)
    group.addoption("--fa-head-dims", default="auto")


def _built_head_dims(choice: str) -> tuple[int, ...] | None:
    """The kernel head dims to run cases of: "all" (None), a comma-separated list, or
    "auto": those of samattn's build (its build_info.json beside the library; None when
    that cannot be read)."""
    if choice == "all":
        return None
    if choice != "auto":
        return tuple(int(d) for d in choice.split(","))
    try:
        from samattn import _lib

        info = json.loads((_lib.library_path().parent / "build_info.json").read_text())
        return tuple(int(d) for d in info["head_dims"])
    except Exception:
        return None


def _stratified_sample(items: list, n: int, rng: random.Random) -> list:
    """n of the items, as evenly over their test functions as their counts allow (a
    uniform sample would be mostly test_flash_attn_kvcache, over half of the cases), each
    function's share drawn at random."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(item.originalname or item.name, []).append(item)
    shares = dict.fromkeys(groups, 0)
    left = n
    while left > 0:
        open_groups = [name for name in groups if shares[name] < len(groups[name])]
        each = max(1, left // len(open_groups))
        for name in open_groups:
            take = min(each, len(groups[name]) - shares[name], left)
            shares[name] += take
            left -= take
            if left == 0:
                break
    return [item for name, group in groups.items() for item in rng.sample(group, shares[name])]


# The documented limit of the sm75 family (docs/attention.md): a backward of a larger head
# dim is refused with this in its message (cpp/src/attention/flash_fwd_dispatch.h; a CPU
# test holds the two together); flash-attn 2 has no Turing kernels to compare.
_SM75_BACKWARD_LIMIT = "the sm75 backward supports head dims up to 192"


def _first_line(error: BaseException) -> str:
    lines = f"{type(error).__name__}: {error}".strip().splitlines()
    return lines[0][:500]


class _FamilyRuns:
    """Runs each selected test case once per family (samattn.use_family), in this one
    pytest session, and records every family's outcome; the pytest item fails when a
    family failed."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.families = config.getoption("--fa-families").split(",")
        self.started = time.monotonic()
        self.max_seconds = config.getoption("--fa-max-seconds")
        self.cases: list[str] = []
        self.collected = 0
        self.left_out: dict[str, int] = {}
        self.results = {family: _FamilyResult() for family in self.families}
        self.head_dims = _built_head_dims(config.getoption("--fa-head-dims"))

    @pytest.hookimpl(trylast=True)  # after -k / -m deselection
    def pytest_collection_modifyitems(self, session: Any, config: Any, items: list) -> None:
        """After -k / -m: leave out what samattn has no counterpart for, then sample."""
        self.collected = len(items)
        eligible = []
        for item in items:
            d = getattr(getattr(item, "callspec", None), "params", {}).get("d")
            kernel = next((k for k in KERNEL_HEAD_DIMS if isinstance(d, int) and k >= d), None)
            if (item.originalname or item.name) in INTERNAL_TESTS:
                reason = "flash-attn extension internals"
            elif self.head_dims is not None and kernel is not None and kernel not in self.head_dims:
                reason = f"head dim {kernel} kernels not in this build"
            else:
                eligible.append(item)
                continue
            self.left_out[reason] = self.left_out.get(reason, 0) + 1
        rng = random.Random(config.getoption("--fa-seed"))
        sample = config.getoption("--fa-sample")
        if 0 < sample < len(eligible):
            chosen = set(_stratified_sample(eligible, sample, rng))
            eligible = [item for item in eligible if item in chosen]
        rng.shuffle(eligible)
        kept = set(eligible)
        deselected = [item for item in items if item not in kept]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = eligible
        self.cases = [item.nodeid.split("::", 1)[-1] for item in items]
        for item in items:
            item.runtest = self._every_family(item, item.runtest)

    def _every_family(self, item: Any, runtest: Any) -> Any:
        def run() -> None:
            import torch

            import samattn
            from samattn import _lib

            case = item.nodeid.split("::", 1)[-1]
            params = getattr(getattr(item, "callspec", None), "params", {})
            failed, skipped = [], []
            for family in self.families:
                result = self.results[family]
                if family == "sm75" and params.get("dtype") is torch.bfloat16:
                    result.left_out("bfloat16 on sm75 (no bfloat16 attention kernels)")
                    continue
                printed = io.StringIO()
                _lib.set_last_family(0)
                forced = samattn.use_family(None if family == "auto" else family)
                try:
                    with forced, contextlib.redirect_stdout(printed):
                        runtest()
                except pytest.skip.Exception as error:
                    result.add(item, case, "skipped", reason=str(error.msg))
                    skipped.append(family)
                except (Exception, pytest.fail.Exception) as error:
                    if family == "sm75" and _SM75_BACKWARD_LIMIT in str(error):
                        result.left_out("sm75 backward above head dim 192 (Turing)")
                        continue
                    result.add(item, case, "failed", error=_first_line(error),
                               printed=printed.getvalue())  # fmt: skip
                    failed.append(family)
                else:
                    result.add(item, case, "passed", ran_on=_lib.last_family())
            if failed:
                raise AssertionError(f"failed with {', '.join(failed)}")
            if skipped and len(skipped) == len(self.families):
                pytest.skip("skipped with every family")

        return run

    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> None:
        if self.max_seconds and time.monotonic() - self.started > self.max_seconds:
            item.session.shouldstop = f"--fa-max-seconds {self.max_seconds:g} reached"

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        path = self.config.getoption("--fa-json")
        if not path:
            return
        import torch

        summary: dict[str, Any] = {"gpu": None}
        if torch.cuda.is_available():
            capability = torch.cuda.get_device_capability()
            summary["gpu"] = f"{torch.cuda.get_device_name()} (sm_{capability[0]}{capability[1]})"
        summary.update(
            {
                "collected": self.collected,
                "selected": len(self.cases),
                "left_out": self.left_out,
                "head_dims": self.head_dims,
                "wall_s": round(time.monotonic() - self.started, 1),
                "exit_status": int(exitstatus),
                "families": {
                    family: result.summary(len(self.cases))
                    for family, result in self.results.items()
                },
                "cases": self.cases,
            }
        )
        Path(path).write_text(json.dumps(summary, indent=1))


class _FamilyResult:
    """One family's outcomes: counts per test function, failures with their first error
    line and the test's printed "max diff" lines, skip reasons, the family that ran."""

    def __init__(self) -> None:
        self.functions: dict[str, dict[str, int]] = {}
        self.failures: list[dict[str, Any]] = []
        self.skip_reasons: dict[str, int] = {}
        self.left_out_reasons: dict[str, int] = {}
        self.ran_on: dict[str, int] = {}

    def left_out(self, reason: str) -> None:
        self.left_out_reasons[reason] = self.left_out_reasons.get(reason, 0) + 1

    def add(self, item: Any, case: str, outcome: str, **details: Any) -> None:
        name = item.originalname or item.name
        counts = self.functions.setdefault(name, {"passed": 0, "failed": 0, "skipped": 0})
        counts[outcome] += 1
        if outcome == "skipped":
            reason = details["reason"] or "skipped"
            self.skip_reasons[reason] = self.skip_reasons.get(reason, 0) + 1
        elif outcome == "failed":
            printed = [
                line.strip()
                for line in details["printed"].splitlines()
                if any(marker in line for marker in DIFF_MARKERS)
            ]
            self.failures.append(
                {"case": case, "error": details["error"], "printed": printed[:MAX_DIFF_LINES]}
            )
        else:
            family = details["ran_on"] or "none"
            self.ran_on[family] = self.ran_on.get(family, 0) + 1

    def summary(self, selected: int) -> dict[str, Any]:
        totals = {"passed": 0, "failed": 0, "skipped": 0}
        for counts in self.functions.values():
            for outcome, n in counts.items():
                totals[outcome] += n
        ran = sum(totals.values()) + sum(self.left_out_reasons.values())
        return {
            "totals": totals,
            "not_run": selected - ran,
            "left_out": self.left_out_reasons,
            "ran_on": self.ran_on,
            "functions": dict(sorted(self.functions.items())),
            "skip_reasons": self.skip_reasons,
            "failures": self.failures,
        }


def pytest_configure(config: Any) -> None:
    capability = config.getoption("--fa-fake-capability")
    if capability:  # a dry run without a GPU: the test module reads the capability at import
        import torch

        major, minor = (int(part) for part in capability.split("."))
        torch.cuda.get_device_capability = lambda *args, **kwargs: (major, minor)
    config.pluginmanager.register(_FamilyRuns(config), "samattn_flash_attn_families")


# ----------------------------------------------------------- the runner ----
def _environment() -> dict[str, Any]:
    """What ran: Python, torch, samattn's build (best effort: a dry run has no library)."""
    facts: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        import torch

        facts["torch"] = torch.__version__  # the GPU: the pytest process's (no CUDA here)
    except Exception as error:  # the summary says so instead
        facts["torch"] = f"unavailable: {error}"
    try:
        import samattn
        from samattn import _lib

        facts["samattn"] = samattn.__version__
        facts["samattn_library"] = str(_lib.library_path())
        facts["built_families"] = list(samattn.built_families())
    except Exception as error:
        facts["samattn"] = f"not loadable: {str(error).splitlines()[0]}"
    return facts


def _print_summary(result: dict[str, Any]) -> None:
    print(
        f"{result.get('selected', 0)} cases selected of {result.get('collected', 0)} "
        f"({result.get('wall_s', '?')} s) on {result.get('gpu')}"
    )
    for family, summary in result.get("families", {}).items():
        t = summary["totals"]
        print(
            f"{family:5} {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped, "
            f"{sum(summary['left_out'].values())} left out, {summary['not_run']} not run; "
            f"ran on {summary['ran_on']}"
        )
        for name, counts in summary["functions"].items():
            if counts["failed"]:
                print(f"      {name}: {counts['failed']} failed, {counts['passed']} passed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", type=Path, help="flash-attn's tests/test_flash_attn.py")
    parser.add_argument(
        "--families", default="auto", help=f"comma-separated, of {', '.join(FAMILIES)}"
    )
    parser.add_argument("--sample", type=int, default=0, help="N random cases (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=0.0, help="then stop (0: never)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON summary")
    parser.add_argument(
        "--functions", default=None, help="comma-separated test functions (all: collect all)"
    )
    parser.add_argument("-k", default=None, help="pytest's -k, before sampling")
    parser.add_argument(
        "--head-dims",
        default="auto",
        help="kernel head dims whose cases run: auto (the build's), all, or e.g. 64,128,256",
    )
    parser.add_argument("--collect-only", action="store_true")
    parser.add_argument("--fake-capability", default=None, help="e.g. 9.0 (no GPU)")
    args = parser.parse_args(argv)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families or not args.test_file.is_file():
        parser.error(f"unknown families {unknown}" if unknown else f"no {args.test_file}")
    summary: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]),
        "test_file": str(args.test_file),
        "test_file_sha256": hashlib.sha256(args.test_file.read_bytes()).hexdigest(),
        "sample": args.sample,
        "seed": args.seed,
        "environment": _environment(),
    }
    with tempfile.TemporaryDirectory(prefix="flash_attn_compat_") as tmp:
        work = Path(tmp)
        # A copy in a folder of its own, under an empty configuration: none of this
        # repository's pytest settings or conftest files apply.
        (work / "pytest.ini").write_text("[pytest]\n")
        shutil.copyfile(args.test_file, work / "test_flash_attn.py")
        part = work / "result.json"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        env.pop("SAMATTN_FAMILY", None)  # the families are forced per case (use_family)
        env["PYTHONUNBUFFERED"] = "1"
        # Naming functions collects only theirs (test_flash_attn_kvcache alone is over half
        # of the file's cases, and of its collection time).
        targets = ["test_flash_attn.py"]
        if args.functions and args.functions != "all":
            targets = [f"test_flash_attn.py::{name.strip()}" for name in args.functions.split(",")]
        command = [
            sys.executable, "-m", "pytest", *targets, "-c", "pytest.ini",
            "--rootdir", ".", "-p", "no:cacheprovider", "-p", "run_flash_attn_tests",
            "-q", "--tb=no", "-rN", "--no-header",
            f"--fa-families={','.join(families)}", f"--fa-sample={args.sample}",
            f"--fa-seed={args.seed}", f"--fa-json={part}", f"--fa-max-seconds={args.max_seconds}",
            f"--fa-head-dims={args.head_dims}",
        ]  # fmt: skip
        if args.fake_capability:
            command.append(f"--fa-fake-capability={args.fake_capability}")
        if args.collect_only:
            command.append("--collect-only")
        if args.k:
            command += ["-k", args.k]
        print(" ".join(command[1:]), flush=True)
        completed = subprocess.run(command, env=env, cwd=work, check=False)
        if part.exists():
            summary.update(json.loads(part.read_text()))
            if not summary.get("collected"):
                summary["error"] = "pytest collected no case (a --functions name not in the file?)"
        else:
            summary["error"] = f"pytest exited {completed.returncode} before its summary"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    _print_summary(summary)
    print(f"summary: {args.out}")
    return 0 if "error" not in summary else 1


if __name__ == "__main__":
    sys.exit(main())
