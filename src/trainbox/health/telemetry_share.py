"""Telemetry at the log point: one rank's latest sample as a fixed-size LogPointShare, and the
records decoded from every rank's shares all-reduced: min, median and max per metric, O(1) bytes
per rank.

The median comes from a histogram per metric with linear bins (health/histogram.py): within
half a bin width of the exact one for values inside the metric's range.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainbox.health import histogram
from trainbox.health.histogram import Linear
from trainbox.health.logpoint import LogPointShare


@dataclass(frozen=True, kw_only=True, slots=True)
class Metric:
    """A sampled number summarised as min, median and max over the ranks."""

    # The record's field prefix: NAME_min, NAME_p50, NAME_max.
    name: str
    # Which record it goes in: "gpu" or "host".
    kind: str
    # Its histogram's bins.
    scale: Linear


# Ranges cover today's largest parts (B300: 288 GB, GB300: 1400 W) with room to spare.
METRICS = (
    Metric(name="util", kind="gpu", scale=Linear(low=0, high=100, width=1)),
    Metric(name="mem_used_mib", kind="gpu", scale=Linear(low=0, high=320 * 1024, width=1024)),
    Metric(name="power_w", kind="gpu", scale=Linear(low=0, high=1600, width=10)),
    Metric(name="temp_c", kind="gpu", scale=Linear(low=0, high=128, width=1)),
    Metric(name="sm_clock_mhz", kind="gpu", scale=Linear(low=0, high=3200, width=25)),
    # The process's CPU use over the last sample period; 100 is one busy core.
    Metric(name="cpu_percent", kind="host", scale=Linear(low=0, high=3200, width=25)),
    Metric(name="rss_mib", kind="host", scale=Linear(low=0, high=128 * 1024, width=256)),
)
# NVML's clock event (throttle) reason bits (nvmlClocksEventReason*), by record name: a record
# counts the ranks whose GPU had the bit set.
REASONS = (
    ("gpu_idle", 0x1),
    ("applications_clocks", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
)
KINDS = ("gpu", "host")
# Numbers where only the worst rank matters: all-reduced with MAX alone.
PEAKS = ("ecc_uncorrected",)

_BINS = sum(metric.scale.bins for metric in METRICS)
# sums: every metric's histogram, then ranks per kind, then ranks per reason bit.
SUMS = _BINS + len(KINDS) + len(REASONS)
# maxes: (max, -min) per metric, then the peaks.
MAXES = 2 * len(METRICS) + len(PEAKS)


def encode(values: Mapping[str, float | None], *, reasons: int | None) -> LogPointShare:
    """This rank's LogPointShare: `values` by metric or peak name (None or absent: not measured),
    `reasons` the GPU's clock event bits (None: no GPU reading)."""
    sums = [0.0] * SUMS
    maxes = [-math.inf] * MAXES
    offset = 0
    measured = set()
    for position, metric in enumerate(METRICS):
        value = values.get(metric.name)
        if value is not None:
            sums[offset + metric.scale.bin(value)] = 1.0
            maxes[2 * position], maxes[2 * position + 1] = value, -value
            measured.add(metric.kind)
        offset += metric.scale.bins
    for position, kind in enumerate(KINDS):
        sums[_BINS + position] = 1.0 if kind in measured else 0.0
    if reasons is not None:
        for position, (_name, bit) in enumerate(REASONS):
            sums[_BINS + len(KINDS) + position] = 1.0 if reasons & bit else 0.0
    for position, name in enumerate(PEAKS):
        peak = values.get(name)
        if peak is not None:
            maxes[2 * len(METRICS) + position] = peak
    return LogPointShare(sums=tuple(sums), maxes=tuple(maxes))


def empty() -> LogPointShare:
    """The LogPointShare of a rank with nothing measured yet (counts nothing, raises no maximum)."""
    return encode({}, reasons=None)


def records(whole: LogPointShare, *, step: int) -> list[dict[str, Any]]:
    """metrics.jsonl records of the all-reduced LogPointShare: one per kind some rank measured."""
    if len(whole.sums) != SUMS or len(whole.maxes) != MAXES:
        raise ValueError(f"a telemetry LogPointShare has {SUMS} sums and {MAXES} maxes")
    out: dict[str, dict[str, Any]] = {}
    for position, kind in enumerate(KINDS):
        ranks = round(whole.sums[_BINS + position])
        if ranks:
            out[kind] = {"kind": kind, "step": step, "ranks": ranks}
    offset = 0
    for position, metric in enumerate(METRICS):
        counts = whole.sums[offset : offset + metric.scale.bins]
        offset += metric.scale.bins
        record = out.get(metric.kind)
        if record is None or not any(counts):
            continue  # no rank could read this one
        high, low = whole.maxes[2 * position], -whole.maxes[2 * position + 1]
        record[f"{metric.name}_min"] = _round(low)
        record[f"{metric.name}_p50"] = _round(
            histogram.median(counts, metric.scale, low=low, high=high)
        )
        record[f"{metric.name}_max"] = _round(high)
    gpu = out.get("gpu")
    if gpu is not None:
        for position, (name, _bit) in enumerate(REASONS):
            gpu[f"throttle_{name}"] = round(whole.sums[_BINS + len(KINDS) + position])
        for position, name in enumerate(PEAKS):
            peak = whole.maxes[2 * len(METRICS) + position]
            if peak > -math.inf:
                gpu[f"{name}_max"] = _round(peak)
    return [out[kind] for kind in KINDS if kind in out]


def _round(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 3)
