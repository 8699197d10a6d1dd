"""The routines of samattn.bench: one module per op of --ops.

Each module has
- ``OP``: its name in --ops;
- ``HEADER``: a line printed before its first case, or None;
- ``FREES_MEMORY``: whether the run releases torch's cached memory after each case;
- ``cases(size)``: its cases for size "full" or "quick" (samattn.bench.cases);
- ``run(bench, case)``: measures one case for every family of the run, adding records
  (or skipped cases, or errors) to ``bench`` (samattn.bench.runner.Bench).
"""

from __future__ import annotations

from types import ModuleType

from ..cases import OPS
from . import (
    attention,
    decode,
    decode_fp8,
    dropout,
    gemm,
    grouped,
    linear,
    overhead,
    softmax,
    split_k,
    terms,
)

ROUTINES: dict[str, ModuleType] = {
    module.OP: module
    for module in (
        gemm,
        linear,
        split_k,
        grouped,
        softmax,
        attention,
        terms,
        dropout,
        decode,
        decode_fp8,
        overhead,
    )
}
assert tuple(ROUTINES) == OPS, "samattn.bench.cases.OPS lists the routines in their order"
