"""Reference timings for the standalone checkers: torch SDPA forward and
backward (flash and cuDNN backends), bf16, batch*seqlen = 16k, heads*d = 2048.

    python sdpa_times.py OUT.json
"""

import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, reps=20):
    for _ in range(3):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stop = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for a, b in zip(start, stop):
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(start, stop))
    return 0.5 * (times[reps // 2 - 1] + times[reps // 2])


rows = []
for d in (64, 128, 256):
    for s in (1024, 4096, 16384):
        b, h = 16384 // s, 2048 // d
        q, k, v, do = (
            torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            for _ in range(4)
        )
        for causal in (False, True):
            flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
            for name, backend in (
                ("flash", SDPBackend.FLASH_ATTENTION),
                ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ):
                row = {"d": d, "seqlen": s, "causal": causal, "backend": name}
                try:
                    with sdpa_kernel(backend):
                        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                        fwd = median_ms(lambda: F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal))
                        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                        bwd = median_ms(
                            lambda: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)
                        )
                    row.update(
                        fwd_ms=fwd,
                        bwd_ms=bwd,
                        fwd_tflops=flops / fwd / 1e9,
                        bwd_tflops=2.5 * flops / bwd / 1e9,
                    )
                except Exception as e:  # noqa: BLE001
                    row["error"] = str(e)[:200]
                print(row, flush=True)
                rows.append(row)
        del q, k, v, do
json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, open(sys.argv[1], "w"), indent=1)
