"""Reads the attention tile tables (cpp/src/attention/<family>/flash_<family>_tiles.h) and
derives what the build needs from them, so that a tile is written only there.

CMake runs it at configure time (cpp/instantiations.cmake) to get one explicit
instantiation per (family, direction, dtype, row); benchmarks/attention_check/build.sh
runs it to write the standalone checkers' translation units; tests/cpu/test_attention_build.py
imports it. The tables have a fixed textual form (cpp/src/attention/flash_tiles.h): an
array opens on a line `inline constexpr FlashFwdTile kSm80FwdTiles[] = {` (or
`kSm90FwdCacheTiles`: FlashFwdTile rows of TileUse::kvcache in another family's table), holds one
`{...},` row per line and comment lines, and closes with `};`. Any other line inside an
array is an error, so a table the compiler reads differently from this parser fails the
configure instead of building a different set of kernels.

Row types: FlashFwdTile and FlashBwdTile (the FlashAttention-2 kernels of sm75 and sm80,
FlashFwdConfig / FlashBwdConfig, run_flash_fwd / run_flash_bwd), FlashFwdSm90Tile and
FlashBwdSm90Tile (the sm90 forward and backward, FlashFwdSm90Config / FlashBwdSm90Config,
run_flash_fwd_sm90 / run_flash_bwd_sm90; only in the sm90 table). A family has a forward
table and may have no backward table.

    python attention_tiles.py cmake OUT.cmake     one samattn_instantiate_attention() call per
                                                  instantiation (written only if it changed)
    python attention_tiles.py sources FAMILY DIR [--fwd ROW]... [--bwd ROW]...
                                                  one .cu per instantiation of FAMILY into DIR
                                                  (plus extra bf16 rows "64,128,128,4,true");
                                                  prints "fwd|bwd PATH" per file
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ATTENTION = Path(__file__).resolve().parents[1] / "src" / "attention"

_OPEN = re.compile(
    r"^inline constexpr (FlashFwdTile|FlashBwdTile|FlashFwdSm90Tile|FlashBwdSm90Tile) "
    r"k(Sm\d+)(Fwd|Bwd)(Cache)?Tiles\[\] "
    r"= \{$"
)
_DTYPES = re.compile(r"^inline constexpr DType k(Sm\d+)AttentionDTypes\[\] = \{([^}]*)\};$")
_ROW = re.compile(r"^\{([^{}]*)\},$")
_INT = r"\s*(\d+)\s*"
_BOOL = r"\s*(true|false)\s*"
_FWD_FIELDS = re.compile(
    rf"^{_INT},{_INT},{_INT},{_INT},{_BOOL},{_INT},\s*TileUse::(any|short_keys|kvcache)\s*$"
)
_BWD_FIELDS = re.compile(rf"^{_INT},{_INT},{_INT},{_INT},{_INT}$")
_SM90_FWD_FIELDS = re.compile(rf"^{_INT},{_INT},{_INT},{_INT},\s*TileUse::(any|long_keys)\s*$")
_SM90_BWD_FIELDS = re.compile(rf"^{_INT},{_INT},{_INT},{_INT}$")
# Row type -> (direction, fields, the only family whose table may hold it, or None).
_ROWS = {
    "FlashFwdTile": ("fwd", _FWD_FIELDS, None),
    "FlashBwdTile": ("bwd", _BWD_FIELDS, None),
    "FlashFwdSm90Tile": ("fwd", _SM90_FWD_FIELDS, "sm90"),
    "FlashBwdSm90Tile": ("bwd", _SM90_BWD_FIELDS, "sm90"),
}
_CPP_DTYPE = {"f16": "samattn::DType::f16", "bf16": "samattn::DType::bf16"}


@dataclass(frozen=True)
class Tile:
    """One row: `row` its C++ type; fields as its config takes them after the dtype
    (FlashFwdTile, FlashFwdConfig: head_dim, block_m, block_n, warps, q_in_regs, kv_stages;
    FlashBwdTile, FlashBwdConfig: head_dim, block_m, block_n, warps, q_stages;
    FlashFwdSm90Tile, FlashFwdSm90Config and FlashBwdSm90Tile, FlashBwdSm90Config: head_dim,
    block_m, block_n, stages); use: the
    row's TileUse (FlashFwdTile, FlashFwdSm90Tile)."""

    row: str
    fields: tuple[str, ...]
    use: str = "any"

    @property
    def direction(self) -> str:
        """The row's direction: fwd or bwd."""
        return _ROWS[self.row][0]

    @property
    def head_dim(self) -> int:
        return int(self.fields[0])


@dataclass(frozen=True)
class Instantiation:
    """One translation unit: `declaration` explicitly instantiates run_flash_<direction>."""

    family: str
    direction: str
    dtype: str
    tile: Tile
    name: str
    header: str
    declaration: str


@dataclass
class FamilyTable:
    family: str
    header: Path
    dtypes: list[str]
    tiles: list[Tile]


