"""Installs the CUDA toolkit of one wheel variant (ci/variants.toml) into a prefix.

    python ci/install_cuda.py cu130 PREFIX               the variant's first available method
    python ci/install_cuda.py cu124 PREFIX --method rpm  NVIDIA's RHEL 8 repository (root, dnf)
    python ci/install_cuda.py cu124 PREFIX --method deb  Debian's nvidia-cuda-toolkit
    python ci/install_cuda.py cu130 PREFIX --method pip  NVIDIA's pip packages

Afterwards PREFIX/bin/nvcc compiles and PREFIX is a CUDA_HOME that CMake's CUDA
language and FindCUDAToolkit accept (include/, lib/ with libcudart_static.a,
lib64 -> lib, targets/x86_64-linux/). Only the compiler, the runtime headers
and the static runtime are installed: nothing else is linked. Running it again
with the toolkit in place does nothing (prints the nvcc version).

Methods, chosen in this order when --method is not given:
  pip  (variant lists `pip` packages): pip install --target, then laid out as a toolkit.
  rpm  (dnf present, root): cuda-nvcc-X-Y, cuda-cudart-devel-X-Y, ... from NVIDIA's
       repository, installed under /usr/local/cuda-X.Y; PREFIX becomes a link to it.
  deb  (apt-get present): the .debs of Debian's nvidia-cuda-toolkit for the variant's
       suite, fetched with a private apt configuration (the host's sources and
       installed packages are untouched) and unpacked with dpkg -x into PREFIX.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import variants

# Written into every prefix this script fills: only such a prefix is ever replaced.
MARKER = ".samattn-toolkit"
RPM_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo"
RPM_PACKAGES = ["cuda-nvcc", "cuda-cudart-devel", "cuda-crt", "cuda-nvvm", "cuda-cccl"]
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What nvcc needs from Debian's packages, by path prefix: the compiler drivers, cicc and
# libdevice, the runtime headers and static runtime, and CCCL (thrust, cub, libcu++). The
# packages are large (nvidia-cuda-dev holds every math library); nothing else is unpacked.
DEB_CONTENTS = {
    "nvidia-cuda-toolkit": [
        "usr/bin/",
        "usr/lib/nvidia-cuda-toolkit/bin/",
        "usr/include/",
        "usr/lib/nvidia-cuda-toolkit/libdevice/",
    ],
    "nvidia-cuda-dev": [
        "usr/include/",
        "usr/lib/x86_64-linux-gnu/libcudart_static.a",
        "usr/lib/x86_64-linux-gnu/libcudadevrt.a",
        "usr/lib/x86_64-linux-gnu/libculibos.a",
        "usr/lib/x86_64-linux-gnu/libcudart.so",
    ],
    "libcudart12": ["usr/lib/x86_64-linux-gnu/libcudart.so."],
    "libcu++-dev": ["usr/include/"],
    "libthrust-dev": ["usr/include/"],
    "libcub-dev": ["usr/include/"],
}


def run(*command: str, **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, check=True, **kwargs)


def nvcc_version(prefix: Path) -> str | None:
    nvcc = prefix / "bin" / "nvcc"
    if not nvcc.is_file():
        return None
    result = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True)
    lines = result.stdout.strip().splitlines()
    return lines[-2] if result.returncode == 0 and len(lines) >= 2 else None


def link_target_dirs(prefix: Path) -> None:
    """lib64 and targets/x86_64-linux/{include,lib}: where nvcc.profile and CMake look."""
    if not (prefix / "lib64").exists():
        (prefix / "lib64").symlink_to("lib")
    target = prefix / "targets" / "x86_64-linux"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("include", "lib"):
        if not (target / name).exists():
            (target / name).symlink_to(Path("..", "..", name))


# ------------------------------------------------------------------ pip ----


def install_pip(variant: dict, prefix: Path) -> None:
    with tempfile.TemporaryDirectory(dir=prefix.parent) as tmp:
        run(
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            tmp,
            *variant["pip"],
        )
        # Every NVIDIA CUDA 13 package installs into nvidia/cu13/{bin,include,lib,nvvm}.
        trees = [p for p in (Path(tmp) / "nvidia").iterdir() if (p / "bin" / "nvcc").is_file()]
        if len(trees) != 1:
            raise SystemExit(f"expected one nvidia/*/bin/nvcc in {variant['pip']}")
        shutil.rmtree(prefix, ignore_errors=True)
        shutil.move(str(trees[0]), prefix)
    lib = prefix / "lib"
    for soname in lib.glob("*.so.*"):  # libcudart.so -> libcudart.so.13, as a toolkit has
        plain = lib / (soname.name.split(".so.")[0] + ".so")
        if not plain.exists():
            plain.symlink_to(soname.name)
    link_target_dirs(prefix)


# ------------------------------------------------------------------ rpm ----


def install_rpm(variant: dict, prefix: Path) -> None:
    suffix = variant["rpm"]
    packages = [f"{name}-{suffix}" for name in RPM_PACKAGES]
    if variants.field(variant, "host_cxx") != variants.GCC_TOOLSET_13_GXX and tuple(
        int(x) for x in variant["cuda"].split(".")[:2]
    ) < (12, 8):
        packages.append("gcc-toolset-13-gcc-c++")  # the newest GCC that CUDA < 12.8 accepts
    run("dnf", "install", "-y", "-q", "dnf-plugins-core")
    run("dnf", "config-manager", "--add-repo", RPM_REPO)
    # strict=0: older toolkits have no separate crt/nvvm packages (nvcc holds them).
    run(
        "dnf",
        "install",
        "-y",
        "-q",
        "--setopt=install_weak_deps=False",
        "--setopt=strict=0",
        *packages,
    )
    installed = Path("/usr/local") / f"cuda-{suffix.replace('-', '.')}"
    if prefix != installed:
        if prefix.is_symlink() or prefix.is_file():
            prefix.unlink()
        elif prefix.exists():
            shutil.rmtree(prefix)
        prefix.symlink_to(installed)


# ------------------------------------------------------------------ deb ----


def install_deb(variant: dict, prefix: Path) -> None:
    suite, packages = variant["deb"]["suite"], variant["deb"]["packages"]
    with tempfile.TemporaryDirectory(dir=prefix.parent) as tmp:
        state = Path(tmp)
        # A private apt: its own sources (the suite's non-free), lists and cache, so that
        # nothing of the host's apt configuration or installed packages changes.
        (state / "sources.list").write_text(
            f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {DEBIAN_MIRROR} "
            f"{suite} main contrib non-free\n"
        )
        for sub in ("lists/partial", "cache/archives/partial", "debs", "root"):
            (state / sub).mkdir(parents=True)
        (state / "status").touch()
        apt = [
            f"-oDir::Etc::SourceList={state / 'sources.list'}",
            "-oDir::Etc::SourceParts=/nonexistent",
            f"-oDir::State::Lists={state / 'lists'}",
            f"-oDir::State::Status={state / 'status'}",
            f"-oDir::Cache={state / 'cache'}",
            "-oAPT::Architecture=amd64",
            "-oAPT::Sandbox::User=root",
        ]
        run("apt-get", *apt, "update", "-qq")
        run("apt-get", *apt, "download", "-q", *packages, cwd=state / "debs")
        for deb in sorted((state / "debs").glob("*.deb")):
            wanted = DEB_CONTENTS[deb.name.split("_")[0]]
            unpack_deb(deb, wanted, state / "root")
        shutil.rmtree(prefix, ignore_errors=True)
        layout_debian_toolkit(state / "root", prefix)


def unpack_deb(deb: Path, wanted: list[str], root: Path) -> None:
    """Extracts the members of a .deb whose path starts with one of `wanted`."""
    print(f"unpacking {deb.name}: {', '.join(wanted)}", flush=True)
    stream = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    with tarfile.open(fileobj=stream.stdout, mode="r|") as archive:
        for member in archive:
            name = member.name.removeprefix("./")
            if (member.isfile() or member.issym()) and name.startswith(tuple(wanted)):
                archive.extract(member, root, filter="tar")
    if stream.wait() != 0:
        raise SystemExit(f"dpkg-deb could not read {deb}")


def layout_debian_toolkit(root: Path, prefix: Path) -> None:
    """Debian spreads the toolkit over /usr/lib/nvidia-cuda-toolkit (nvcc, cicc, libdevice),
    /usr/bin (ptxas, fatbinary, ...), /usr/include and /usr/lib/x86_64-linux-gnu; gather
    what nvcc needs into a CUDA_HOME with an nvcc.profile that points into it."""
    usr = root / "usr"
    toolkit = usr / "lib" / "nvidia-cuda-toolkit"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "nvvm" / "bin").mkdir(parents=True)
    for folder in (usr / "bin", toolkit / "bin"):
        for tool in sorted(folder.iterdir()):
            # Skip the symlinks into /usr and Debian's gcc/g++ wrappers (the host's are used).
            if tool.is_file() and not tool.is_symlink() and tool.name not in ("gcc", "g++"):
                shutil.copy2(tool, prefix / "bin" / tool.name)
    shutil.copytree(toolkit / "bin" / "crt", prefix / "bin" / "crt")
    shutil.move(str(prefix / "bin" / "cicc"), prefix / "nvvm" / "bin" / "cicc")
    shutil.copytree(toolkit / "libdevice", prefix / "nvvm" / "libdevice")
    shutil.copytree(usr / "include", prefix / "include", symlinks=True)
    shutil.copytree(usr / "lib" / "x86_64-linux-gnu", prefix / "lib", symlinks=True)
    (prefix / "bin" / "nvcc.profile").write_text(
        "TOP              = $(_HERE_)/..\n"
        "NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice\n"
        "LD_LIBRARY_PATH += $(TOP)/lib:\n"
        "PATH            += $(TOP)/nvvm/bin:$(_HERE_):\n"
        'INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)\n'
        'LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib"\n'
    )
    link_target_dirs(prefix)


# ----------------------------------------------------------------- main ----

INSTALLERS = {"pip": install_pip, "rpm": install_rpm, "deb": install_deb}


def default_method(variant: dict) -> str:
    if "pip" in variant:
        return "pip"
    if "rpm" in variant and shutil.which("dnf") and os.geteuid() == 0:
        return "rpm"
    if "deb" in variant and shutil.which("apt-get"):
        return "deb"
    raise SystemExit(
        f"{variant['name']}: no way to install CUDA {variant['cuda']} here "
        "(needs pip packages in the table, dnf as root, or a `deb` entry and apt-get)"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variant", help="a variant of ci/variants.toml, e.g. cu130")
    parser.add_argument("prefix", type=Path, help="where the toolkit goes (its CUDA_HOME)")
    parser.add_argument("--method", choices=sorted(INSTALLERS))
    args = parser.parse_args(argv)
    table = variants.load()
    if args.variant not in table:
        raise SystemExit(f"unknown variant {args.variant!r}; known: {', '.join(table)}")
    variant = table[args.variant]
    prefix = args.prefix.absolute()
    installed = nvcc_version(prefix)
    wanted = "release " + ".".join(variant["cuda"].split(".")[:2])
    if installed and wanted in installed:
        print(f"{prefix}: {installed} already installed")
        return 0
    method = args.method or default_method(variant)
    if method not in variant:
        raise SystemExit(f"{args.variant}: the table gives no `{method}` entry")
    # Never replace a folder this script did not make (say, an existing /usr/local/cuda).
    if prefix.exists() and any(prefix.iterdir()) and not (prefix / MARKER).exists():
        raise SystemExit(
            f"{prefix} exists and was not made by {Path(__file__).name}: choose another prefix"
        )
    prefix.parent.mkdir(parents=True, exist_ok=True)
    INSTALLERS[method](variant, prefix)
    (prefix / MARKER).write_text(f"{args.variant} {variant['cuda']} ({method})\n")
    installed = nvcc_version(prefix)
    if not installed or wanted not in installed:
        raise SystemExit(f"{prefix}/bin/nvcc does not report {wanted}: {installed}")
    print(f"{prefix}: {installed} ({method})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
