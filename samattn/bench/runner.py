"""The bookkeeping every routine of samattn.bench shares: families, timings, records."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

import samattn

from .. import _lib
from . import report
from .cases import TERMS_FEATURES
from .common import try_call

# The device-to-device copy whose bandwidth the decode bandwidth is compared with.
COPY_BYTES = 2**30


class TimerLike(Protocol):
    def input_set_count(self, set_bytes: int) -> int: ...

    def median_ms(self, fn: Callable[..., object], input_sets: Sequence[tuple]) -> float: ...


class Bench:
    """Runs the cases of the routines for every family, prints one line per record and
    keeps the records (``records``), the cases no family could run (``skipped``) and the
    errors (``errors``: the run goes on, and exits with 1)."""

    def __init__(
        self,
        timer: TimerLike,
        families: list[str | None],
        terms_features: Sequence[str] = TERMS_FEATURES,
    ) -> None:
        self.timer = timer
        self.families = families  # None: the library's automatic choice
        self.terms_features = tuple(terms_features)  # those --ops terms measures
        self.records: list[dict[str, Any]] = []
        # {"case": label, "reason": message, **the case's fields}: also written to the JSON.
        self.skipped: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._baselines: dict[tuple, float] = {}  # torch's times, measured once per case
        # Baselines that may refuse a case: (ms, None) or (None, why), measured once per case.
        self._optional_baselines: dict[tuple, tuple[float | None, str | None]] = {}
        self._copy_gbps: float | None = None  # the device-to-device copy, measured once
        # What a routine keeps from one case for the next (e.g. decode's contiguous times).
        self.memo: dict[str, dict[Any, Any]] = {}

    # -- timings
    def samattn_ms(
        self, family: str | None, fn: Callable[..., object], input_sets: Sequence[tuple]
    ) -> tuple[float, str]:
        """Median time of fn under `family` (None: automatic), and the family that ran."""
        with samattn.use_family(family):
            _lib.set_last_family(_lib.FAMILY_AUTO)
            fn(*input_sets[0])
            ran = _lib.last_family() or "?"
            return self.timer.median_ms(fn, input_sets), ran

    def baseline_ms(
        self, key: tuple, fn: Callable[..., object], input_sets: Sequence[tuple]
    ) -> float:
        """Median time of torch's fn, measured once per key (the families share it)."""
        if key not in self._baselines:
            self._baselines[key] = self.timer.median_ms(fn, input_sets)
        return self._baselines[key]

    def optional_baseline_ms(
        self, key: tuple, make: Callable[[], tuple[Callable[..., object], Sequence[tuple]]]
    ) -> tuple[float | None, str | None]:
        """(median ms, None) of fn over input_sets, with (fn, input_sets) = make(); or
        (None, the reason) when make() or fn refuses the case. Measured once per key."""
        if key not in self._optional_baselines:
            made: list = []
            reason = try_call(lambda: made.extend(make()))
            if reason is None:
                fn, input_sets = made
                reason = try_call(fn, *input_sets[0])
            if reason is None:
                self._optional_baselines[key] = (self.timer.median_ms(fn, input_sets), None)
            else:
                self._optional_baselines[key] = (None, reason)
        return self._optional_baselines[key]

    def copy_gbps(self) -> float:
        """Device-to-device copy bandwidth (bytes read + written / time) of a COPY_BYTES
        buffer, measured once per run; printed."""
        if self._copy_gbps is None:
            from . import common

            source = torch.empty(COPY_BYTES, dtype=torch.uint8, device=common.DEVICE).fill_(1)
            target = torch.empty_like(source)
            ms = self.timer.median_ms(lambda x, y: y.copy_(x), [(source, target)])
            self._copy_gbps = 2 * COPY_BYTES / 1e9 / (ms / 1e3)
            print(
                f"device-to-device copy: {self._copy_gbps:.0f} GB/s "
                f"(read + write of {COPY_BYTES / 2**30:.3g} GiB)",
                flush=True,
            )
        return self._copy_gbps

    # -- cases
    def run_case(
        self,
        label: str,
        body: Callable[[str | None], None],
        fields: dict[str, Any] | None = None,
    ) -> None:
        """body(family) for every family; a family or build that cannot run the case
        (UnsupportedError) or a feature not implemented yet (NotImplementedError) is recorded
        as skipped, with `fields` describing the case in the JSON."""
        for family in self.families:
            what = f"{label} [{family or 'auto'}]"
            try:
                body(family)
            except (samattn.UnsupportedError, NotImplementedError) as error:
                self.skipped.append(
                    {
                        "case": what,
                        "family": family or "auto",
                        **(fields or {}),
                        "reason": str(error),
                    }
                )
                print(f"  skipped {what}: {str(error).splitlines()[0]}", flush=True)
            except Exception as error:  # keep benchmarking the other cases
                self.errors.append(f"{what}: {type(error).__name__}: {error}")
                print(f"  ERROR {what}: {type(error).__name__}: {error}", flush=True)
                torch.cuda.synchronize()  # a sticky CUDA error ends the run here

    def skip(self, label: str, reason: str, fields: dict[str, Any]) -> None:
        """Records a case that runs for no family (e.g. too large for this GPU)."""
        for family in self.families:
            what = f"{label} [{family or 'auto'}]"
            self.skipped.append(
                {"case": what, "family": family or "auto", **fields, "reason": reason}
            )
        print(f"  skipped {label}: {reason}", flush=True)

    # -- records
    def record(self, **fields: Any) -> None:
        """Keeps and prints a record; its `ratio` is samattn / baseline (None without one)."""
        baseline = fields["baseline"]
        fields["ratio"] = fields["samattn"] / baseline if baseline else None
        self.records.append(fields)
        print(report.format_record(fields), flush=True)

    def record_rate(
        self,
        op: str,
        family: str | None,
        ran: str,
        dtype: str,
        shape: Sequence[int],
        unit: str,
        work: float,
        ms: float,
        base_ms: float | None,
        baseline_name: str | None,
        **fields: Any,
    ) -> None:
        """A record of `work` (TFLOP or GB per call) per second: samattn's in `ms` under
        `family` (None: automatic; `ran` the family that ran), the baseline's in `base_ms`
        (None: no baseline)."""
        self.record(
            op=op,
            family=ran,
            forced=family is not None,
            dtype=dtype,
            shape=list(shape),
            unit=unit,
            samattn=work / (ms / 1e3),
            baseline=work / (base_ms / 1e3) if base_ms else None,
            baseline_name=baseline_name,
            samattn_ms=ms,
            baseline_ms=base_ms,
            **fields,
        )
