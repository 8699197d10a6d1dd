"""Setup shared by both test tiers (tests/cpu, tests/gpu).

The library under test is the installed package's ``samattn/lib/libsamattn.so``, or
``$SAMATTN_LIBRARY`` (an absolute path to a development build).
"""

from __future__ import annotations

import os

import pytest

# The optional packages that some tests skip without (ci/requirements-test.txt installs
# them in CI): {distribution: what needs it}.
OPTIONAL_PACKAGES = {
    "transformers": "samattn.integrations.transformers",
    "pyyaml": "workflows",
    "hypothesis": "quick checks",
}


def _optional_packages() -> str:
    from importlib import metadata

    found = []
    for name, what in OPTIONAL_PACKAGES.items():
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} MISSING (the tests of {what} skip)")
    return ", ".join(found)


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"optional test packages: {_optional_packages()}"]
    try:
        from samattn import _lib

        path = _lib.library_path()
        families = ", ".join(_lib.built_families())
        return [f"samattn library: {path} (built families: {families})", *lines]
    except Exception as error:  # the tests themselves report the failure
        return [f"samattn library: not loadable ({str(error).splitlines()[0]})", *lines]


def _spread_workers_over_gpus() -> None:
    """With SAMATTN_TEST_GPUS=N (set by `nox -s gpu_tests --workers`) and pytest-xdist, worker
    i sees the N GPUs rotated by i: the workers' current devices differ, so the tier spreads
    over every GPU, and the tests that need two GPUs still see all of them.

    Runs when this file is imported, before tests/gpu/conftest.py asks torch whether CUDA is
    available: the driver reads CUDA_VISIBLE_DEVICES once, at its first use."""
    count = int(os.environ.get("SAMATTN_TEST_GPUS") or 0)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if count < 2 or not worker.startswith("gw"):
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(count)]
    first = int(worker[2:]) % len(ids)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids[first:] + ids[:first])


_spread_workers_over_gpus()


@pytest.fixture
def no_family_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests that assume automatic family selection: ignore the caller's SAMATTN_FAMILY."""
    monkeypatch.delenv("SAMATTN_FAMILY", raising=False)


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that read test_binary.py's SASS summary run last, and the summary starts
    now in the background: its disassembly, seconds of every core on a full wheel, then
    overlaps the other tests."""
    reading = [item for item in items if "sass" in getattr(item, "fixturenames", ())]
    if not reading:
        return
    others = [item for item in items if "sass" not in getattr(item, "fixturenames", ())]
    items[:] = others + reading
    start = getattr(reading[0].module, "start_sass_summary", None)
    if start is not None:
        start(config)
