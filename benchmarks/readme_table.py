"""Print the README's benchmark table (markdown) from a results JSON of samattn.bench:

    python benchmarks/readme_table.py benchmarks/results/h100.json [OP_PREFIX]

Rows: the automatically chosen family of every case, in the file's order; with OP_PREFIX
(e.g. softmax) only the ops whose name starts with it.
"""

from __future__ import annotations

import json
import sys

TIMES = "\N{MULTIPLICATION SIGN}"
DTYPE_NAMES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "tf32": "float32 (tf32)"}
OP_NAMES = {"gemm": "gemm", "softmax_forward": "softmax fwd", "softmax_backward": "softmax bwd"}


def shape_text(op: str, shape: list[int]) -> str:
    if op == "gemm":
        batch, m, n, k = shape
        cube = f" {TIMES} ".join(map(str, (m, n, k)))
        return f"{batch} {TIMES} ({cube}) batched" if batch > 1 else cube
    return f" {TIMES} ".join(map(str, shape))


def note(record: dict) -> str:
    parts = [record["family"]]
    if record.get("config"):
        parts.append(record["config"].split()[0].removeprefix("tile="))
    if record["op"] == "gemm" and record["dtype"] == "f32":
        parts.append('exact fp32, vs "highest"')
    if "ratio_to_copy" in record:
        parts.append(f"{record['ratio_to_copy']:.2f} of copy ({record['copy']:.0f} GB/s)")
    return ", ".join(parts)


def main() -> None:
    with open(sys.argv[1]) as f:
        data = json.load(f)
    print("| op | shape | dtype | samattn | torch | ratio | family, note |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    prefix = sys.argv[2] if len(sys.argv) > 2 else ""
    for r in data["records"]:
        if r["forced"] or not r["op"].startswith(prefix):
            continue
        unit = r["unit"]
        print(
            f"| {OP_NAMES.get(r['op'], r['op'])} | {shape_text(r['op'], r['shape'])} "
            f"| {DTYPE_NAMES[r['dtype']]} | {r['samattn']:.0f} {unit} | {r['baseline']:.0f} "
            f"| {r['ratio']:.2f} | {note(r)} |"
        )


if __name__ == "__main__":
    main()
