"""Question: Is the forced sm80 GEMM of one commit faster or slower than another's (issue 53)?

A same-run A/B of libsamattn builds against cuBLAS. Each library runs in its own
process with its own samattn package (the Python side and the C ABI change between
commits), SAMATTN_FAMILY=sm80 and SAMATTN_LIBRARY set; the libraries take turns, round
after round, and every process also times torch.matmul, so the ratios are same-run
ratios. It has its own timer (the bench's method: input sets past the L2, calls queued
behind a sleep, median of 5), since old commits have no samattn.bench.timing.
benchmarks/profiling/gemm_sm80_ab.sh prepares the sources and builds the libraries.

    python benchmarks/profiling/gemm_sm80_ab.py NAME=SRC_DIR:LIBRARY ... [--rounds 3] [--all]
        [--dtypes bf16,f16,tf32] [--json OUT.json]

SRC_DIR holds that commit's samattn package (imported from there); LIBRARY is its
libsamattn.so. The default shapes are 2048^3, 4096^3, 8192^3 and 16384 x 4096 x 14336;
--all adds the other GEMM shapes of benchmarks/results/h100_all_families.json. Prints
one line per case: each library's median TFLOPS over the rounds, its ratio to cuBLAS,
and the family that ran (must be sm80).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

QUICK_SHAPES = [(1, 2048, 2048, 2048), (1, 4096, 4096, 4096), (1, 8192, 8192, 8192),
                (1, 16384, 4096, 14336)]  # fmt: skip
ALL_SHAPES = [
    (1, 1024, 1024, 1024), (1, 2048, 2048, 2048), (1, 4096, 4096, 4096),
    (1, 8192, 8192, 8192), (1, 4096, 14336, 4096), (1, 4096, 4096, 14336),
    (1, 16384, 4096, 4096), (1, 16384, 14336, 4096), (1, 16384, 4096, 14336),
    (1, 16, 8192, 8192), (1, 64, 8192, 8192), (1, 128, 8192, 8192), (64, 512, 512, 512),
]  # fmt: skip


def worker(dtypes: list[str], shapes: list[tuple[int, int, int, int]]) -> None:
    """In the library's process: time samattn.gemm (sm80 forced) and torch.matmul."""
    import torch

    import samattn
    from samattn import _lib

    torch_dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "tf32": torch.float32}
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 0) or 50 * 2**20

    def median_ms(fn, sets) -> float:
        for i in range(3):
            fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(3):
            fn(*sets[i % len(sets)])
        end.record()
        torch.cuda.synchronize()
        estimate = max(start.elapsed_time(end) / 3, 1e-3)
        reps = int(min(200, max(10, 50.0 / estimate)))
        times = []
        for _ in range(5):
            torch.cuda._sleep(int(1e6))  # queue the calls behind ~0.5 ms of GPU work
            start.record()
            for i in range(reps):
                fn(*sets[i % len(sets)])
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / reps)
        return statistics.median(times)

    for name in dtypes:
        torch.set_float32_matmul_precision("high" if name == "tf32" else "highest")
        dtype = torch_dtypes[name]
        for batch, m, n, k in shapes:
            a_shape = (batch, m, k) if batch > 1 else (m, k)
            b_shape = (batch, k, n) if batch > 1 else (k, n)
            element = torch.empty((), dtype=dtype).element_size()
            set_bytes = (batch * m * k + batch * k * n) * element
            count = 1 if set_bytes >= 2 * l2_bytes else min(64, -(-3 * l2_bytes // set_bytes))
            sets = [
                (torch.randn(a_shape, device="cuda").to(dtype),
                 torch.randn(b_shape, device="cuda").to(dtype))
                for _ in range(count)
            ]  # fmt: skip
            gemm = samattn.gemm
            if hasattr(_lib, "set_last_family"):
                _lib.set_last_family(_lib.FAMILY_AUTO)
            out = gemm(*sets[0])
            family = _lib.last_family() if hasattr(_lib, "last_family") else "?"
            ref = torch.matmul(*sets[0])
            error = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            ms = median_ms(gemm, sets)
            base_ms = median_ms(torch.matmul, sets)
            tflop = 2 * batch * m * n * k / 1e12
            record = {"dtype": name, "shape": [batch, m, n, k], "family": family,
                      "ms": ms, "tflops": tflop / (ms / 1e3),
                      "cublas_tflops": tflop / (base_ms / 1e3), "rel_error": error}  # fmt: skip
            print("RECORD " + json.dumps(record), flush=True)
            del sets, out, ref
            torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libraries", nargs="*", help="NAME=SRC_DIR:LIBRARY")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--all", action="store_true", help="every shape of h100_all_families")
    parser.add_argument("--dtypes", default="bf16,f16,tf32")
    parser.add_argument("--json", help="write every record here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    shapes = ALL_SHAPES if args.all else QUICK_SHAPES
    if args.worker:
        worker(dtypes, shapes)
        return 0

    libraries = []
    for spec in args.libraries:
        name, _, rest = spec.partition("=")
        src, _, lib = rest.partition(":")
        if not (name and os.path.isdir(os.path.join(src, "samattn")) and os.path.isfile(lib)):
            parser.error(f"{spec}: expected NAME=SRC_DIR:LIBRARY with SRC_DIR/samattn and LIBRARY")
        libraries.append((name, os.path.abspath(src), os.path.abspath(lib)))
    if not libraries:
        parser.error("name at least one library")

    results: dict[tuple, dict[str, list[dict]]] = {}
    for round_index in range(args.rounds):
        # Alternate the order too, so that no library always runs first.
        order = libraries if round_index % 2 == 0 else libraries[::-1]
        for name, src, lib in order:
            path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
            env = dict(os.environ, SAMATTN_LIBRARY=lib, SAMATTN_FAMILY="sm80", PYTHONPATH=path)
            command = [sys.executable, os.path.abspath(__file__), "--worker", "--dtypes",
                       args.dtypes] + (["--all"] if args.all else [])  # fmt: skip
            done = subprocess.run(command, env=env, cwd=src, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"round {round_index + 1} {name}: failed")
                print(done.stdout[-2000:] + done.stderr[-4000:])
                return 1
            for line in done.stdout.splitlines():
                if line.startswith("RECORD "):
                    record = json.loads(line[7:])
                    key = (record["dtype"], tuple(record["shape"]))
                    results.setdefault(key, {}).setdefault(name, []).append(record)
            print(f"round {round_index + 1}/{args.rounds}: {name} done", flush=True)

    names = [name for name, _, _ in libraries]
    print("\nmedian over rounds; TFLOPS (ratio to cuBLAS in the same process) [family]")
    print(f"{'dtype':5} {'shape':24} " + " ".join(f"{n:>26}" for n in names) + "   cuBLAS")
    rows = []
    for (dtype, shape), per_lib in results.items():
        cells, cublas = [], []
        for name in names:
            records = per_lib.get(name, [])
            tflops = statistics.median(r["tflops"] for r in records)
            ratio = statistics.median(r["tflops"] / r["cublas_tflops"] for r in records)
            cublas += [r["cublas_tflops"] for r in records]
            families = ",".join(sorted({str(r["family"]) for r in records}))
            error = max(r["rel_error"] for r in records)
            cells.append(f"{tflops:7.1f} ({ratio:4.2f}) [{families}]")
            rows.append({"library": name, "dtype": dtype, "shape": list(shape), "tflops": tflops,
                         "ratio": ratio, "family": families, "max_rel_error": error,
                         "records": records})  # fmt: skip
        shape_text = "x".join(str(s) for s in shape)
        print(f"{dtype:5} {shape_text:24} " + " ".join(f"{c:>26}" for c in cells)
              + f"   {statistics.median(cublas):6.1f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"libraries": libraries, "rounds": args.rounds, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
