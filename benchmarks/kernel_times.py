"""GPU time of each kernel a call launches, from torch.profiler: the helper of the
benchmarks that split a call's time by kernel (split_k_kernels.py, mask_tile_profile.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def kernel_means(fn: Callable[[], object], calls: int = 20) -> dict[str, float]:
    """{kernel name (first 90 characters): mean µs per launch} over `calls` calls of fn,
    after 5 warm-up calls."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(event.name[:90], []).append(event.device_time_total)
    return {name: sum(t) / len(t) for name, t in times.items()}
