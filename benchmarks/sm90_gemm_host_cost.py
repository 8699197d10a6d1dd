"""The sm90 GEMM's host cost: its C call against the sm80 family's on the same operands,
then eager pairs against torch (alternating rounds), for the GEMM and attention rows of
`samattn.bench --ops overhead`. Needs a library with gemm and attention (head dim 64).

    python benchmarks/sm90_gemm_host_cost.py out.json
"""

from __future__ import annotations

import ctypes
import json
import sys

import torch
import torch.nn.functional as F

import samattn
from samattn import _cuda, _lib
from samattn.bench import host_us, host_us_pair

DEVICE = torch.device("cuda")


def c_call_us(a: torch.Tensor, b: torch.Tensor, family: str | None) -> tuple[float, str]:
    """Host µs of samattn_gemm alone, with the prepared arguments of a @ b, and the family
    that ran it."""
    with samattn.use_family(family):
        samattn.gemm(a, b)
        entry = _cuda._GEMM.get(_cuda._gemm_key(a, b, 1.0))
        function = _lib.lib().samattn_gemm
        args = _cuda._GEMM.args(entry)
        d = torch.empty(entry.out_shape, dtype=a.dtype, device=DEVICE)
        args.a, args.b, args.d = a.data_ptr(), b.data_ptr(), d.data_ptr()
        args.stream = _cuda._stream(a)
        workspace = None
        if entry.workspace:
            workspace = torch.empty(entry.workspace, dtype=torch.uint8, device=DEVICE)
            args.workspace, args.workspace_bytes = workspace.data_ptr(), entry.workspace
        ran = ctypes.c_int32()
        assert function(ctypes.byref(args), ctypes.byref(ran)) == 0, _lib.last_error()
        us = host_us(lambda: function(ctypes.byref(args), ctypes.byref(ran)), calls=300)
        return round(us, 2), _lib.FAMILY_NAMES.get(ran.value, str(ran.value))


def attention_pair(grad: bool):
    q = torch.randn(1, 128, 8, 64, dtype=torch.bfloat16, device=DEVICE, requires_grad=grad)
    k, v = (
        torch.randn(1, 512, 8, 64, dtype=torch.bfloat16, device=DEVICE, requires_grad=grad)
        for _ in "kv"
    )
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    if not grad:
        return (
            lambda: samattn.flash_attn_func(q, k, v),
            lambda: F.scaled_dot_product_attention(qt, kt, vt),
        )
    do = torch.randn_like(q)
    return (
        lambda: torch.autograd.grad(samattn.flash_attn_func(q, k, v), (q, k, v), do),
        lambda: torch.autograd.grad(
            F.scaled_dot_product_attention(qt, kt, vt), (q, k, v), do.transpose(1, 2)
        ),
    )


def main() -> None:
    out: dict = {"library": str(_lib.library_path()), "gpu": torch.cuda.get_device_name()}
    big = [torch.randn(1024, 1024, dtype=torch.bfloat16, device=DEVICE) for _ in "ab"]
    small = [torch.randn(64, 64, dtype=torch.bfloat16, device=DEVICE) for _ in "ab"]
    out["c_call_us"] = {
        f"{name} {family or 'auto'} #{round_}": c_call_us(a, b, family)
        for round_ in range(2)
        for name, (a, b) in (("1024", big), ("64", small))
        for family in (None, "sm80")
    }
    a, b = big
    a64, b64 = small
    xl = torch.randn(64, 1024, dtype=torch.bfloat16, device=DEVICE)
    bias = torch.randn(1024, dtype=torch.bfloat16, device=DEVICE)
    ag, bg = a64.clone().requires_grad_(), b64.clone().requires_grad_()
    dd = torch.randn(64, 64, dtype=torch.bfloat16, device=DEVICE)
    grad = torch.autograd.grad
    cases = {
        "gemm 1024": (lambda: samattn.gemm(a, b), lambda: a @ b),
        "gemm 64": (lambda: samattn.gemm(a64, b64), lambda: a64 @ b64),
        "linear_gelu": (
            lambda: samattn.linear(xl, a, bias, activation="gelu"),
            lambda: F.gelu(F.linear(xl, a, bias)),
        ),
        "attention": attention_pair(False),
        "gemm fwd+bwd": (
            lambda: grad(samattn.gemm(ag, bg), (ag, bg), dd),
            lambda: grad(ag @ bg, (ag, bg), dd),
        ),
        "attention fwd+bwd": attention_pair(True),
    }
    out["pairs"] = {}
    for name, (ours, theirs) in cases.items():
        x, y = host_us_pair(ours, theirs, calls=100, rounds=21)
        ratio = round(y / x, 3)
        out["pairs"][name] = {"samattn": round(x, 1), "torch": round(y, 1), "ratio": ratio}
        print(name, out["pairs"][name], flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
