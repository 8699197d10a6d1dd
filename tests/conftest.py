"""Setup shared by both test tiers (tests/cpu, tests/gpu).

The library under test is the installed package's ``samattn/lib/libsamattn.so``, or
``$SAMATTN_LIBRARY`` (an absolute path to a development build).
"""

from __future__ import annotations

import pytest


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        from samattn import _lib

        path = _lib.library_path()
        return [f"samattn library: {path} (built families: {', '.join(_lib.built_families())})"]
    except Exception as error:  # the tests themselves report the failure
        return [f"samattn library: not loadable ({str(error).splitlines()[0]})"]


@pytest.fixture
def no_family_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests that assume automatic family selection: ignore the caller's SAMATTN_FAMILY."""
    monkeypatch.delenv("SAMATTN_FAMILY", raising=False)
