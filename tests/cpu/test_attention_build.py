"""The attention tile tables (cpp/src/attention/<family>/flash_<family>_tiles.h) against
what is built from them and what the dispatch can pick.

cpp/cmake/attention_tiles.py is the one reader of the tables: CMake writes a translation
unit per instantiation it lists, benchmarks/attention_check/build.sh the checkers' units.
These tests check that reader against the C++ compiler's view of the same tables: a host
build of the real dispatch (g++, tests/cpu/attention_dispatch_probe.cpp: the sm75 / sm80
dispatch headers and the sm90 family's translation unit) with run_flash_fwd /
run_flash_bwd / run_flash_fwd_sm90 replaced by a print, run over head dims, shared-memory
sizes and key loops. Every configuration it picks must be a listed instantiation, and every
instantiation must be picked somewhere (else it is dead code and compile time).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from host_toolchain import cuda_home

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("attention_dispatch_probe.cpp")


def _load_tiles():
    spec = importlib.util.spec_from_file_location(
        "attention_tiles", ROOT / "cpp" / "cmake" / "attention_tiles.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


tiles = _load_tiles()
TABLES = {table.family: table for table in tiles.tables()}


@pytest.fixture(scope="module")
def picks(tmp_path_factory) -> dict[tuple[str, str, str], Counter]:
    """(direction, family, dtype) -> how often each row (its fields, comma-joined) was
    picked; "none" counts the problems nothing ran."""
    compiler, cuda = shutil.which("g++"), cuda_home()
    if compiler is None or cuda is None:
        pytest.skip("needs g++ and the CUDA runtime headers")
    exe = tmp_path_factory.mktemp("probe") / "probe"
    subprocess.run(
        [compiler, "-std=c++17", "-O0", f"-I{ROOT / 'cpp' / 'src'}",
         f"-I{ROOT / 'cpp' / 'include'}", f"-I{cuda / 'include'}", str(PROBE),
         str(ROOT / "cpp" / "src" / "common" / "registry.cpp"), "-o", str(exe)],
        check=True,
    )  # fmt: skip
    out: dict[tuple[str, str, str], Counter] = {}
    for line in subprocess.run(
        [exe], check=True, capture_output=True, text=True
    ).stdout.splitlines():
        direction, family, dtype, _head_dim, _smem, _keys, *pick = line.split()
        if pick != ["none"]:
            assert pick[0] == family, f"the {family} dispatch ran a {pick[0]} kernel: {line}"
            pick = pick[1:]
        out.setdefault((direction, family, dtype), Counter())[pick[0]] += 1
    return out


def _row(tile) -> str:
    return ",".join(tile.fields)


# The directions each family's table covers.
DIRECTIONS = {"sm75": {"fwd", "bwd"}, "sm80": {"fwd", "bwd"}, "sm90": {"fwd", "bwd"}}
# Row type -> (config tag, launch function, header) of its instantiations.
CONFIGS = {
    "FlashFwdTile": ("FlashFwdConfig", "run_flash_fwd", "attention/flash_fwd_launch.cuh"),
    "FlashBwdTile": ("FlashBwdConfig", "run_flash_bwd", "attention/flash_bwd_launch.cuh"),
    "FlashFwdSm90Tile": (
        "FlashFwdSm90Config",
        "run_flash_fwd_sm90",
        "attention/sm90/flash_fwd_sm90_launch.cuh",
    ),
    "FlashBwdSm90Tile": (
        "FlashBwdSm90Config",
        "run_flash_bwd_sm90",
        "attention/sm90/flash_bwd_sm90_launch.cuh",
    ),
}


def test_every_family_has_a_table():
    assert set(TABLES) == set(DIRECTIONS)
    for family, table in TABLES.items():
        assert {t.direction for t in table.tiles} == DIRECTIONS[family], table.header


def test_sm90_rows_are_the_sm90_kernels():
    """sm90's own kernels, and sm80's kvcache kernel (its cache table) compiled for sm_90a,
    whose key splits combine in a cluster."""
    rows = {t.row for t in TABLES["sm90"].tiles}
    assert rows == {"FlashFwdSm90Tile", "FlashBwdSm90Tile", "FlashFwdTile"}
    cache_rows = [t for t in TABLES["sm90"].tiles if t.row == "FlashFwdTile"]
    assert {t.use for t in cache_rows} == {"kvcache"}
    assert sorted(t.head_dim for t in cache_rows) == [32, 64, 96, 128, 192, 256]
    assert TABLES["sm90"].dtypes == ["f16", "bf16"]
    for family in ("sm75", "sm80"):
        assert {t.row for t in TABLES[family].tiles} == {"FlashFwdTile", "FlashBwdTile"}


@pytest.mark.parametrize("family", sorted(TABLES))
def test_one_translation_unit_per_dtype_and_row(family):
    table = TABLES[family]
    units = tiles.instantiations(table)
    names = Counter(unit.name for unit in units)
    assert [n for n, count in names.items() if count > 1] == []
    fp8_rows = [tile for tile in table.tiles if tiles.has_fp8_cache(family, tile)]
    assert len(units) == len(table.dtypes) * (len(table.tiles) + len(fp8_rows))
    # The kvcache rows' fp8-cache kernels (FlashFwdConfig's kFp8Cache), not on sm75.
    fp8_units = [unit for unit in units if unit.name.endswith("_fp8")]
    assert len(fp8_units) == len(table.dtypes) * len(fp8_rows)
    assert (family == "sm75") == (fp8_rows == [])
    for unit in fp8_units:
        assert unit.tile.use == "kvcache" and ", true, true>>(" in unit.declaration
    for unit in units:
        config, function, header = CONFIGS[unit.tile.row]
        assert unit.header == header
        assert unit.declaration.startswith(
            f"template cudaError_t samattn::attention::{function}<samattn::attention::{config}<"
        )
        assert unit.name.startswith(f"attention_{unit.direction}_{family}_{unit.dtype}_d")
        if unit.tile.row in ("FlashFwdSm90Tile", "FlashBwdSm90Tile"):
            # Every field, no Family (the tag is sm90's alone).
            fields = ", ".join(unit.tile.fields)
            assert f"{config}<samattn::DType::{unit.dtype}, {fields}>>(" in unit.declaration
            assert "Family::" not in unit.declaration
        else:
            fields = ", ".join(unit.tile.fields[:5])
            assert f"{config}<samattn::DType::{unit.dtype}, {fields}, " in unit.declaration
            assert f"Family::{family}" in unit.declaration


@pytest.mark.parametrize("family", sorted(TABLES))
def test_dispatch_picks_exactly_the_listed_rows(family, picks):
    table = TABLES[family]
    for direction in DIRECTIONS[family]:
        listed = {_row(t) for t in table.tiles if t.direction == direction}
        for dtype in table.dtypes:
            picked = set(picks[(direction, family, dtype)]) - {"none"}
            assert picked - listed == set(), (
                f"{family} {direction} {dtype}: the dispatch runs configurations that no row "
                f"of {table.header.name} lists (they would fail the link)"
            )
            assert listed - picked == set(), (
                f"{family} {direction} {dtype}: rows of {table.header.name} that no problem "
                "picks (shadowed by an earlier row of their head dim?)"
            )


def test_cmake_gets_every_translation_unit(tmp_path):
    """The file CMake includes at configure time: one call per instantiation, with the
    padded head dim it filters SAMATTN_ATTENTION_HEAD_DIMS by."""
    out = tmp_path / "attention_instantiations.cmake"
    tiles.main(["cmake", str(out)])
    calls = re.findall(r'^samattn_instantiate_attention\((\w+) (\d+) (\w+) "([^"]+)" "([^"]+)"\)$',
                       out.read_text(), re.M)  # fmt: skip
    expected = [
        (u.family, str(u.tile.head_dim), u.name, u.header, u.declaration)
        for table in TABLES.values()
        for u in tiles.instantiations(table)
    ]
    assert sorted(calls) == sorted(expected)


def test_the_dtypes_a_family_lacks_are_refused_at_compile_time():
    """The dispatch static_asserts a dtype against k<Family>AttentionDTypes, so a family's
    registration cannot run a dtype its table does not instantiate."""
    attention = ROOT / "cpp" / "src" / "attention"
    text = (attention / "flash_fwd_dispatch.h").read_text()
    assert "dtype_listed<T>(kSm80AttentionDTypes)" in text
    assert "dtype_listed<T>(kSm75AttentionDTypes)" in text
    sm90 = (attention / "sm90" / "flash_sm90.cu").read_text()
    assert "dtype_listed<T>(kSm90AttentionDTypes)" in sm90


def test_no_tile_written_outside_the_tables():
    """Configurations are named with literal numbers only in the standalone checkers'
    alternatives (benchmarks/): the library's sources derive every one from a table."""
    literal = re.compile(r"Flash(Fwd|Bwd)(Sm90)?Config<[^<>]*\b\d+\s*,")
    for path in (ROOT / "cpp").rglob("*"):
        if path.suffix in {".h", ".cuh", ".cu", ".cpp", ".cmake"}:
            assert not literal.search(path.read_text()), path


