"""The GitHub workflows: valid (actionlint, GitHub's schema), wired to nox sessions and ci/
scripts that exist (no logic only in YAML), and publishing only behind the GPU gate."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _load(name: str) -> dict:
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def _run_lines(workflow: dict) -> list[str]:
    return [
        step["run"]
        for job in workflow["jobs"].values()
        for step in job.get("steps", [])
        if "run" in step
    ]


def test_the_four_workflows_exist() -> None:
    assert {w.name for w in WORKFLOWS} == {"ci.yml", "wheels.yml", "gpu-tests.yml", "release.yml"}


def test_workflows_call_sessions_and_scripts_that_exist() -> None:
    noxfile = (ROOT / "noxfile.py").read_text()
    sessions = set(re.findall(r"^def (\w+)\(session", noxfile, re.M))
    for workflow in WORKFLOWS:
        text = workflow.read_text()
        for session in re.findall(r"nox -s (\w+)", text):
            assert session in sessions, f"{workflow.name}: nox -s {session} is not a session"
        for script in re.findall(r"\b(ci/[\w./-]+\.(?:py|sh|txt))", text):
            assert (ROOT / script).is_file(), f"{workflow.name}: {script} does not exist"
        for script in re.findall(r"\b(\.ci/run)\b", text):
            assert (ROOT / script).is_file()


def test_run_steps_are_one_command_each() -> None:
    # The logic lives in nox sessions and ci/ scripts, so every step runs by hand too.
    for workflow in WORKFLOWS:
        for line in _run_lines(yaml.safe_load(workflow.read_text())):
            commands = [c for c in re.split(r"&&|;|\n", line.strip()) if c.strip()]
            assert len(commands) == 1, f"{workflow.name}: `{line}` is a script, not a step"


def test_release_publishes_only_after_the_wheels_and_the_gpu_gate() -> None:
    release = _load("release.yml")
    triggers = release.get("on", release.get(True))  # YAML 1.1 reads the key `on` as True
    assert triggers == {"push": {"tags": ["v*"]}}
    jobs = release["jobs"]
    assert jobs["wheels"]["uses"] == "./.github/workflows/wheels.yml"
    assert jobs["gpu-tests"]["uses"] == "./.github/workflows/gpu-tests.yml"
    assert jobs["gpu-tests"]["needs"] == "wheels"
    publish = jobs["publish"]
    assert set(publish["needs"]) == {"wheels", "gpu-tests"}
    assert publish["permissions"] == {"id-token": "write"}  # trusted publishing, no token
    steps = publish["steps"]
    upload = [s for s in steps if s.get("uses", "").startswith("pypa/gh-action-pypi-publish")]
    assert len(upload) == 1
    assert not {"password", "user"} & set(upload[0].get("with", {}))


def test_gpu_tests_run_the_nox_gate_on_arch_labelled_runners() -> None:
    gpu = _load("gpu-tests.yml")["jobs"]["gpu"]
    assert gpu["runs-on"][:3] == ["self-hosted", "linux", "gpu"]
    assert "${{ matrix.arch }}" in gpu["runs-on"]
    assert any("nox -s gpu_tests" in line for line in _run_lines({"jobs": {"gpu": gpu}}))


def test_wheels_build_every_variant_with_cibuildwheel() -> None:
    wheels = _load("wheels.yml")
    build = wheels["jobs"]["build"]
    assert "ci/variants.py --names" in " ".join(_run_lines(wheels))
    assert any("cibuildwheel --platform linux" in line for line in _run_lines(wheels))
    assert any(s.get("env", {}).get("SAMATTN_VARIANT") for s in build["steps"])


@pytest.mark.parametrize(
    "command",
    [
        ["actionlint", "-config-file", str(ROOT / "ci" / "actionlint.yaml")],
        ["check-jsonschema", "--builtin-schema", "vendor.github-workflows"],
    ],
    ids=["actionlint", "check-jsonschema"],
)
def test_workflows_validate_offline(command: list[str]) -> None:
    if shutil.which(command[0]) is None:
        pytest.skip(f"{command[0]} is not installed (pip install -r ci/requirements-lint.txt)")
    result = subprocess.run([*command, *map(str, WORKFLOWS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
