"""The attention instantiation list of cpp/instantiations.cmake against the tile table
the sm80 dispatch reads (Sm80FwdTiles in cpp/src/attention/flash_fwd_config.h).

A configuration the table names but CMake does not instantiate fails the link (-z defs);
this test also catches the reverse (an instantiation nothing dispatches to: dead code and
compile time), and says which line to edit. Source files only: no library needed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG_H = ROOT / "cpp" / "src" / "attention" / "flash_fwd_config.h"
INSTANTIATIONS = ROOT / "cpp" / "instantiations.cmake"


def _table_configs() -> set[tuple[str, ...]]:
    text = CONFIG_H.read_text()
    start = text.index("struct Sm80FwdTiles;")  # the table follows its declaration
    pattern = (
        r"FlashFwdConfig<T,\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(true|false),\s*Family::sm80>"
    )
    return set(re.findall(pattern, text[start:]))


def _cmake_configs() -> set[tuple[str, ...]]:
    text = INSTANTIATIONS.read_text()
    block = re.search(r"set\(SAMATTN_ATTENTION_FWD_SM80_CONFIGS(.*?)\)", text, re.S)
    assert block, "SAMATTN_ATTENTION_FWD_SM80_CONFIGS not found in cpp/instantiations.cmake"
    return {tuple(entry.split(",")) for entry in re.findall(r'"([^"]+)"', block.group(1))}


def test_every_table_entry_is_instantiated_and_nothing_else():
    table, cmake = _table_configs(), _cmake_configs()
    assert table, "no FlashFwdConfig<T, ...> found in the Sm80FwdTiles table"
    assert table - cmake == set(), (
        f"add to SAMATTN_ATTENTION_FWD_SM80_CONFIGS in {INSTANTIATIONS}: "
        f"{sorted(','.join(c) for c in table - cmake)}"
    )
    assert cmake - table == set(), (
        f"not in the Sm80FwdTiles table (remove from SAMATTN_ATTENTION_FWD_SM80_CONFIGS): "
        f"{sorted(','.join(c) for c in cmake - table)}"
    )