BAD_ROWS = [
    "    {64, 128, 64, 4, true, 1},",  # forward row without its use
    "    {64, 128, 64, 4, true, 1, TileUse::any}, {32, 128, 64, 4, true, 1, TileUse::any},",
    "    SAMATTN_ROW(64, 128, 64, 4, true, 1, TileUse::any),",
    "    {64,",
]


@pytest.mark.parametrize("row", BAD_ROWS)
def test_a_malformed_table_fails_the_configure(tmp_path, row):
    header = tmp_path / "flash_sm80_tiles.h"
    header.write_text(
        "inline constexpr DType kSm80AttentionDTypes[] = {DType::f16};\n"
        "inline constexpr FlashFwdTile kSm80FwdTiles[] = {\n"
        f"{row}\n"
        "};\n"
    )
    with pytest.raises(ValueError, match=re.escape("flash_sm80_tiles.h:3")):
        tiles.parse(header)


SM90_BAD_ROWS = [
    "    {64, 128, 128, 2},",  # no TileUse
    "    {64, 128, 128, 2, 1},",  # a FlashFwdTile's fields in an sm90 table
    "    {64, 128, 128, 2, TileUse::short_keys},",  # a use of sm80's rows
    "    {64, 128, 128, 2, TileUse::any}, {128, 128, 128, 2, TileUse::any},",
]


