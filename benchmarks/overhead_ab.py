"""Host time per eager call of samattn against torch for the softmax and attention cases of
`samattn.bench --ops overhead`, as one JSON line: to compare two versions of the Python
layer on one library, run it with each on PYTHONPATH in alternating processes.

    PYTHONPATH=/path/to/old python benchmarks/overhead_ab.py >> ab.jsonl
    PYTHONPATH=/path/to/new python benchmarks/overhead_ab.py >> ab.jsonl
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

import samattn
from samattn.bench import host_us_pair


def main() -> None:
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 1024, device="cuda")
    xg, dy = x.clone().requires_grad_(), torch.randn_like(x)
    q, k = torch.randn(1, 128, 8, 64, **bf16), torch.randn(1, 512, 8, 64, **bf16)
    v = torch.randn_like(k)
    qd, kd = torch.randn(1, 1, 32, 128, **bf16), torch.randn(1, 512, 32, 128, **bf16)
    vd = torch.randn_like(kd)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    qdt, kdt, vdt = (t.transpose(1, 2) for t in (qd, kd, vd))
    cases = {
        "softmax": (lambda: samattn.softmax(x, -1), lambda: torch.softmax(x, -1)),
        "softmax_backward": (
            lambda: torch.autograd.grad(samattn.softmax(xg, -1), (xg,), dy),
            lambda: torch.autograd.grad(torch.softmax(xg, -1), (xg,), dy),
        ),
        "attention": (
            lambda: samattn.flash_attn_func(q, k, v),
            lambda: F.scaled_dot_product_attention(qt, kt, vt),
        ),
        "attention_decode": (
            lambda: samattn.flash_attn_func(qd, kd, vd),
            lambda: F.scaled_dot_product_attention(qdt, kdt, vdt),
        ),
    }
    out: dict[str, object] = {"samattn": samattn.__file__}
    for name, (ours, theirs) in cases.items():
        a, b = host_us_pair(ours, theirs, calls=200, rounds=21)
        out[name] = {"samattn_us": a, "torch_us": b, "ratio": b / a}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
