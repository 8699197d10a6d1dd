"""samattn.info() and `python -m samattn.info`, on a machine with or without a GPU."""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

import samattn
from samattn import _lib
from samattn._info import driver_status
from samattn._variant import VARIANT_CUDA

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib


def _gpu_visible() -> bool:
    try:
        _lib.device_properties(0)
    except (RuntimeError, ValueError):
        return False
    return True


def test_module_runs_and_exits_0():
    package_parent = str(Path(samattn.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([package_parent, env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "samattn.info"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    assert "RuntimeWarning" not in result.stderr, result.stderr
    assert f"samattn {samattn.__version__}" in result.stdout
    assert str(_lib.library_path()) in result.stdout
    if _gpu_visible():
        assert "GPU 0:" in result.stdout and "gemm" in result.stdout
    else:
        assert "no CUDA GPU visible" in result.stdout


def test_info_prints_and_returns_the_facts():
    out = io.StringIO()
    facts = samattn.info(file=out)
    text = out.getvalue()
    assert facts["library"]["loaded"] and facts["library"]["version"] == samattn.__version__
    assert facts["built_families"] == samattn.built_families()
    assert facts["torch"] in text and facts["cuda_runtime"] in text
    for family in facts["built_families"]:
        assert family in text
    archs = facts["archs"]
    assert archs == "unknown" or set(archs) == {"sass", "ptx"}
    if not _gpu_visible():
        assert facts["gpus"] == [] and "no CUDA GPU visible" in text
        assert facts["gpu_error"]


def test_info_lists_a_family_per_op_and_dtype_for_each_gpu():
    facts = samattn.info(file=io.StringIO())
    for gpu in facts["gpus"]:
        assert set(gpu["families"]) == {"gemm", "softmax", "attention"}
        for choices in gpu["families"].values():
            assert set(choices) == {"float16", "bfloat16", "float32"}


def test_info_is_a_plain_function_and_the_script_cannot_shadow_it():
    assert callable(samattn.info) and samattn.info.__module__ == "samattn._info"
    with pytest.raises(ImportError, match=r"call samattn\.info\(\)"):
        importlib.import_module("samattn.info")
    assert samattn.info.__module__ == "samattn._info"


def test_no_driver_is_told_apart_from_an_old_driver():
    none = driver_status(13000, 0)
    assert none["status"] == "none" and "no NVIDIA driver" in none["message"]
    old = driver_status(13000, 12080)
    assert old["status"] == "too_old"
    assert "580.65.06" in old["message"] and "samattn-cu124" in old["message"]
    assert "samattn-cu130" not in old["message"]
    assert "525.60.13" in driver_status(12080, 11080)["message"]
    assert driver_status(12080, 12020)["status"] == "minor_older"
    assert driver_status(12040, 12080) == {"status": "ok", "message": None}


def test_info_explains_a_missing_driver():
    facts = samattn.info(file=io.StringIO())
    runtime, driver = _lib.cuda_versions()
    assert facts["driver"] == driver_status(runtime, driver)
    if driver == 0:
        assert "no NVIDIA driver" in facts["gpu_error"]


def test_variant_cuda_versions_match_the_variant_table():
    table = tomllib.loads(
        (Path(__file__).resolve().parents[2] / "ci" / "variants.toml").read_text()
    )
    expected = {
        f"samattn-{name}": tuple(int(x) for x in fields["cuda"].split(".")[:2])
        for name, fields in table["variant"].items()
    }
    assert expected == VARIANT_CUDA