@pytest.mark.parametrize("row", SM90_BAD_ROWS)
def test_a_malformed_sm90_row_fails_the_configure(tmp_path, row):
    header = tmp_path / "flash_sm90_tiles.h"
    header.write_text(
        "inline constexpr DType kSm90AttentionDTypes[] = {DType::f16};\n"
        "inline constexpr FlashFwdSm90Tile kSm90FwdTiles[] = {\n"
        f"{row}\n"
        "};\n"
    )
    with pytest.raises(ValueError, match=re.escape("flash_sm90_tiles.h:3")):
        tiles.parse(header)


@pytest.mark.parametrize(
    "family, opening",
    [
        ("sm80", "inline constexpr FlashFwdSm90Tile kSm80FwdTiles[] = {"),  # not sm90's table
        ("sm90", "inline constexpr FlashFwdSm90Tile kSm90BwdTiles[] = {"),  # a forward row type
        ("sm80", "inline constexpr FlashBwdSm90Tile kSm80BwdTiles[] = {"),  # not sm90's table
        (
            "sm90",
            "inline constexpr FlashFwdSm90Tile kSm90FwdTiles[] = "
            "{{64, 128, 128, 2, TileUse::any}};",
        ),
    ],
)
def test_a_misplaced_sm90_table_fails_the_configure(tmp_path, family, opening):
    header = tmp_path / f"flash_{family}_tiles.h"
    header.write_text(
        f"inline constexpr DType k{family.title()}AttentionDTypes[] = {{DType::f16}};\n"
        f"{opening}\n"
        "    {64, 128, 128, 2, TileUse::any},\n"
        "};\n"
    )
    with pytest.raises(ValueError, match=re.escape(f"flash_{family}_tiles.h:2")):
        tiles.parse(header)


def test_a_forward_only_table_builds_its_forward(tmp_path):
    """A family may have no backward table."""
    header = tmp_path / "flash_sm90_tiles.h"
    header.write_text(
        "inline constexpr DType kSm90AttentionDTypes[] = {DType::f16, DType::bf16};\n"
        "inline constexpr FlashFwdSm90Tile kSm90FwdTiles[] = {\n"
        "    // head_dim, block_m, block_n, stages, use\n"
        "    {128, 192, 112, 3, TileUse::long_keys},\n"
        "};\n"
    )
    table = tiles.parse(header)
    assert table.tiles[0].use == "long_keys"
    assert (table.family, table.dtypes) == ("sm90", ["f16", "bf16"])
    units = tiles.instantiations(table)
    assert [u.name for u in units] == [
        "attention_fwd_sm90_f16_d128_192x112_kv3",
        "attention_fwd_sm90_bf16_d128_192x112_kv3",
    ]
    assert units[1].declaration == (
        "template cudaError_t samattn::attention::run_flash_fwd_sm90<"
        "samattn::attention::FlashFwdSm90Config<samattn::DType::bf16, 128, 192, 112, 3>>"
        "(const samattn::AttentionForwardProblem&);"
    )
    assert units[0].tile.head_dim == 128


def test_extra_sm90_rows_for_the_checkers(tmp_path, capsys):
    """build.sh's extra rows take the row type of the family's table."""
    tiles.main(["sources", "sm90", str(tmp_path), "--fwd", "128,128,176,2"])
    extra = tmp_path / "attention_fwd_sm90_bf16_d128_128x176_kv2.cu"
    assert extra.read_text().startswith('#include "attention/sm90/flash_fwd_sm90_launch.cuh"\n')
    assert str(extra) in capsys.readouterr().out
    with pytest.raises(SystemExit, match="FlashBwdSm90Tile row"):
        tiles.main(["sources", "sm90", str(tmp_path), "--bwd", "128,64,128,8,2"])
    tiles.main(["sources", "sm90", str(tmp_path), "--bwd", "128,64,128,3"])
    extra = tmp_path / "attention_bwd_sm90_bf16_d128_64x128_q3.cu"
    assert extra.read_text().startswith('#include "attention/sm90/flash_bwd_sm90_launch.cuh"\n')
    with pytest.raises(SystemExit, match="FlashFwdSm90Tile row"):
        tiles.main(["sources", "sm90", str(tmp_path), "--fwd", "128,128,176,4,true"])