def parse(header: Path) -> FamilyTable:
    """The dtypes and rows of one family's table header; ValueError on a malformed table."""
    family, dtypes, tiles, current, cache_table = None, None, [], None, False
    for number, raw in enumerate(header.read_text().splitlines(), 1):
        line = raw.strip()
        where = f"{header}:{number}"
        if current is None:
            if match := _DTYPES.match(line):
                dtypes = [d.strip().removeprefix("DType::") for d in match[2].split(",")]
                if not all(d in _CPP_DTYPE for d in dtypes):
                    raise ValueError(f"{where}: dtypes {match[2]!r}: expected DType::f16 / bf16")
                family = _family(family, match[1], where)
            elif match := _OPEN.match(line):
                direction, _, only = _ROWS[match[1]]
                if direction != match[3].lower():
                    raise ValueError(f"{where}: {match[1]} array named {match[3]}")
                family = _family(family, match[2], where)
                if only is not None and family != only:
                    raise ValueError(f"{where}: {match[1]} rows belong to the {only} table")
                if match[4] and match[1] != "FlashFwdTile":
                    raise ValueError(f"{where}: a Cache table holds FlashFwdTile rows")
                current, cache_table = match[1], bool(match[4])
            elif re.search(r"\bFlash(Fwd|Bwd)(Sm\d+)?Tile\b.*\[\]", line):
                raise ValueError(f"{where}: a table must open as `{_OPEN.pattern}`")
            continue
        if line == "};":
            current = None
        elif line == "" or line.startswith("//"):
            continue
        elif match := _ROW.match(line):
            fields = _ROWS[current][1].match(match[1])
            if not fields:
                raise ValueError(f"{where}: not a {current} row: {line!r}")
            if current == "FlashFwdTile":
                if cache_table and fields[7] != "kvcache":
                    raise ValueError(f"{where}: a Cache table holds TileUse::kvcache rows only")
                tiles.append(Tile(current, fields.groups()[:6], fields[7]))
            elif current == "FlashFwdSm90Tile":
                tiles.append(Tile(current, fields.groups()[:4], fields[5]))
            elif current == "FlashBwdSm90Tile":
                tiles.append(Tile(current, fields.groups()))
            else:
                tiles.append(Tile(current, fields.groups()))
        else:
            raise ValueError(f"{where}: one `{{...}},` row per line inside a table: {line!r}")
    if current is not None:
        raise ValueError(f"{header}: a table is not closed by `}};`")
    if family is None or dtypes is None or not tiles:
        raise ValueError(f"{header}: no k<Family>AttentionDTypes or no tile table")
    return FamilyTable(family, header, dtypes, tiles)


def _family(known: str | None, name: str, where: str) -> str:
    family = name.lower()
    if known is not None and known != family:
        raise ValueError(f"{where}: {name} in the table header of {known}")
    return family


def tables() -> list[FamilyTable]:
    """Every family's table, in a stable order."""
    return [parse(header) for header in sorted(ATTENTION.glob("sm*/flash_sm*_tiles.h"))]


def instantiation(family: str, dtype: str, tile: Tile, fp8: bool = False) -> Instantiation:
    """The translation unit of one (family, dtype, row); fp8: a kvcache row's kernel for fp8
    caches (FlashFwdConfig's kFp8Cache)."""
    if tile.row in ("FlashFwdSm90Tile", "FlashBwdSm90Tile"):
        return _sm90(family, dtype, tile)
    d, bm, bn, warps, last, *rest = tile.fields
    if tile.direction == "fwd":
        config, problem, tag = "FlashFwdConfig", "AttentionForwardProblem", "q"
        # kv_stages and kv_cache are FlashFwdConfig's defaulted last arguments
        cache = tile.use == "kvcache"
        stages = rest[0] if rest and (rest[0] != "1" or cache) else None
    else:
        config, problem, tag, stages = "FlashBwdConfig", "AttentionBackwardProblem", "s", None
        cache = False
    family_cpp = f"samattn::attention::Family::{family}"
    args = f"{_CPP_DTYPE[dtype]}, {d}, {bm}, {bn}, {warps}, {last}, {family_cpp}"
    if stages:
        args += f", {stages}"
    if cache:
        args += ", true, true" if fp8 else ", true"
    name = f"attention_{tile.direction}_{family}_{dtype}_d{d}_{bm}x{bn}_w{warps}_{tag}{last}"
    name += f"_kv{stages}" if stages else ""
    name += "_cache" if cache else ""
    name += "_fp8" if fp8 else ""
    declaration = (
        f"template cudaError_t samattn::attention::run_flash_{tile.direction}<"
        f"samattn::attention::{config}<{args}>>(const samattn::{problem}&);"
    )
    return Instantiation(
        family,
        tile.direction,
        dtype,
        tile,
        name,
        f"attention/flash_{tile.direction}_launch.cuh",
        declaration,
    )


