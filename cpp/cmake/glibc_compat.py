"""Link-time stubs that keep libsamattn at the glibc symbol versions of manylinux_2_28.

    python glibc_compat.py stubs --objdump OBJDUMP --libc LIBC [--compiler CXX --out DIR]
    python glibc_compat.py check --objdump OBJDUMP --max 2.28 [--warn-only] LIBRARY

glibc 2.34 moved libpthread, libdl and librt into libc.so.6 and gave every moved function
a new default version, GLIBC_2.34, keeping the old one (pthread_create@GLIBC_2.2.5,
dlmopen@GLIBC_2.3.4, ...) as a compat version that only already-linked programs reach.
Linked on such a host, the static CUDA runtime's calls to pthread_*, sem_*, dl* and shm_*
bind to the GLIBC_2.34 versions, and the library needs glibc 2.34.

`stubs` reads the host's libc.so.6 (objdump -T lists both versions of each moved
function) and writes, for each old library, a stub shared library with that library's
soname (libpthread.so.0, libdl.so.2, librt.so.1) that defines each moved function at its
pre-2.34 default version (the newest of its compat versions), through a linker version
script. Linked ahead of libc, the stubs take the references: the library then imports
pthread_create@GLIBC_2.2.5 from libpthread.so.0, as if it had been linked on an older
glibc. The stubs are only read by the linker; they are never installed or loaded (each
function is a trap). At run time the real libraries answer: before 2.34 they hold the
functions; since 2.34 they are placeholders that still define the old version nodes,
and the dynamic linker finds the compat versions in libc.so.6.

Only moves are redirected (the default version is exactly GLIBC_2.34 and the symbol
comes from one of LIBRARIES), never a symbol whose newer version changed its ABI.

`check` lists the glibc versions LIBRARY imports and fails (or warns, --warn-only) if
any is newer than --max: a symbol no stub covers (a new need of the CUDA runtime, a
libm function that glibc 2.29 versioned anew, an inline libstdc++ header that reads
__libc_single_threaded) shows up there by name. Prints one line per problem.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

# The release in which libpthread, libdl and librt moved into libc.so.6.
MOVE_VERSION = "GLIBC_2.34"
# The libraries whose moved functions get stubs, with the functions they held before the
# move (glibc's own split). libutil, libanl and libresolv also moved; nothing here uses
# them, and `check` names any of their functions that a build starts to use.
LIBRARIES = {
    "libpthread.so.0": r"_*pthread_\w+|sem_\w+|(thrd|mtx|cnd|tss)_\w+|call_once",
    "libdl.so.2": r"dl(open|mopen|close|sym|vsym|error|addr1?|info)",
    "librt.so.1": r"shm_\w+|mq_\w+|__mq_open_2|aio_\w+|lio_listio(64)?|timer_\w+",
}

# One line of `objdump -T`: "<value> <flags> D<type> <section> <size> <version> <name>",
# the version in parentheses when it is hidden (a compat version) or a reference.
_DYNAMIC_LINE = re.compile(
    r"\sD(?P<type>[FO]?)\s+(?P<section>\S+)\s+[0-9a-fA-F]+\s+"
    r"(?P<hidden>\()?(?P<version>[^\s()]+)\)?\s+(?P<name>\S+)\s*$"
)


class Symbol(NamedTuple):
    name: str
    version: str  # "GLIBC_2.2.5", "Base", ...
    hidden: bool  # a compat version (shown in parentheses); always True for references
    undefined: bool
    function: bool


def parse_dynamic_symbols(listing: str) -> list[Symbol]:
    """The versioned dynamic symbols of an `objdump -T` listing."""
    symbols = []
    for line in listing.splitlines():
        match = _DYNAMIC_LINE.search(line)
        if match:
            symbols.append(
                Symbol(
                    name=match["name"],
                    version=match["version"],
                    hidden=bool(match["hidden"]),
                    undefined=match["section"] == "*UND*",
                    function=match["type"] == "F",
                )
            )
    return symbols


def dynamic_symbols(objdump: str, path: Path) -> list[Symbol]:
    listing = subprocess.run(
        [objdump, "-T", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return parse_dynamic_symbols(listing)


def version_key(version: str) -> tuple[int, ...] | None:
    """GLIBC_2.3.4 -> (2, 3, 4); None for anything else (GLIBC_PRIVATE, GLIBCXX_3.4)."""
    match = re.fullmatch(r"GLIBC_(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match[1].split(".")) if match else None


def library_of(name: str) -> str | None:
    return next((lib for lib, names in LIBRARIES.items() if re.fullmatch(names, name)), None)


def moved_functions(libc: list[Symbol]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """({library: {function: its pre-2.34 version}}, moved symbols of no library here),
    read from libc.so.6's definitions."""
    versions: dict[str, list[Symbol]] = defaultdict(list)
    for symbol in libc:
        if not symbol.undefined and version_key(symbol.version):
            versions[symbol.name].append(symbol)
    moved: dict[str, dict[str, str]] = defaultdict(dict)
    other = []
    for name, definitions in sorted(versions.items()):
        if not any(d.version == MOVE_VERSION and not d.hidden for d in definitions):
            continue
        older = [
            d.version
            for d in definitions
            if d.hidden and version_key(d.version) < version_key(MOVE_VERSION)
        ]
        if not older:
            continue  # new in 2.34 (closefrom): nothing older to bind to
        library = library_of(name)
        if library is None or not all(d.function for d in definitions):
            other.append(name)
            continue
        moved[library][name] = max(older, key=version_key)
    return dict(moved), other


