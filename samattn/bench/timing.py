"""How samattn.bench and the profiling scripts (benchmarks/profiling/) time a call.

- ``Timer.median_ms``: GPU time per call, CUDA events, median of 20-200 calls, the GPU kept
  busy while the CPU queues them (host time does not count), inputs rotated past the L2
  cache. Every throughput record of samattn.bench.
- ``gpu_ms``: a plain median of CUDA-event times, each call synchronized (the one-off
  scripts' timing: host time between calls may count for tiny calls).
- ``host_us``, ``host_us_pair``, ``host_us_alternating``: host (CPU) time per eager call, a
  tight loop of asynchronous calls; the pair and alternating forms take turns round by
  round, so that a drift of a shared host's speed reaches every function alike.
- ``queued_gpu_us``, ``graph_gpu_us``: GPU time per call queued back to back (an eager loop
  as a user runs it) and replayed from a captured CUDA graph.
- ``kernel_means``: GPU time of each kernel a call launches (torch.profiler).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch


class Timer:
    """Median GPU time of a call, with inputs rotated through several sets."""

    def __init__(self, quick: bool) -> None:
        self.target_s = 0.05 if quick else 0.2
        self.min_reps, self.max_reps = (10, 50) if quick else (20, 200)
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.l2_bytes = getattr(props, "L2_cache_size", 0) or 50 * 2**20
        # torch.cuda._sleep counts GPU clock cycles; clock_rate is in kHz = cycles per ms.
        self.cycles_per_ms = getattr(props, "clock_rate", 0) or 2_000_000

    def input_set_count(self, set_bytes: int) -> int:
        """How many input sets to rotate so that their total is well past the L2 cache."""
        if set_bytes >= 2 * self.l2_bytes:
            return 1
        return min(64, math.ceil(3 * self.l2_bytes / max(set_bytes, 1)))

    def _sleep(self, ms: float) -> None:
        torch.cuda._sleep(int(min(ms, 2000.0) * self.cycles_per_ms))

    def median_ms(self, fn: Callable[..., object], input_sets: Sequence[tuple]) -> float:
        """Median GPU ms of fn(*input_sets[i % len(input_sets)]) over the timed calls."""
        sets = len(input_sets)
        # Warm-up, also measuring how long the CPU takes to queue one call.
        warmup = max(3, min(sets, 10))
        torch.cuda.synchronize()
        started = time.perf_counter()
        for i in range(warmup):
            fn(*input_sets[i % sets])
        cpu_ms = (time.perf_counter() - started) * 1e3 / warmup
        torch.cuda.synchronize()

        # A first estimate of the GPU time per call picks the repetitions.
        estimate_calls = max(3, min(sets, 10))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._sleep(estimate_calls * cpu_ms * 1.5 + 1)
        start.record()
        for i in range(estimate_calls):
            fn(*input_sets[i % sets])
        end.record()
        torch.cuda.synchronize()
        gpu_ms = max(start.elapsed_time(end) / estimate_calls, 1e-3)
        reps = int(min(self.max_reps, max(self.min_reps, self.target_s * 1e3 / gpu_ms)))

        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(reps)
        ]
        self._sleep(reps * cpu_ms * 1.3 + 1)
        for i, (start, end) in enumerate(events):
            start.record()
            fn(*input_sets[i % sets])
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events)


def gpu_ms(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Median GPU ms of fn() over `reps` calls after `warmup`, each between two CUDA events
    and synchronized (no GPU kept busy: for calls much longer than their launch)."""
    for _ in range(warmup):
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


def host_us(fn: Callable[[], object], calls: int = 100, rounds: int = 15) -> float:
    """Median host time per call of `calls` asynchronous calls in a row (the GPU drained
    between rounds, so its queue never throttles the loop)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - started) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def host_us_pair(
    first: Callable[[], object],
    second: Callable[[], object],
    calls: int = 100,
    rounds: int = 21,
) -> tuple[float, float]:
    """host_us of two calls, measured in alternating rounds: the machine's host is shared
    and its speed drifts (up to 2x between runs), and a drift must reach both alike."""
    times = host_us_alternating({"first": first, "second": second}, calls, rounds)
    return times["first"], times["second"]


def host_us_alternating(
    functions: dict[str, Callable[[], object]],
    calls: int = 100,
    rounds: int = 21,
    warmup: int = 5,
    synchronize: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Median host µs per call of each function, the functions taking turns round by round
    (as host_us_pair, for any number of them). `synchronize` drains the device between
    rounds (default torch.cuda.synchronize; a no-op for CPU-only measurements)."""
    synchronize = synchronize or torch.cuda.synchronize
    for fn in functions.values():
        for _ in range(warmup):
            fn()
    synchronize()
    samples: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(rounds):
        for name, fn in functions.items():
            started = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - started) / calls * 1e6)
            synchronize()
    return {name: statistics.median(times) for name, times in samples.items()}


def queued_gpu_us(fn: Callable[[], object], calls: int = 100, rounds: int = 10) -> float:
    """GPU time per call of calls issued back to back, as an eager loop meets it: when the
    host is slower than the kernels, this is the host's time."""
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def graph_gpu_us(fn: Callable[[], object], calls: int = 20, rounds: int = 10) -> float:
    """GPU time per call replayed from a captured CUDA graph of `calls` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def kernel_means(fn: Callable[[], object], calls: int = 20) -> dict[str, float]:
    """{kernel name (first 90 characters): mean µs per launch} over `calls` calls of fn,
    after 5 warm-up calls (torch.profiler's CUDA events)."""
    from torch.profiler import ProfilerActivity, profile

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
