"""Histograms whose counts add up across ranks: the median every rank reads from summed counts."""

from __future__ import annotations

import math
import random

import pytest

from trainbox.health import histogram
from trainbox.health.histogram import Linear
from trainbox.health.stragglers import STEP_TIMES


@pytest.mark.parametrize("seed", range(5))
def test_every_rank_reads_the_median_within_a_bin_from_summed_counts(seed: int) -> None:
    draw = random.Random(seed)
    times = [draw.lognormvariate(math.log(0.004), 0.5) for _ in range(draw.randrange(1, 4097))]
    summed = [
        sum(column)
        for column in zip(*(histogram.one_hot(t, STEP_TIMES) for t in times), strict=True)
    ]
    true = sorted(times)[(len(times) - 1) // 2]
    # A bin is 2 ** (1/8) wide: its middle is within half a bin of anything in it.
    assert (
        abs(math.log2(histogram.median(summed, STEP_TIMES, low=0.0, high=math.inf) / true))
        <= 0.5 / STEP_TIMES.per_octave + 1e-9
    )


@pytest.mark.parametrize(
    ("seconds", "index"),
    [
        (0.0, 0),
        (math.nan, 0),
        (STEP_TIMES.low / 2, 0),
        (STEP_TIMES.low, 1),
        (STEP_TIMES.low * 2, 1 + STEP_TIMES.per_octave),
        (STEP_TIMES.high, STEP_TIMES.bins - 1),
        (1e9, STEP_TIMES.bins - 1),
    ],
)
def test_bin_edges(seconds: float, index: int) -> None:
    assert STEP_TIMES.bin(seconds) == index


def test_the_median_of_nothing_is_nan() -> None:
    assert math.isnan(histogram.median([0.0] * STEP_TIMES.bins, STEP_TIMES, low=0, high=1))


@pytest.mark.parametrize(
    ("value", "index"), [(-5.0, 0), (0.0, 0), (9.99, 0), (10.0, 1), (99.0, 9), (500.0, 9)]
)
def test_a_linear_scale_counts_values_outside_in_its_end_bins(value: float, index: int) -> None:
    assert Linear(low=0, high=100, width=10).bin(value) == index


def test_the_median_is_its_bins_middle_clamped_to_the_exact_extremes() -> None:
    scale = Linear(low=0, high=100, width=10)
    counts = histogram.one_hot(51.0, scale)
    assert histogram.median(counts, scale, low=40.0, high=60.0) == 55.0
    assert histogram.median(counts, scale, low=51.0, high=52.0) == 52.0
    assert histogram.median(counts, scale, low=57.0, high=58.0) == 57.0


def test_several_values_histograms_lie_back_to_back() -> None:
    values = [0.0, 0.004, 2e3]
    assert histogram.one_hots(values, STEP_TIMES) == [
        count for value in values for count in histogram.one_hot(value, STEP_TIMES)
    ]
