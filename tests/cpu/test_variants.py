"""The wheel pipeline's pieces that need no toolkit, no build and no network: the variant
table (ci/variants.toml), the wheel rename, the two-variants check at import, the release
check and pyproject.toml's cibuildwheel configuration."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import sys
import types
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib


def _ci_module(name: str):
    spec = importlib.util.spec_from_file_location(f"ci_{name}", ROOT / "ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "ci"))  # the ci scripts import each other
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "ci"))
    return module


variants = _ci_module("variants")


# ------------------------------------------------------------------ table ----


def test_the_table_is_valid() -> None:
    assert variants.check(variants.load()) == []


def test_every_variant_has_the_common_archs_and_blackwell_where_the_toolkit_has_it() -> None:
    for name, variant in variants.load().items():
        archs = variant["archs"].split(";")
        assert archs[:5] == ["75", "80", "86", "89", "90a"], name
        cuda = tuple(int(x) for x in variant["cuda"].split(".")[:2])
        blackwell = [a for a in archs if int(a.rstrip("af")) >= 100]
        assert blackwell == (["100", "120"] if cuda >= (12, 8) else []), name
        assert variant["distribution"] == f"samattn-{name}"
        assert variant["platform"] == "manylinux_2_28_x86_64"


def test_cuda_13_comes_from_pinned_pip_packages_of_one_release() -> None:
    pins = dict(p.split("==") for p in variants.load()["cu130"]["pip"])
    assert set(pins) == {
        "nvidia-cuda-nvcc",
        "nvidia-cuda-crt",
        "nvidia-nvvm",
        "nvidia-cuda-runtime",
        "nvidia-cuda-cccl",
    }
    assert all(version.startswith("13.0.") for version in pins.values())


def test_the_check_rejects_a_bad_table(tmp_path: Path) -> None:
    table = tmp_path / "variants.toml"
    table.write_text(
        '[gpu_tests]\nrunners = ["sm80"]\n'
        '[defaults]\narchs = "75;80"\nplatform = "manylinux_2_28_x86_64"\npython_tag = "py3"\n'
        '[variant.cu124]\ncuda = "12.6.1"\ndriver = "1"\ntorch = ["2.4.1"]\nrpm = "12-6"\n'
        '[variant.cu126]\ncuda = "12.6.1"\ndriver = "1"\ntorch = ["2.4.1"]\narchs = "80;120"\n'
        'pip = ["nvidia-cuda-nvcc"]\n'
    )
    problems = "\n".join(variants.check(variants.load(table)))
    assert "cu124: cuda 12.6.1 does not match the name" in problems
    assert "cu126: CUDA 12.6.1 cannot compile sm_120" in problems
    assert "cu126: pip packages must be pinned" in problems


def test_the_gpu_matrix_crosses_runners_variants_and_torch() -> None:
    matrix = variants.gpu_matrix()
    table = variants.load()
    runners = {row["arch"] for row in matrix}
    assert runners == {"sm75", "sm80", "sm86", "sm89", "sm90"}
    assert len(matrix) == len(runners) * sum(len(v["torch"]) for v in table.values())


def test_fields_for_shell_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    assert variants.main(["cu130", "archs"]) == 0
    assert capsys.readouterr().out.strip() == "75;80;86;89;90a;100;120"
    assert variants.main(["cu124", "torch"]) == 0
    assert capsys.readouterr().out.split() == variants.load()["cu124"]["torch"]
    assert variants.main(["cu124", "no_such_field"]) == 2


# ----------------------------------------------------------------- rename ----


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _fake_wheel(folder: Path) -> Path:
    wheel = folder / "samattn-0.1.0-py3-none-linux_x86_64.whl"
    files = {
        "samattn/__init__.py": b"",
        "samattn/lib/libsamattn.so": b"\x7fELF",
        "samattn-0.1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: samattn\n"
        b"Version: 0.1.0\nRequires-Dist: torch>=2.4\n\nName: samattn in the README\n",
        "samattn-0.1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n",
    }
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items())
    record += "samattn-0.1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16 if name.endswith(".so") else 0o644 << 16
            zf.writestr(info, data)
        zf.writestr("samattn-0.1.0.dist-info/RECORD", record)
    return wheel


def test_rename_rewrites_name_metadata_and_record(tmp_path: Path) -> None:
    rename_wheel = _ci_module("rename_wheel")
    renamed = rename_wheel.rename_wheel(_fake_wheel(tmp_path), "samattn-cu130", tmp_path / "out")
    assert renamed.name == "samattn_cu130-0.1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(renamed) as zf:
        names = zf.namelist()
        assert "samattn_cu130-0.1.0.dist-info/METADATA" in names
        assert not any(n.startswith("samattn-0.1.0.dist-info") for n in names)
        metadata = zf.read("samattn_cu130-0.1.0.dist-info/METADATA").decode()
        assert metadata.startswith("Metadata-Version: 2.1\nName: samattn-cu130\n")
        assert "Name: samattn in the README" in metadata  # only the header field changes
        for line in zf.read("samattn_cu130-0.1.0.dist-info/RECORD").decode().splitlines():
            path, digest, size = line.rsplit(",", 2)
            if digest:  # every listed hash is the file's
                data = zf.read(path)
                assert (digest, int(size)) == (_record_hash(data), len(data)), path
        mode = zf.getinfo("samattn/lib/libsamattn.so").external_attr >> 16
        assert mode & 0o777 == 0o755


# --------------------------------------------------------- two variants ----


def test_two_variants_in_one_environment_are_an_import_error(tmp_path: Path) -> None:
    from samattn import _variant

    assert _variant.installed_distributions(tmp_path) == []
    (tmp_path / "samattn_cu130-0.1.0.dist-info").mkdir()
    (tmp_path / "samattn_foo-0.1.0.dist-info").mkdir()  # not a variant
    assert _variant.installed_distributions(tmp_path) == ["samattn-cu130"]
    _variant.check_single_variant(tmp_path)

    (tmp_path / "samattn_cu124-0.1.0.dist-info").mkdir()
    with pytest.raises(ImportError, match=r"samattn-cu124, samattn-cu130") as error:
        _variant.check_single_variant(tmp_path)
    assert "pip uninstall -y samattn-cu124 samattn-cu130" in str(error.value)


def test_the_installed_package_is_a_single_distribution() -> None:
    from samattn import _variant

    assert len(_variant.installed_distributions()) <= 1


# ----------------------------------------------------------------- release ----


def test_the_release_check_wants_the_tag_and_one_wheel_per_variant() -> None:
    check_release = _ci_module("check_release")
    version = importlib.util.spec_from_file_location("v", ROOT / "samattn" / "_version.py")
    module = importlib.util.module_from_spec(version)
    version.loader.exec_module(module)
    wheels = [
        Path(f"samattn_{name}-{module.__version__}-py3-none-manylinux_2_28_x86_64.whl")
        for name in variants.load()
    ]
    assert check_release.problems(f"v{module.__version__}", wheels) == []
    found = check_release.problems("v0.0.0", wheels[1:])
    assert any("does not name version" in p for p in found)
    assert any(p.startswith("missing samattn_cu124") for p in found)


def test_wheel_check_helpers() -> None:
    check_wheel = _ci_module("check_wheel")
    sass, ptx = check_wheel.family_signature(
        "-gencode=arch=compute_80,code=[sm_80,sm_90,sm_120,compute_80]"
    )
    assert sass == {(80, False), (90, False), (120, False)} and ptx == {(80, False)}
    assert check_wheel.cubin_names(
        check_wheel.family_signature("-gencode=arch=compute_90a,code=sm_90a")
    ) == {"sm_90a"}
    assert check_wheel._policy_rank("manylinux_2_28_x86_64") < (2, 34)


# ------------------------------------------------------------ cibuildwheel ----


def test_cibuildwheel_runs_the_ci_scripts() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    assert config["build"] == "cp312-manylinux_x86_64"  # one py3-none wheel per variant
    assert config["manylinux-x86_64-image"] == "manylinux_2_28"
    assert "SAMATTN_VARIANT" in config["environment-pass"]
    commands = [config["before-all"], config["repair-wheel-command"], config["test-command"]]
    commands += config["environment"].values()
    scripts = {
        word.split("/ci/")[-1].split("ci/")[-1]
        for c in commands
        for word in c.split()
        if word.endswith(".py")
    }
    assert scripts == {
        "install_cuda.py",
        "variants.py",
        "repair_wheel.py",
        "check_wheel.py",
        "compile_jobs.py",
    }
    assert all((ROOT / "ci" / script).is_file() for script in scripts)
    assert "--release" in config["test-command"]


# ------------------------------------------------------------ compile jobs ----


def test_compile_jobs_use_the_recorded_peak_or_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compile_jobs = _ci_module("compile_jobs")
    monkeypatch.delenv("SAMATTN_GB_PER_COMPILE_JOB", raising=False)
    build = tmp_path / "build"
    build.mkdir()
    assert compile_jobs.gb_per_job([build])[0] == compile_jobs.DEFAULT_GB_PER_JOB
    # ccache hits alone (a few MiB each) say nothing about a real compile.
    (build / "compile_memory.tsv").write_text("9000\ta.o\n12000\tb.o\n")
    assert compile_jobs.gb_per_job([build])[0] == compile_jobs.DEFAULT_GB_PER_JOB
    with (build / "compile_memory.tsv").open("a") as record:
        record.write(f"{3_500_000_000 // 1024}\tattention_bwd.o\n")
    per_job, source = compile_jobs.gb_per_job([build])
    assert per_job == pytest.approx(3.5 * compile_jobs.MARGIN, rel=1e-3)
    assert "recorded" in source
    monkeypatch.setenv("SAMATTN_GB_PER_COMPILE_JOB", "5")
    assert compile_jobs.gb_per_job([build]) == (5.0, "SAMATTN_GB_PER_COMPILE_JOB")
    jobs, _ = compile_jobs.compile_jobs([build])
    assert jobs >= 1


def test_wheel_check_derives_families_and_full_lists_from_the_build() -> None:
    check_wheel = _ci_module("check_wheel")
    assert check_wheel.implied_families(["75", "80"]) == ["sm75", "sm80"]
    assert check_wheel.implied_families(["80", "90a", "120"]) == ["sm80", "sm90"]
    assert check_wheel.implied_families(["75"]) == ["sm75"]
    assert check_wheel.known_from_cmake("SAMATTN_KNOWN_OPS") == ["gemm", "softmax", "attention"]


def test_repair_asks_auditwheel_for_exactly_one_platform_tag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repair_wheel = _ci_module("repair_wheel")
    commands = []

    def fake_auditwheel(command: list[str], check: bool) -> None:
        commands.append(command)
        out = Path(command[command.index("-w") + 1])
        name = Path(command[2]).name.replace("linux_x86_64", "manylinux_2_28_x86_64")
        (out / name).write_bytes(b"")

    # The module's own name for subprocess, not subprocess.run itself: other threads of
    # this process (test_binary.py's disassembly) call subprocess.run meanwhile.
    monkeypatch.setattr(repair_wheel, "subprocess", types.SimpleNamespace(run=fake_auditwheel))
    repaired = repair_wheel.repair(
        _fake_wheel(tmp_path), tmp_path / "dest", variants.load()["cu130"]
    )
    assert repaired.name == "samattn_cu130-0.1.0-py3-none-manylinux_2_28_x86_64.whl"
    (command,) = commands
    assert command[:2] == ["auditwheel", "repair"]
    assert command[command.index("--plat") + 1] == "manylinux_2_28_x86_64"
    assert "--only-plat" in command  # never a compound tag
