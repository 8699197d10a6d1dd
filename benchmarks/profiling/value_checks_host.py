"""Question: Does an eager varlen or KV-cache call wait for the GPU, and what do the value
checks cost on the host?

Value checks on the host (samattn.set_value_checks): does an eager varlen or KV-cache
call wait for the GPU, and what does it cost on the host?

Modes: checks on (a check that passed is kept for the same unmodified tensors), on but
read again on every call (the kept checks cleared before each call: what every call did
before), and off. blocked_us: the call's host time right after a 2 ms sleep kernel was
queued (a call that synchronizes waits it out; this is how a sync is seen, not a way to
hide host cost); host_us: median host time of single calls with the GPU idle. The modes
alternate, 30 rounds. Writes JSON:

    SAMATTN_LIBRARY=... PYTHONPATH=. python benchmarks/profiling/value_checks_host.py out.json
"""

import json
import statistics
import sys
import time

import torch

import samattn
from samattn import _cuda

MODES = ("cached", "every_call", "off")


def set_mode(mode: str) -> None:
    samattn.set_value_checks(mode != "off")
    if mode == "every_call":
        _cuda._verified.clear()


def main() -> None:
    dev = "cuda"
    lens = [100, 37, 250, 1]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    q, k, v = (torch.randn(sum(lens), 8, 64, device=dev, dtype=torch.bfloat16) for _ in range(3))
    k_cache = torch.randn(4, 1024, 8, 64, device=dev, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    q_step = torch.randn(4, 1, 8, 64, device=dev, dtype=torch.bfloat16)
    seqlens = torch.tensor([100, 500, 1000, 3], dtype=torch.int32, device=dev)
    calls = {
        "varlen": lambda: samattn.flash_attn_varlen_func(
            q, k, v, cu, cu, max(lens), max(lens), causal=True
        ),
        "decode": lambda: samattn.flash_attn_with_kvcache(
            q_step, k_cache, v_cache, cache_seqlens=seqlens, causal=True
        ),
    }
    cycles = int(torch.cuda.get_device_properties(0).clock_rate * 1e3 * 2e-3)  # about 2 ms
    result: dict = {"gpu": torch.cuda.get_device_name()}
    for op, fn in calls.items():
        for mode in MODES:
            set_mode(mode)
            fn()
        torch.cuda.synchronize()
        blocked: dict[str, list[float]] = {mode: [] for mode in MODES}
        host: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(30):
            for mode in MODES:
                set_mode(mode)
                torch.cuda._sleep(cycles)
                start = time.perf_counter()
                fn()
                blocked[mode].append((time.perf_counter() - start) * 1e6)
                torch.cuda.synchronize()
                set_mode(mode)
                start = time.perf_counter()
                fn()
                host[mode].append((time.perf_counter() - start) * 1e6)
                torch.cuda.synchronize()
        for mode in MODES:
            result[f"{op}_{mode}_blocked_us"] = statistics.median(blocked[mode])
            result[f"{op}_{mode}_host_us"] = statistics.median(host[mode])
    samattn.set_value_checks(True)
    print(json.dumps(result, indent=1))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