def _sm90(family: str, dtype: str, tile: Tile) -> Instantiation:
    """The sm90 forward or backward (wgmma + TMA): run_flash_<direction>_sm90<
    Flash<Fwd|Bwd>Sm90Config<...>>, defined in attention/sm90/flash_<direction>_sm90_launch.cuh.
    Named like the sm80 kernels; the stage suffix is `kv` (the forward's K and V buffers) or
    `q` (the backward's Q and dO buffers)."""
    d, bm, bn, stages = tile.fields
    direction = tile.direction
    config = "FlashFwdSm90Config" if direction == "fwd" else "FlashBwdSm90Config"
    problem = "AttentionForwardProblem" if direction == "fwd" else "AttentionBackwardProblem"
    args = f"{_CPP_DTYPE[dtype]}, {d}, {bm}, {bn}, {stages}"
    declaration = (
        f"template cudaError_t samattn::attention::run_flash_{direction}_sm90<"
        f"samattn::attention::{config}<{args}>>"
        f"(const samattn::{problem}&);"
    )
    stage = "kv" if direction == "fwd" else "q"
    return Instantiation(
        family,
        direction,
        dtype,
        tile,
        f"attention_{direction}_{family}_{dtype}_d{d}_{bm}x{bn}_{stage}{stages}",
        f"attention/sm90/flash_{direction}_sm90_launch.cuh",
        declaration,
    )


def has_fp8_cache(family: str, tile: Tile) -> bool:
    """Whether a row also has a kernel for fp8 KV caches: the kvcache rows of the families
    with cp.async (the sm75 plan declines fp8 caches)."""
    return tile.use == "kvcache" and family != "sm75"


def instantiations(table: FamilyTable) -> list[Instantiation]:
    """One per (dtype, row) of a family's table, and one per (dtype, kvcache row) for fp8
    caches."""
    found = []
    for dtype in table.dtypes:
        for tile in table.tiles:
            found.append(instantiation(table.family, dtype, tile))
            if has_fp8_cache(table.family, tile):
                found.append(instantiation(table.family, dtype, tile, fp8=True))
    return found


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _cmake(out: Path) -> None:
    lines = [f"# Generated by {Path(__file__).name} from the attention tile tables; do not edit."]
    for table in tables():
        lines.append(f"# {table.header.relative_to(ATTENTION.parents[2])}")
        for inst in instantiations(table):
            lines.append(
                f"samattn_instantiate_attention({inst.family} {inst.tile.head_dim} {inst.name} "
                f'"{inst.header}" "{inst.declaration}")'
            )
    _write_if_changed(out, "\n".join(lines) + "\n")


def _extra_tile(table: FamilyTable, direction: str, text: str) -> Tile:
    """A --fwd / --bwd row, of the row type of the family's table for that direction."""
    row = next((t.row for t in table.tiles if t.direction == direction), None)
    if row is None:
        raise SystemExit(f"--{direction} {text}: {table.family} has no {direction} table")
    fields = tuple(text.split(","))
    if row == "FlashFwdTile" and len(fields) == 5:
        fields += ("1",)
    # A FlashFwdTile here has no TileUse (the extra rows are plain forward kernels).
    expected = {"FlashFwdTile": 6, "FlashBwdTile": 5, "FlashFwdSm90Tile": 4, "FlashBwdSm90Tile": 4}
    if len(fields) != expected[row]:
        raise SystemExit(f"--{direction} {text}: expected the fields of a {row} row")
    return Tile(row, fields)


def _sources(family: str, out: Path, extra: list[tuple[str, str]]) -> None:
    table = next((t for t in tables() if t.family == family), None)
    if table is None:
        raise SystemExit(f"no tile table for family {family}")
    rows = [_extra_tile(table, direction, text) for direction, text in extra]
    wanted = instantiations(table) + [instantiation(family, "bf16", tile) for tile in rows]
    out.mkdir(parents=True, exist_ok=True)
    seen = set()
    for inst in wanted:
        if inst.name in seen:
            continue
        seen.add(inst.name)
        path = out / f"{inst.name}.cu"
        _write_if_changed(path, f'#include "{inst.header}"\n\n{inst.declaration}\n')
        print(inst.direction, path)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cmake = commands.add_parser("cmake")
    cmake.add_argument("out", type=Path)
    sources = commands.add_parser("sources")
    sources.add_argument("family")
    sources.add_argument("out", type=Path)
    sources.add_argument("--fwd", action="append", default=[], metavar="ROW")
    sources.add_argument("--bwd", action="append", default=[], metavar="ROW")
    args = parser.parse_args(argv)
    try:
        if args.command == "cmake":
            _cmake(args.out)
        else:
            extra = [("fwd", r) for r in args.fwd] + [("bwd", r) for r in args.bwd]
            _sources(args.family, args.out, extra)
    except ValueError as error:
        raise SystemExit(f"attention tile table: {error}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
