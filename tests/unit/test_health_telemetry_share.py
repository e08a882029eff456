"""The cross-rank telemetry summary: every rank encodes its sample as a LogPointShare, the log
point sums and maxes them, and records() gives the exact min and max and a median within half a
bin."""

from __future__ import annotations

import math
import random
import statistics

import pynvml
import pytest

from trainbox.health import telemetry_share
from trainbox.health.logpoint import LogPointShare
from trainbox.health.telemetry_share import METRICS, REASONS

SCALES = {metric.name: metric.scale for metric in METRICS}


def all_reduce(parts: list[LogPointShare]) -> LogPointShare:
    """What the log point's all-reduce makes of the ranks' Shares: SUM of sums, MAX of maxes."""
    return LogPointShare(
        sums=tuple(map(sum, zip(*(p.sums for p in parts), strict=True))),
        maxes=tuple(map(max, zip(*(p.maxes for p in parts), strict=True))),
    )


def random_rank(rng: random.Random) -> dict[str, float]:
    """One rank's readings, anywhere inside each metric's range."""
    return {m.name: rng.uniform(m.scale.low, m.scale.high) for m in METRICS}


@pytest.mark.parametrize("ranks", [1, 2, 3, 8, 257])
def test_min_max_are_exact_and_the_median_within_half_a_bin(ranks: int) -> None:
    rng = random.Random(ranks)
    samples = [random_rank(rng) for _ in range(ranks)]
    whole = all_reduce([telemetry_share.encode(s, reasons=0) for s in samples])
    records = {r["kind"]: r for r in telemetry_share.records(whole, step=40)}
    for metric in METRICS:
        record = records[metric.kind]
        values = [s[metric.name] for s in samples]
        assert record[f"{metric.name}_min"] == pytest.approx(min(values), abs=1e-3)
        assert record[f"{metric.name}_max"] == pytest.approx(max(values), abs=1e-3)
        exact = statistics.median_low(values)
        assert abs(record[f"{metric.name}_p50"] - exact) <= metric.scale.width / 2 + 1e-3
    assert records["gpu"]["ranks"] == records["host"]["ranks"] == ranks
    assert records["gpu"]["step"] == 40


def test_identical_ranks_report_their_value_as_the_median() -> None:
    whole = all_reduce([telemetry_share.encode({"util": 97, "power_w": 551}, reasons=0)] * 5)
    (gpu,) = telemetry_share.records(whole, step=1)
    assert (gpu["util_min"], gpu["util_p50"], gpu["util_max"]) == (97, 97, 97)
    assert gpu["power_w_p50"] == 551


def test_values_past_the_range_keep_exact_extremes_and_a_median_between_them() -> None:
    high = SCALES["power_w"].high
    whole = all_reduce([telemetry_share.encode({"power_w": high + 500}, reasons=None)] * 3)
    (gpu,) = telemetry_share.records(whole, step=1)
    assert gpu["power_w_min"] == gpu["power_w_p50"] == gpu["power_w_max"] == high + 500


def test_a_metric_some_ranks_cannot_read_is_summarised_over_the_others() -> None:
    parts = [
        telemetry_share.encode({"util": 10, "power_w": 300}, reasons=0),
        telemetry_share.encode({"util": 20}, reasons=0),  # power NOT_SUPPORTED on this GPU
        telemetry_share.encode({"util": 30, "power_w": 500}, reasons=0),
    ]
    (gpu,) = telemetry_share.records(all_reduce(parts), step=1)
    assert gpu["ranks"] == 3
    assert (gpu["power_w_min"], gpu["power_w_max"]) == (300, 500)
    assert gpu["power_w_p50"] == pytest.approx(305)  # lower median 300, centre of its 10 W bin
    assert "temp_c_p50" not in gpu  # no rank read it


def test_throttle_reasons_count_the_ranks_with_each_bit() -> None:
    thermal = pynvml.nvmlClocksEventReasonHwThermalSlowdown
    power = pynvml.nvmlClocksEventReasonSwPowerCap
    parts = [
        telemetry_share.encode({"util": 90}, reasons=thermal | power),
        telemetry_share.encode({"util": 90}, reasons=thermal),
        telemetry_share.encode({"util": 90}, reasons=0),
    ]
    (gpu,) = telemetry_share.records(all_reduce(parts), step=1)
    assert gpu["throttle_hw_thermal_slowdown"] == 2
    assert gpu["throttle_sw_power_cap"] == 1
    assert gpu["throttle_hw_slowdown"] == 0


def test_reason_bits_are_nvmls() -> None:
    names = {
        "gpu_idle": "GpuIdle",
        "applications_clocks": "ApplicationsClocksSetting",
        "sw_power_cap": "SwPowerCap",
        "hw_slowdown": "HwSlowdown",
        "sync_boost": "SyncBoost",
        "sw_thermal_slowdown": "SwThermalSlowdown",
        "hw_thermal_slowdown": "HwThermalSlowdown",
        "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
    }
    assert {name: bit for name, bit in REASONS} == {
        ours: getattr(pynvml, f"nvmlClocksEventReason{theirs}") for ours, theirs in names.items()
    }


def test_the_worst_ecc_count_is_reported() -> None:
    parts = [
        telemetry_share.encode({"util": 1, "ecc_uncorrected": n}, reasons=0) for n in (0, 3, 1)
    ]
    (gpu,) = telemetry_share.records(all_reduce(parts), step=1)
    assert gpu["ecc_uncorrected_max"] == 3


def test_ranks_without_a_gpu_give_only_a_host_record() -> None:
    parts = [telemetry_share.encode({"cpu_percent": 180.0, "rss_mib": 2048}, reasons=None)] * 2
    (host,) = telemetry_share.records(all_reduce(parts), step=5)
    assert host == {
        "kind": "host",
        "step": 5,
        "ranks": 2,
        "cpu_percent_min": 180,
        "cpu_percent_p50": 180,
        "cpu_percent_max": 180,
        "rss_mib_min": 2048,
        "rss_mib_p50": 2048,
        "rss_mib_max": 2048,
    }


def test_a_rank_without_a_sample_yet_counts_nothing() -> None:
    parts = [telemetry_share.empty(), telemetry_share.encode({"util": 50}, reasons=0)]
    (gpu,) = telemetry_share.records(all_reduce(parts), step=1)
    assert gpu["ranks"] == 1
    assert gpu["util_min"] == gpu["util_max"] == 50
    assert telemetry_share.records(all_reduce([telemetry_share.empty()] * 3), step=1) == []


def test_every_share_has_the_same_fixed_size() -> None:
    # The all-reduce needs the same layout on every rank, whatever each one could measure.
    sizes = {
        (len(s.sums), len(s.maxes))
        for s in (
            telemetry_share.empty(),
            telemetry_share.encode({"util": 1.0}, reasons=0xFF),
            telemetry_share.encode(random_rank(random.Random(0)), reasons=None),
        )
    }
    assert sizes == {(telemetry_share.SUMS, telemetry_share.MAXES)}


def test_a_share_of_another_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="sums"):
        telemetry_share.records(LogPointShare(sums=(1.0,), maxes=(-math.inf,)), step=1)