def stub_sources(functions: dict[str, str]) -> tuple[str, str]:
    """(C++ source, linker version script) of a stub library defining `functions`."""
    source = ["// Generated by cpp/cmake/glibc_compat.py: link-time stubs, never loaded."]
    source += [f'extern "C" void {name}() {{ __builtin_trap(); }}' for name in sorted(functions)]
    by_version: dict[str, list[str]] = defaultdict(list)
    for name, version in functions.items():
        by_version[version].append(name)
    script = []
    for index, version in enumerate(sorted(by_version, key=version_key)):
        names = " ".join(f"{name};" for name in sorted(by_version[version]))
        local = " local: *;" if index == 0 else ""
        script.append(f"{version} {{ global: {names}{local} }};")
    return "\n".join(source) + "\n", "\n".join(script) + "\n"


def build_stubs(moved: dict[str, dict[str, str]], compiler: str, out: Path) -> dict[str, Path]:
    """Compiles one stub library per old library into `out`: {soname: path}. A stub whose
    source and version script are unchanged is kept as it is (no relink of libsamattn)."""
    out.mkdir(parents=True, exist_ok=True)
    built = {}
    for library, functions in sorted(moved.items()):
        stem = library.split(".so")[0]
        source, script = out / f"{stem}.cpp", out / f"{stem}.map"
        target = out / library
        changed = not target.is_file()
        for path, text in zip((source, script), stub_sources(functions)):
            if not path.is_file() or path.read_text() != text:
                path.write_text(text)
                changed = True
        if changed:
            target.unlink(missing_ok=True)
            command = [
                compiler,
                "-shared",
                "-fPIC",
                "-nostdlib",
                "-fno-builtin",
                "-o",
                str(target),
                f"-Wl,-soname,{library}",
                f"-Wl,--version-script,{script}",
                str(source),
            ]
            subprocess.run(command, check=True)
        built[library] = target
    return built


def newer_imports(symbols: list[Symbol], maximum: str) -> list[str]:
    """The glibc references (name@GLIBC_x.y) newer than glibc `maximum` ("2.28")."""
    limit = version_key(f"GLIBC_{maximum}")
    return sorted(
        f"{s.name}@{s.version}"
        for s in symbols
        if s.undefined and version_key(s.version) and version_key(s.version) > limit
    )


def version_references(objdump: str, path: Path) -> dict[str, list[str]]:
    """{needed library: the versions required of it} from `objdump -p`."""
    listing = subprocess.run(
        [objdump, "-p", str(path)], capture_output=True, text=True, check=True
    ).stdout
    references: dict[str, list[str]] = {}
    current = None
    for line in listing.split("Version References:", 1)[-1].splitlines():
        required_from = re.match(r"\s*required from (\S+):", line)
        version = re.match(r"\s+0x[0-9a-f]+ 0x[0-9a-f]+ \d+ (\S+)", line)
        if required_from:
            current = references.setdefault(required_from[1], [])
        elif version and current is not None:
            current.append(version[1])
    return references


def _stubs(args: argparse.Namespace) -> int:
    """One line per stub library: "<path or soname>\t<what it defines>"; none for a glibc
    before 2.34 (nothing moved)."""
    moved, other = moved_functions(dynamic_symbols(args.objdump, args.libc))
    built = build_stubs(moved, args.compiler, args.out) if args.out else {}
    for library, functions in sorted(moved.items()):
        versions = sorted(set(functions.values()), key=version_key)
        print(f"{built.get(library, library)}\t{len(functions)} functions at {', '.join(versions)}")
    if moved and other:
        print(f"# not stubbed (moved from libraries samattn does not use): {len(other)}")
    return 0


def _check(args: argparse.Namespace) -> int:
    symbols = dynamic_symbols(args.objdump, args.library)
    newer = newer_imports(symbols, args.max)
    imported = [s.version for s in symbols if s.undefined and version_key(s.version) is not None]
    newest = max(imported, key=version_key) if imported else "none"
    references = version_references(args.objdump, args.library)
    glibc_references = {
        lib: versions
        for lib, versions in sorted(references.items())
        if any(version_key(v) for v in versions)
    }
    summary = "; ".join(
        f"{lib} {' '.join(sorted(v, key=lambda x: version_key(x) or ()))}"
        for lib, v in glibc_references.items()
    )
    name = args.library.name
    if not newer:
        print(f"{name}: glibc versions up to {newest} (at most GLIBC_{args.max}): {summary}")
        return 0
    level = "WARNING" if args.warn_only else "ERROR"
    print(
        f"{level}: {name} imports {len(newer)} glibc symbols newer than GLIBC_{args.max} "
        f"(the manylinux_{args.max.replace('.', '_')} platform refuses them); see "
        "cpp/cmake/glibc_compat.py and docs/release.md, Platform tag:",
        file=sys.stderr,
    )
    for symbol in newer:
        print(f"  {symbol}", file=sys.stderr)
    return 0 if args.warn_only else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    stubs = commands.add_parser("stubs", help="write the stub libraries for this libc")
    stubs.add_argument("--objdump", required=True)
    stubs.add_argument("--libc", required=True, type=Path)
    stubs.add_argument("--compiler", help="the C++ compiler (with --out)")
    stubs.add_argument("--out", type=Path, help="where to write them (without: only list them)")
    check = commands.add_parser("check", help="fail on glibc versions newer than --max")
    check.add_argument("--objdump", required=True)
    check.add_argument("--max", required=True, help="newest glibc allowed, e.g. 2.28")
    check.add_argument("--warn-only", action="store_true")
    check.add_argument("library", type=Path)
    args = parser.parse_args(argv)
    if args.command == "stubs" and args.out and not args.compiler:
        parser.error("stubs --out needs --compiler")
    return _stubs(args) if args.command == "stubs" else _check(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
