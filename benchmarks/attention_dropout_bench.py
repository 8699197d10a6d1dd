"""What attention dropout costs: samattn (sm80 family forced, dropout_p 0 and 0.1; and
automatic selection, sm90 on the H100, with both) beside torch SDPA's flash backend
(FlashAttention-2) with and without dropout, bf16, forward and forward + backward (GPU ms,
median of 20, CUDA events). Writes JSON:

    SAMATTN_LIBRARY=... PYTHONPATH=. python benchmarks/attention_dropout_bench.py out.json
"""

import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import samattn


def gpu_ms(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(d: int, seqlen: int, causal: bool) -> dict:
    b, h = 16384 // seqlen, 2048 // d
    q, k, v = (
        torch.randn(b, seqlen, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    row = {"d": d, "seqlen": seqlen, "batch": b, "heads": h, "causal": causal}

    def ours(p, family):
        def call():
            with samattn.use_family(family):
                return samattn.flash_attn_func(q, k, v, p, causal=causal)

        return call

    def sdpa(p):
        def call():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, dropout_p=p, is_causal=causal)

        return call

    def with_backward(forward):
        def call():
            out = forward()
            out.backward(dout if out.shape == dout.shape else dout.transpose(1, 2))

        return call

    calls = {
        "sm80_p0": ours(0.0, "sm80"),
        "sm80_p0.1": ours(0.1, "sm80"),
        "auto_p0": ours(0.0, None),
        "auto_p0.1": ours(0.1, None),
        "sdpa_flash_p0": sdpa(0.0),
        "sdpa_flash_p0.1": sdpa(0.1),
    }
    flops = 4 * b * h * seqlen * seqlen * d * (0.5 if causal else 1)
    for name, forward in calls.items():
        for what, fn, factor in (("fwd", forward, 1.0), ("fwdbwd", with_backward(forward), 3.5)):
            ms = gpu_ms(fn)
            row[f"{name}_{what}_ms"] = ms
            row[f"{name}_{what}_tflops"] = flops * factor / ms / 1e9
    return row


def main(path: str) -> None:
    rows = []
    for d in (64, 128):
        for seqlen in (1024, 4096):
            for causal in (False, True):
                row = measure(d, seqlen, causal)
                rows.append(row)
                print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()
                       if not k.endswith("tflops")}, flush=True)  # fmt: skip
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
