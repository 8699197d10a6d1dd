"""Loading libsamattn: absolute path, ABI and version, exported symbols, struct layout."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import samattn
from samattn import _lib

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "cpp" / "include" / "samattn" / "samattn.h"


def _header_functions() -> set[str]:
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    return set(re.findall(r"\b(samattn_\w+)\s*\(", text))


def test_loads_by_absolute_path():
    path = _lib.library_path()
    assert path.is_absolute()
    handle = _lib.lib()
    assert Path(handle._name) == path  # ctypes was given the absolute path


def test_abi_and_version():
    lib = _lib.lib()
    assert lib.samattn_abi_version() == _lib.ABI_VERSION
    assert _lib.version() == samattn.__version__


def test_built_families_and_ops_are_known():
    assert set(samattn.built_families()) <= {"sm75", "sm80", "sm90"}
    # The families are what registered kernels: a library built with no op (SAMATTN_OPS=none)
    # has none.
    assert samattn.built_families() or not _lib.built_ops(), "ops built without a family"
    assert set(_lib.built_ops()) <= {"gemm", "softmax", "attention"}


def test_bindings_cover_the_header():
    assert set(_lib.SIGNATURES) == _header_functions()


def test_exports_exactly_the_c_api():
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not available")
    out = subprocess.run(
        [nm, "-D", "--defined-only", str(_lib.library_path())],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert exported == _header_functions(), f"unexpected exports: {exported ^ _header_functions()}"


def _c_layout(struct: str, fields: list[str]) -> list[int]:
    """sizeof and offsetof of each field, as the C compiler lays out the header's struct."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler to check the struct layout")
    prints = "".join(f'printf("%zu\\n", offsetof({struct}, {f}));' for f in fields)
    source = (
        "#include <stddef.h>\n#include <stdio.h>\n#include <samattn/samattn.h>\n"
        f'int main(void) {{ printf("%zu\\n", sizeof({struct})); {prints} return 0; }}\n'
    )
    return [int(v) for v in _compile_and_run(compiler, source).split()]


def _compile_and_run(compiler: str, source: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "layout.c", Path(tmp) / "layout"
        src.write_text(source)
        subprocess.run(
            [compiler, f"-I{ROOT / 'cpp' / 'include'}", str(src), "-o", str(exe)], check=True
        )
        return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize(
    "struct, ctype",
    [
        ("samattn_gemm_args", _lib.GemmArgs),
        ("samattn_gemm_list_entry", _lib.GemmListEntry),
        ("samattn_softmax_args", _lib.SoftmaxArgs),
        ("samattn_attention_args", _lib.AttentionArgs),
    ],
)
def test_struct_layout_matches_header(struct, ctype):
    fields = [name for name, _ in ctype._fields_]
    expected = _c_layout(struct, fields)
    actual = [ctypes.sizeof(ctype)] + [getattr(ctype, f).offset for f in fields]
    assert actual == expected


def _header_struct_fields(struct: str) -> list[str]:
    """The field names of a struct of the header, in order (no C compiler needed)."""
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    body = re.search(rf"typedef struct {struct} \{{(.*?)\}} {struct};", text, flags=re.S)
    names = []
    for declaration in body.group(1).split(";"):
        declaration = declaration.strip()
        if declaration:
            declarators = re.sub(r"^(const\s+)?\w+\s*\**", "", declaration)
            names += [name.strip(" *") for name in declarators.split(",")]
    return names


def test_attention_args_fields_follow_the_header():
    assert [name for name, _ in _lib.AttentionArgs._fields_] == _header_struct_fields(
        "samattn_attention_args"
    )


def test_fp8_kv_cache_fields_and_codes():
    """The fp8 KV-cache fields appended to ABI 6, at the header's offsets on LP64 (the
    compiled check above is test_struct_layout_matches_header), and their element codes."""
    header = HEADER.read_text()
    assert re.search(r"SAMATTN_F8_E4M3 = 4\b", header) and _lib.F8_E4M3 == 4
    assert re.search(r"SAMATTN_F8_E5M2 = 5\b", header) and _lib.F8_E5M2 == 5
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        pytest.skip("the offsets below are LP64's")
    offsets = {
        name: getattr(_lib.AttentionArgs, name).offset
        for name in ("dropout_seed", "kv_fp8", "kv_fp8_reserved", "k_scale_ptr", "v_scale_ptr",
                     "kv_scale_head_stride", "k_scale_value", "v_scale_value")
    }  # fmt: skip
    assert offsets == {
        "dropout_seed": 712, "kv_fp8": 720, "kv_fp8_reserved": 724, "k_scale_ptr": 728,
        "v_scale_ptr": 736, "kv_scale_head_stride": 744, "k_scale_value": 752,
        "v_scale_value": 756,
    }  # fmt: skip
    assert ctypes.sizeof(_lib.AttentionArgs) == 760 == _lib.ATTENTION_PACKER.size
    # Built with the constructor: the scales default to 1.0, the header's value for
    # calls without an fp8 cache; the struct's size is its own.
    args = _lib.AttentionArgs(dtype=_lib.BF16)
    assert (args.kv_fp8, args.k_scale_ptr, args.v_scale_ptr, args.kv_scale_head_stride) == (
        0, None, None, 0,
    )  # fmt: skip
    assert (args.k_scale_value, args.v_scale_value, args.struct_size) == (1.0, 1.0, 760)
    assert _lib.AttentionArgs(k_scale_value=0.5).k_scale_value == 0.5


def _python(code: str, library: Path) -> str:
    """stdout of `python -c code` importing this samattn, with SAMATTN_LIBRARY=library."""
    package_parent = str(Path(samattn.__file__).resolve().parents[1])
    env = dict(os.environ, SAMATTN_LIBRARY=str(library))
    env["PYTHONPATH"] = os.pathsep.join([package_parent, env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return result.stdout


_LOAD = (
    "import samattn._lib as l\ntry:\n    l.lib()\nexcept ImportError as e:\n    print('ERR', e)\n"
)


def test_missing_library_message(tmp_path):
    missing = tmp_path / "nowhere" / "libsamattn.so"
    out = _python(_LOAD, missing)
    assert out.startswith("ERR"), out
    assert str(missing) in out and "SAMATTN_LIBRARY" in out and "build" in out


def test_unloadable_library_message(tmp_path):
    bogus = tmp_path / "libsamattn.so"
    bogus.write_text("not an ELF file")
    out = _python(_LOAD, bogus)
    assert out.startswith("ERR") and "cannot load" in out and str(bogus) in out, out


def test_import_does_not_need_the_library(tmp_path):
    """`import samattn` works without the library; the first use says what is missing."""
    out = _python("import samattn; print(samattn.__version__)", tmp_path / "none.so")
    assert out.strip() == samattn.__version__
