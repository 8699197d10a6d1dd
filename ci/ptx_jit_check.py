"""The sm80 family run from its compute_80 PTX: the code a GPU newer than a wheel's archs runs.

    CUDA_FORCE_PTX_JIT=1 python ci/ptx_jit_check.py [--jobs N] [--json FILE]

With CUDA_FORCE_PTX_JIT=1 the driver ignores every cubin and JIT-compiles the PTX of each
module it loads, so only code that carries PTX runs: samattn's sm80 family (compute_80),
which the script forces. torch's own kernels carry no PTX this GPU can use under that
variable (they fail with "no kernel image"), so the script launches none: inputs are drawn
on the CPU and copied over, outputs copied back, references computed on the CPU in float64.
Each case checks the result and that the sm80 family ran it; the sm90 family, which has no
PTX, must be refused with samattn's error, not crash. Exit status 1 if any case failed.

Without the variable the same cases run from the cubins (a control run). The driver's JIT of
one unit takes about a minute of one core; --jobs N runs the cases in N processes at once.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

import samattn
from samattn import _lib

GPU = torch.device("cuda")


def on_gpu(*shapes, dtype: torch.dtype, seed: int, scale: float = 1.0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(*s, generator=generator) * scale).to(dtype).to(GPU) for s in shapes]


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, terms: int = 1) -> str:
    """'' when got (GPU) is within the dtype's rounding of want (CPU, float64), else why."""
    unit = {torch.float16: 2**-11, torch.bfloat16: 2**-8, torch.float32: 2**-11}[dtype]
    got = got.cpu().double()
    scale = want.abs().max().item() or 1.0
    err = (got - want).abs().max().item()
    bound = (4 * unit + 2**-24 * math.sqrt(terms)) * scale
    return "" if err <= bound else f"max abs error {err:.3g} above {bound:.3g}"


def attention_reference(q, k, v, scale, causal):
    """(out, lse) in float64 on the CPU; q (b, sq, h, d), k and v (b, sk, hk, d)."""
    q, k, v = (t.cpu().double().transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) * scale
    if causal:
        sq, sk = scores.shape[-2:]
        i = torch.arange(sq)[:, None] + sk - sq
        scores = scores.masked_fill(torch.arange(sk)[None, :] > i, -math.inf)
    return (torch.softmax(scores, -1) @ v).transpose(1, 2), torch.logsumexp(scores, -1)


# ------------------------------------------------------------------ cases ----
def gemm_case(m, n, k, dtype, batch=()):
    def run() -> str:
        a, b = on_gpu((*batch, m, k), (*batch, k, n), dtype=dtype, seed=m + n + k)
        want = a.cpu().double() @ b.cpu().double()
        return close(samattn.gemm(a, b), want, dtype, k)

    return f"gemm {dtype} {(*batch, m, n, k)}", run


def softmax_case(shape, dim, dtype):
    def run() -> str:
        x, dy = on_gpu(shape, shape, dtype=dtype, seed=len(shape) + dim, scale=3.0)
        y = samattn.softmax(x, dim)
        want = torch.softmax(x.cpu().double(), dim)
        why = close(y, want, dtype)
        if why:
            return f"forward: {why}"
        dx = torch.ops.samattn.softmax_backward(y, dy, dim)
        dyd, yd = dy.cpu().double(), y.cpu().double()
        want_dx = yd * (dyd - (dyd * yd).sum(dim, keepdim=True))
        why = close(dx, want_dx, dtype, shape[dim])
        return why and f"backward: {why}"

    return f"softmax {dtype} {shape} dim {dim}", run


def attention_case(b, sq, sk, h, hk, d, causal, dtype):
    def run() -> str:
        q, k, v, dout = on_gpu(
            (b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d), (b, sq, h, d), dtype=dtype, seed=d
        )
        scale = d**-0.5
        out, lse, _ = samattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
        want, want_lse = attention_reference(q, k, v, scale, causal)
        why = close(out, want, dtype, sk) or close(lse, want_lse, torch.float32)
        if why:
            return f"forward: {why}"
        dq, dk, dv, _ = torch.ops.samattn.flash_attn_backward(
            dout, q, k, v, out, lse, None, None, sq, sk, scale, causal, -1, -1, 0.0, False
        )
        qr, kr, vr = (t.cpu().double().requires_grad_(True) for t in (q, k, v))
        ref, _ = attention_reference(qr, kr, vr, scale, causal)
        grads = torch.autograd.grad(ref, (qr, kr, vr), dout.cpu().double())
        for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), grads):
            # Gradients go through the stored (rounded) output: a wider bound.
            err = (got.cpu().double() - want).abs().max().item()
            bound = 32 * 2**-11 * (want.abs().max().item() or 1.0)
            if dtype == torch.bfloat16:
                bound *= 8
            if err > bound:
                return f"{name}: max abs error {err:.3g} above {bound:.3g}"
        return ""

    return f"attention {dtype} b{b} sq{sq} sk{sk} h{h}/{hk} d{d} causal={causal}", run


