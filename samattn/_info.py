"""``samattn.info()`` / ``python -m samattn.info``: what samattn will run here, and why.

Prints the library (path, version, families, ops and archs read from its binary), the
CUDA runtime and driver versions, torch, and for each visible GPU its compute capability
and the kernel family each op x dtype would use. Works without a GPU or driver.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

import torch

from . import _checks, _family, _lib
from ._variant import VARIANT_CUDA
from ._version import __version__

_MAX_DEVICES = 64
# The oldest Linux driver that runs a CUDA runtime of each major version, by CUDA's
# minor-version compatibility (a 12.8 runtime runs on any 12.x driver from this one).
_MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}


def _cuda_version_text(encoded: int) -> str | None:
    """12040 -> "12.4"; 0 (no driver) -> None."""
    if encoded <= 0:
        return None
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def driver_status(runtime: int, driver: int) -> dict[str, str | None]:
    """Whether the NVIDIA driver can run this library, from the CUDA versions that
    `_lib.cuda_versions()` reports (12040 = 12.4; driver 0 = no driver).

    Returns {"status": ..., "message": ...}, status one of "ok", "none" (no NVIDIA driver),
    "too_old" (a driver of an older CUDA major version than the library's runtime: nothing
    runs) and "minor_older" (an older minor version: runs, except PTX compiled by the
    driver); the message is None when status is "ok"."""
    if driver <= 0:
        return {
            "status": "none",
            "message": "no NVIDIA driver is installed, or it cannot be loaded; samattn's "
            "kernels need one, but the library, this report and the CPU tests work without it",
        }
    if runtime <= 0 or driver >= runtime:
        return {"status": "ok", "message": None}
    runtime_text, driver_text = _cuda_version_text(runtime), _cuda_version_text(driver)
    major, driver_major = runtime // 1000, driver // 1000
    minimum = _MIN_DRIVER.get(major)
    update = f"an NVIDIA driver >= {minimum} (Linux)" if minimum else "a newer NVIDIA driver"
    if driver_major < major:
        usable = [
            name
            for name, (cuda_major, _) in VARIANT_CUDA.items()
            if cuda_major == driver_major and driver_major in _MIN_DRIVER
        ]
        instead = (
            f", or a samattn built for CUDA {driver_major}.x ({', '.join(usable)}, or a source "
            f"build with a CUDA {driver_major}.x toolkit)"
            if usable
            else ""
        )
        return {
            "status": "too_old",
            "message": f"the NVIDIA driver supports CUDA {driver_text}, older than this "
            f"library's CUDA {runtime_text} runtime, so no kernel can run: install {update}"
            f"{instead}",
        }
    return {
        "status": "minor_older",
        "message": f"the NVIDIA driver supports CUDA {driver_text}, older than this library's "
        f"CUDA {runtime_text} runtime: its kernels run (CUDA minor-version compatibility, "
        f"drivers >= {minimum}), but a GPU newer than the library's archs, which needs its PTX "
        f"compiled by the driver, needs a driver for CUDA {runtime_text} or newer",
    }


def _archs(path: str) -> dict[str, list[str]] | str:
    """{"sass": ["sm_75", ..., "sm_90a"], "ptx": ["compute_80"]} read from the library."""
    try:
        from ._fatbin import read_fatbin_archs

        found = read_fatbin_archs(path)
    except Exception:
        return "unknown"
    names: dict[str, set[tuple[int, str]]] = {"sass": set(), "ptx": set()}
    for entry in found["entries"]:
        names[entry["kind"]].add((entry["arch"], "a" if entry["arch_specific"] else ""))
    prefix = {"sass": "sm", "ptx": "compute"}
    return {
        kind: [f"{prefix[kind]}_{arch}{suffix}" for arch, suffix in sorted(found_names)]
        for kind, found_names in names.items()
    }


def _family_choices(cc: tuple[int, int]) -> dict[str, dict[str, str]]:
    """Family per op x dtype for this compute capability, or "error: <message>"."""
    allow_tf32 = torch.get_float32_matmul_precision() != "highest"
    choices: dict[str, dict[str, str]] = {}
    for op in _lib.OP_CODES:
        choices[op] = {}
        for dtype, code in _checks.DTYPE_CODES.items():
            name = str(dtype).removeprefix("torch.")
            try:
                family = _lib.select_family(op, code, cc, _family.requested_family(), allow_tf32)
                choices[op][name] = family
            except (ValueError, RuntimeError) as error:
                choices[op][name] = f"error: {error}"
    return choices


def _gpus() -> tuple[list[dict[str, Any]], str | None]:
    gpus: list[dict[str, Any]] = []
    for index in range(_MAX_DEVICES):
        try:
            properties = _lib.device_properties(index)
        except ValueError:  # past the last device
            break
        except RuntimeError as error:
            return gpus, str(error)
        major, minor = properties["compute_capability"]
        gpus.append(
            {
                "index": index,
                "name": properties["name"],
                "compute_capability": f"{major}.{minor}",
                "sm_count": properties["sm_count"],
                "families": _family_choices((major, minor)),
            }
        )
    return gpus, None


def collect() -> dict[str, Any]:
    """The facts info() prints, as a dict (never raises)."""
    facts: dict[str, Any] = {
        "samattn_version": __version__,
        "library": {"path": str(_lib.library_path()), "loaded": False, "error": None},
        "built_families": [],
        "built_ops": [],
        "archs": "unknown",
        "cuda_runtime": None,
        "cuda_driver": None,
        "driver": {"status": "unknown", "message": None},
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gpus": [],
        "gpu_error": None,
    }
    try:
        _lib.lib()
    except ImportError as error:
        facts["library"]["error"] = str(error)
        facts["gpu_error"] = "unknown: the library did not load"
        return facts
    facts["library"].update(
        loaded=True, version=_lib.version(), abi_version=_lib.lib().samattn_abi_version()
    )
    facts["built_families"] = _lib.built_families()
    facts["built_ops"] = _lib.built_ops()
    facts["archs"] = _archs(facts["library"]["path"])
    runtime, driver = _lib.cuda_versions()
    facts["cuda_runtime"] = _cuda_version_text(runtime)
    facts["cuda_driver"] = _cuda_version_text(driver)
    facts["driver"] = driver_status(runtime, driver)
    facts["gpus"], facts["gpu_error"] = _gpus()
    if not facts["gpus"] and facts["driver"]["status"] in ("none", "too_old"):
        # The CUDA runtime's own words for both are "driver version is insufficient".
        facts["gpu_error"] = facts["driver"]["message"]
    elif not facts["gpus"] and facts["gpu_error"] is None:
        facts["gpu_error"] = "no device answered"
    return facts


def _archs_text(archs: dict[str, list[str]] | str) -> str:
    if isinstance(archs, str):
        return archs
    return f"SASS {', '.join(archs['sass']) or 'none'}; PTX {', '.join(archs['ptx']) or 'none'}"


def _driver_text(facts: dict[str, Any]) -> str:
    status = facts["driver"]["status"]
    if status == "none":
        return "none (no NVIDIA driver found)"
    if status == "too_old":
        return f"{facts['cuda_driver']} (TOO OLD: {facts['driver']['message']})"
    if status == "minor_older":
        return f"{facts['cuda_driver']} ({facts['driver']['message']})"
    return facts["cuda_driver"] or "unknown"


def format_report(facts: dict[str, Any]) -> str:
    """The text info() prints for `facts` (from collect())."""
    library = facts["library"]
    lines = [f"samattn {facts['samattn_version']}"]
    if library["loaded"]:
        lines.append(
            f"  library        {library['path']} "
            f"(version {library['version']}, C ABI {library['abi_version']})"
        )
    else:
        lines.append(f"  library        NOT LOADED: {library['error']}")
    lines += [
        f"  families built {', '.join(facts['built_families']) or 'none'}",
        f"  ops built      {', '.join(facts['built_ops']) or 'none'}",
        f"  archs          {_archs_text(facts['archs'])}",
        f"  CUDA runtime   {facts['cuda_runtime'] or 'unknown'} (linked into the library)",
        f"  CUDA driver    {_driver_text(facts)}",
        f"  torch          {facts['torch']} (CUDA {facts['torch_cuda'] or 'none'})",
    ]
    forced = _lib.FAMILY_NAMES.get(_family.requested_family())
    if forced:
        lines.append(f"  family forced  {forced} (samattn.use_family)")
    for gpu in facts["gpus"]:
        lines.append(
            f"GPU {gpu['index']}: {gpu['name']}, compute capability "
            f"{gpu['compute_capability']}, {gpu['sm_count']} SMs"
        )
        for op, by_dtype in gpu["families"].items():
            for dtype, family in by_dtype.items():
                lines.append(f"  {op:<8} {dtype:<9} -> {family}")
    if not facts["gpus"]:
        lines.append(f"no CUDA GPU visible: {facts['gpu_error']}")
    return "\n".join(lines)


def info(file: TextIO | None = None) -> dict[str, Any]:
    """Print what samattn will run on this machine (to stdout by default); return the facts.

    The dict has keys ``samattn_version``, ``library`` (path, loaded, version, error),
    ``built_families``, ``built_ops``, ``archs`` ({"sass": [...], "ptx": [...]} or
    "unknown"), ``cuda_runtime``, ``cuda_driver``, ``driver`` (``driver_status()``: whether
    that driver runs this library, and if not what would), ``torch``, ``torch_cuda``,
    ``gpus`` (per GPU: index, name, compute_capability, sm_count, families per op and dtype)
    and ``gpu_error``.
    """
    facts = collect()
    print(format_report(facts), file=file if file is not None else sys.stdout)
    return facts


def main() -> int:
    """Entry point of ``python -m samattn.info``: 0 unless the library cannot be loaded."""
    facts = info()
    return 0 if facts["library"]["loaded"] else 1
