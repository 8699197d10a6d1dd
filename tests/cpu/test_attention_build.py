"""The attention instantiation lists of cpp/instantiations.cmake against the tile tables
the sm80 dispatch reads (Sm80FwdTiles in cpp/src/attention/flash_fwd_config.h for the
forward, Sm80BwdTiles in cpp/src/attention/flash_bwd_config.h for the backward).

A configuration the table names but CMake does not instantiate fails the link (-z defs);
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

# (table header, table name, config template pattern, CMake list)
DIRECTIONS = {
    "forward": (
        ATTENTION / "flash_fwd_config.h",
        "Sm80FwdTiles",
        r"FlashFwdConfig<T,\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(true|false),\s*Family::sm80>",
        "SAMATTN_ATTENTION_FWD_SM80_CONFIGS",
    ),
    "backward": (
        ATTENTION / "flash_bwd_config.h",
        "Sm80BwdTiles",
        r"FlashBwdConfig<T,\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*Family::sm80>",
        "SAMATTN_ATTENTION_BWD_SM80_CONFIGS",
    ),
}


def _table_configs(header: Path, table: str, pattern: str) -> set[tuple[str, ...]]:
    text = header.read_text()
    start = text.index(f"struct {table}")  # the table follows its declaration
    return set(re.findall(pattern, text[start:]))


def _cmake_configs(variable: str) -> set[tuple[str, ...]]:
    text = INSTANTIATIONS.read_text()
    block = re.search(rf"set\({variable}(.*?)\)", text, re.S)
    assert block, f"{variable} not found in cpp/instantiations.cmake"
    return {tuple(entry.split(",")) for entry in re.findall(r'"([^"]+)"', block.group(1))}


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_every_table_entry_is_instantiated_and_nothing_else(direction):
    header, table_name, pattern, variable = DIRECTIONS[direction]
    table, cmake = _table_configs(header, table_name, pattern), _cmake_configs(variable)
    assert table, f"no configuration found in the {table_name} table of {header}"
    assert table - cmake == set(), (
        f"add to {variable} in {INSTANTIATIONS}: {sorted(','.join(c) for c in table - cmake)}"
    )
    assert cmake - table == set(), (
        f"not in the {table_name} table (remove from {variable}): "
        f"{sorted(','.join(c) for c in cmake - table)}"
    )