def decode_case(dtype):
    def run() -> str:
        b, h, hk, d, cache = 2, 8, 2, 128, 512
        q, k_cache, v_cache = on_gpu((b, 1, h, d), (b, cache, hk, d), (b, cache, hk, d),
                                     dtype=dtype, seed=7)  # fmt: skip
        lengths = torch.tensor([1, 433], dtype=torch.int32)
        out = samattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=lengths.to(GPU), num_splits=4
        )
        for i, n in enumerate(lengths.tolist()):
            want, _ = attention_reference(
                q[i : i + 1], k_cache[i : i + 1, :n], v_cache[i : i + 1, :n], d**-0.5, False
            )
            why = close(out[i : i + 1], want, dtype, n)
            if why:
                return f"sequence {i}: {why}"
        return ""

    return f"decode {dtype} (split keys)", run


CASES: list[tuple[str, Callable[[], str]]] = [
    gemm_case(127, 65, 200, torch.float16),
    gemm_case(256, 256, 512, torch.bfloat16),
    gemm_case(33, 17, 1000, torch.float32),
    gemm_case(40, 24, 72, torch.float16, batch=(3,)),
    softmax_case((33, 1000), -1, torch.float32),
    softmax_case((7, 300, 5), 1, torch.float16),
    softmax_case((4, 70000), -1, torch.bfloat16),
    attention_case(2, 130, 200, 4, 2, 64, False, torch.float16),
    attention_case(1, 96, 96, 2, 2, 128, True, torch.bfloat16),
    attention_case(1, 64, 64, 2, 1, 256, True, torch.float16),
    decode_case(torch.float16),
]


def run_case(name: str, case: Callable[[], str]) -> dict:
    began = time.perf_counter()
    _lib.set_last_family(_lib.FAMILY_AUTO)
    try:
        with samattn.use_family("sm80"):
            why = case()
        torch.cuda.synchronize()
        family = _lib.last_family()
        if not why and family != "sm80":
            why = f"ran on family {family}, not sm80"
    except samattn.UnsupportedError as error:
        why = str(error).splitlines()[0]
        if "which this build left out" in why:  # a subset build (SAMATTN_ATTENTION_HEAD_DIMS)
            return {"case": name, "ok": True, "why": f"skipped: {why}", "s": 0.0}
    except Exception as error:  # reported, not raised: the other cases still run
        why = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        traceback.print_exc()
    return {"case": name, "ok": not why, "why": why, "s": round(time.perf_counter() - began, 2)}


def sm90_under_forced_jit() -> dict:
    """The sm90 family carries no PTX, only sm_90a cubins, which no other GPU can run. Forced
    under CUDA_FORCE_PTX_JIT=1, it must either be refused with samattn's error or, where the
    driver keeps an arch-specific cubin it cannot rebuild from PTX, run right on sm90; never
    crash or hand over silently."""
    b, s, h, d = 1, 192, 2, 64  # more query rows than decode-shaped calls (sm80's)
    q, k, v = on_gpu((b, s, h, d), (b, s, h, d), (b, s, h, d), dtype=torch.bfloat16, seed=1)
    name = "sm90 forced under forced JIT"
    _lib.set_last_family(_lib.FAMILY_AUTO)
    try:
        with samattn.use_family("sm90"):
            out = samattn.flash_attn_func(q, k, v)
        torch.cuda.synchronize()
    except samattn.UnsupportedError as error:
        return {"case": name, "ok": True, "why": f"refused: {str(error).splitlines()[0]}", "s": 0}
    except Exception as error:
        return {"case": name, "ok": False, "why": f"{type(error).__name__}: {error}", "s": 0}
    family = _lib.last_family()
    if family != "sm90":
        return {"case": name, "ok": False, "why": f"ran on {family}", "s": 0}
    why = close(out, attention_reference(q, k, v, d**-0.5, False)[0], torch.bfloat16, s)
    return {"case": name, "ok": not why, "why": why or "ran its sm_90a cubin, right", "s": 0}


def in_own_process(index: int) -> dict:
    """Case `index` run by a child process of this script (its JIT runs on its own core)."""
    name = CASES[index][0]
    child = subprocess.run(
        [sys.executable, __file__, "--case", str(index)], capture_output=True, text=True
    )
    lines = child.stdout.strip().splitlines()
    if child.returncode in (0, 1) and lines and lines[-1].startswith("{"):
        return json.loads(lines[-1])
    why = f"the process exited with {child.returncode}: {child.stderr.strip()[-300:]}"
    return {"case": name, "ok": False, "why": why, "s": 0.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once, one per process")
    parser.add_argument("--case", type=int, help=argparse.SUPPRESS)  # one case, for --jobs
    args = parser.parse_args()
    if args.case is not None:
        result = run_case(*CASES[args.case])
        print(json.dumps(result))
        return 0 if result["ok"] else 1
    jit = os.environ.get("CUDA_FORCE_PTX_JIT") == "1"

    def report(r: dict) -> dict:  # as each finishes: the first JIT of a unit takes a minute
        verdict = "ok  " if r["ok"] else "FAIL"
        print(f"{verdict} {r['s']:7.2f}s  {r['case']}  {r['why']}", flush=True)
        return r

    if args.jobs > 1:
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda i: report(in_own_process(i)), range(len(CASES))))
    else:
        results = [report(run_case(name, case)) for name, case in CASES]
    if jit and "sm90" in samattn.built_families():
        results.append(report(sm90_under_forced_jit()))
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results) - failed} passed, {failed} failed (CUDA_FORCE_PTX_JIT={int(jit)}, "
          f"{torch.cuda.get_device_name()})")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            record = {"gpu": torch.cuda.get_device_name(), "force_ptx_jit": jit}
            record.update(samattn=samattn.__version__, results=results)
            json.dump(record, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
