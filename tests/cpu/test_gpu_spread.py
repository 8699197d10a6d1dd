"""tests/conftest.py's spreading of pytest-xdist workers over GPUs (nox -s gpu_tests --workers)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest


def _spread():
    path = Path(__file__).resolve().parents[1] / "conftest.py"
    spec = importlib.util.spec_from_file_location("_samattn_tests_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._spread_workers_over_gpus


@pytest.fixture
def spread(monkeypatch: pytest.MonkeyPatch):
    # Loading conftest.py spreads at once: with no SAMATTN_TEST_GPUS here, it does nothing.
    monkeypatch.delenv("SAMATTN_TEST_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return _spread()


def visible_for(monkeypatch, spread, worker: str, gpus: str, visible: str | None) -> str | None:
    monkeypatch.setenv("SAMATTN_TEST_GPUS", gpus)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    spread()
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_each_worker_starts_on_its_own_gpu_and_sees_all(monkeypatch, spread):
    got = [visible_for(monkeypatch, spread, f"gw{i}", "4", None) for i in (0, 1, 3, 5)]
    assert got == ["0,1,2,3", "1,2,3,0", "3,0,1,2", "1,2,3,0"]


def test_an_existing_device_list_is_rotated(monkeypatch, spread):
    assert visible_for(monkeypatch, spread, "gw1", "2", "6,7") == "7,6"


@pytest.mark.parametrize(
    ("worker", "gpus"), [("gw3", "1"), ("gw3", ""), ("", "4"), ("master", "4")]
)
def test_nothing_changes_without_workers_or_several_gpus(monkeypatch, spread, worker, gpus):
    assert visible_for(monkeypatch, spread, worker, gpus, "2,3") == "2,3"
