"""Question: What does any Python autograd node cost on the host, and what does samattn add to it?

The host-time floor of a Python autograd node, against samattn's and torch's own.

samattn's ops reach autograd through a Python ``torch.autograd.Function`` (as flash-attn's
do): torch.library ops take the same route. This measures, in alternating rounds on the same
tensors, the eager host time per call of forward + backward (``torch.autograd.grad``) and
of the backward alone for

- ``torch``: ``torch.softmax`` (a C++ autograd node);
- ``python_node``: a minimal ``torch.autograd.Function`` whose forward and backward call
  torch's own softmax kernels (``torch.softmax``, ``torch._softmax_backward_data``);
- ``samattn``: ``samattn.softmax``;

so that ``python_node / torch`` is what any Python autograd node costs before its kernels,
and ``samattn / python_node`` what samattn adds to it. One JSON object on stdout.

    python benchmarks/profiling/autograd_floor.py
"""

from __future__ import annotations

import json

import torch

import samattn
from samattn.bench.timing import host_us_alternating


class _TorchKernels(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.softmax(x, -1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch._softmax_backward_data(dy, y, -1, y.dtype)


def _rounded_us(functions: dict) -> dict[str, float]:
    return {name: round(us, 2) for name, us in host_us_alternating(functions).items()}


def main() -> None:
    x = torch.randn(64, 1024, device="cuda", requires_grad=True)
    dy = torch.randn_like(x)
    forwards = {
        "torch": lambda: torch.softmax(x, -1),
        "python_node": lambda: _TorchKernels.apply(x),
        "samattn": lambda: samattn.softmax(x, -1),
    }
    out: dict[str, object] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "case": "softmax, float32 (64, 1024), last dim",
    }
    out["forward_backward_us"] = _rounded_us(
        {name: (lambda f=f: torch.autograd.grad(f(), (x,), dy)) for name, f in forwards.items()}
    )
    kept = {name: f() for name, f in forwards.items()}
    out["backward_only_us"] = _rounded_us(
        {
            name: (lambda y=y: torch.autograd.grad(y, (x,), dy, retain_graph=True))
            for name, y in kept.items()
        }
    )
    out["forward_with_grad_us"] = _rounded_us(forwards)
    for key in ("forward_backward_us", "backward_only_us", "forward_with_grad_us"):
        t = out[key]
        out[key.replace("_us", "_ratios")] = {
            "torch / python_node": round(t["torch"] / t["python_node"], 3),
            "torch / samattn": round(t["torch"] / t["samattn"], 3),
            "python_node / samattn": round(t["python_node"] / t["samattn"], 3),
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
