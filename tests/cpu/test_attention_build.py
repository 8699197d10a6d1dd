"""The attention instantiation lists of cpp/instantiations.cmake against the tile tables
the family dispatches read: Sm80FwdTiles (cpp/src/attention/flash_fwd_config.h),
Sm80BwdTiles (flash_bwd_config.h) and Sm75FwdTiles / Sm75BwdTiles
(cpp/src/attention/sm75/flash_sm75_tiles.h).

A configuration a table names but CMake does not instantiate fails the link (-z defs);
this test also catches the reverse (an instantiation nothing dispatches to: dead code and
compile time), and says which line to edit. Source files only: no library needed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ATTENTION = ROOT / "cpp" / "src" / "attention"
INSTANTIATIONS = ROOT / "cpp" / "instantiations.cmake"

# The forward's trailing K/V stages are optional (FlashFwdConfig's default, 1).
_FWD = (
    r"FlashFwdConfig<T,\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(true|false),\s*Family::{}"
    r"(?:,\s*(\d+))?>"
)
_BWD = r"FlashBwdConfig<T,\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*Family::{}>"

# (table header, the declaration the table follows, config pattern, CMake list)
TABLES = {
    "sm80 forward": (
        ATTENTION / "flash_fwd_config.h",
        "struct Sm80FwdTiles;",
        _FWD.format("sm80"),
        "SAMATTN_ATTENTION_FWD_SM80_CONFIGS",
    ),
    "sm80 backward": (
        ATTENTION / "flash_bwd_config.h",
        "struct Sm80BwdTiles",
        _BWD.format("sm80"),
        "SAMATTN_ATTENTION_BWD_SM80_CONFIGS",
    ),
    "sm75 forward": (
        ATTENTION / "sm75" / "flash_sm75_tiles.h",
        "struct Sm75FwdTiles;",
        _FWD.format("sm75"),
        "SAMATTN_ATTENTION_FWD_SM75_CONFIGS",
    ),
    "sm75 backward": (
        ATTENTION / "sm75" / "flash_sm75_tiles.h",
        "struct Sm75BwdTiles;",
        _BWD.format("sm75"),
        "SAMATTN_ATTENTION_BWD_SM75_CONFIGS",
    ),
}


def _table_configs(header: Path, declaration: str, pattern: str) -> set[tuple[str, ...]]:
    text = header.read_text()
    start = text.index(declaration)  # the table follows its declaration
    # an optional group that did not match is "": drop it
    return {tuple(field for field in match if field) for match in re.findall(pattern, text[start:])}


def _cmake_configs(variable: str) -> set[tuple[str, ...]]:
    text = INSTANTIATIONS.read_text()
    block = re.search(rf"set\({variable}(.*?)\)", text, re.S)
    assert block, f"{variable} not found in {INSTANTIATIONS}"
    return {tuple(entry.split(",")) for entry in re.findall(r'"([^"]+)"', block.group(1))}


@pytest.mark.parametrize("table", TABLES)
def test_every_table_entry_is_instantiated_and_nothing_else(table):
    header, declaration, pattern, variable = TABLES[table]
    configs, cmake = _table_configs(header, declaration, pattern), _cmake_configs(variable)
    assert configs, f"no {table} configuration found after {declaration!r} in {header}"
    assert configs - cmake == set(), (
        f"add to {variable} in {INSTANTIATIONS}: {sorted(','.join(c) for c in configs - cmake)}"
    )
    assert cmake - configs == set(), (
        f"not in the {table} table of {header.name} (remove from {variable}): "
        f"{sorted(','.join(c) for c in cmake - configs)}"
    )
