"""Question: Is one version of the Python layer cheaper per eager call than another, on the
same library?

Host time per eager call of samattn against torch for every case of `samattn.bench
--ops overhead` (its overhead_cases), as one JSON line: to compare two versions of the
Python layer on one library, run it with each on PYTHONPATH in alternating processes.

    PYTHONPATH=/path/to/old python benchmarks/profiling/overhead_ab.py >> ab.jsonl
    PYTHONPATH=/path/to/new python benchmarks/profiling/overhead_ab.py >> ab.jsonl

SAMATTN_AB_FAMILIES (default "auto") lists the families to force, comma-separated, as
samattn.bench's --families does.
"""

from __future__ import annotations

import json
import os

import samattn
from samattn.bench.routines.overhead import overhead_cases
from samattn.bench.timing import host_us_pair


def main() -> None:
    out: dict[str, object] = {"samattn": samattn.__file__}
    families = os.environ.get("SAMATTN_AB_FAMILIES", "auto").split(",")
    for case in overhead_cases():
        for family in families:
            with samattn.use_family(None if family == "auto" else family):
                ours, theirs = host_us_pair(case.samattn, case.torch, calls=200, rounds=21)
            out[f"{case.name} {family}"] = {
                "samattn_us": round(ours, 2), "torch_us": round(theirs, 2),
                "ratio": round(theirs / ours, 3),
            }  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
