"""Question: Why is an attention case short of its target? (one call for Nsight Compute)

One attention call, forward or backward, of samattn or of SDPA's cuDNN backend, inside
a CUDA profiler range, for Nsight Compute (the issue's shapes short of their target):

    ncu --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \\
        --section WarpStateStats --section Occupancy --section LaunchStats --page raw --csv \\
        python benchmarks/profiling/ncu_attention_cases.py CASE IMPL

CASE is one of CASES (direction, head dim, seqlen, causal; batch x seqlen = 16k tokens and
heads x head dim = 2048, as samattn.bench); IMPL is samattn or cudnn. bf16. The call is
warmed up three times first; a backward's forward runs outside the range.
"""

from __future__ import annotations

import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import samattn

CASES = {
    "fwd_d64_1k": ("fwd", 64, 1024, False),
    "fwd_d64_1k_causal": ("fwd", 64, 1024, True),
    "fwd_d256_16k": ("fwd", 256, 16384, False),
    "bwd_d64_4k": ("bwd", 64, 4096, False),
    "bwd_d128_4k": ("bwd", 128, 4096, False),
}


def main() -> None:
    direction, d, seqlen, causal = CASES[sys.argv[1]]
    impl = sys.argv[2]
    batch, heads = 16384 // seqlen, 2048 // d
    torch.manual_seed(0)
    # (batch, seqlen, heads, d) for samattn; SDPA reads the same tensors transposed.
    q, k, v = (
        torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16).requires_grad_(
            direction == "bwd"
        )
        for _ in range(3)
    )
    dout = torch.randn_like(q)

    def forward() -> torch.Tensor:
        if impl == "samattn":
            return samattn.flash_attn_func(q, k, v, causal=causal)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(
                *(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal
            )
        return out.transpose(1, 2)

    def call(profile: bool) -> None:
        """The profiled direction, in the profiler's range when profile is set."""
        out = forward() if direction == "bwd" else None
        torch.cuda.synchronize()
        if profile:
            torch.cuda.cudart().cudaProfilerStart()
        if direction == "fwd":
            forward()
        else:
            torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
        if profile:
            torch.cuda.cudart().cudaProfilerStop()

    for _ in range(3):
        call(profile=False)
    call(profile=True)


if __name__ == "__main__":
    main()
