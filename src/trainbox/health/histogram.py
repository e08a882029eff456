"""Histograms with fixed bins, so that counts from every rank add up to the job's histogram.

Every rank bins its own value on the same scale and the log point SUMs the counts; every rank
then reads the same median from the sum. The median is the lower one (the ceil(n/2)-th smallest
of n ranks), reported as the middle of its bin clamped to the exact extremes, which the log
point's MAX gives: within half a bin of the exact median.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Scale(Protocol):
    """Where a value falls among fixed bins, and the value that stands for a bin."""

    @property
    def bins(self) -> int:
        """How many bins."""
        ...

    def bin(self, value: float) -> int:
        """The bin `value` counts in."""
        ...

    def middle(self, index: int) -> float:
        """The value that stands for bin `index`."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Linear:
    """Bins of one `width` over [low, high); a value outside counts in the nearest end bin."""

    # The lower edge of the first bin.
    low: float
    # The upper edge of the last bin.
    high: float
    # Bin width: the median is within width / 2 of the exact one.
    width: float

    @property
    def bins(self) -> int:
        """How many bins."""
        return math.ceil((self.high - self.low) / self.width)

    def bin(self, value: float) -> int:
        """The bin `value` counts in."""
        return min(max(math.floor((value - self.low) / self.width), 0), self.bins - 1)

    def middle(self, index: int) -> float:
        """The middle of bin `index`."""
        return self.low + (index + 0.5) * self.width


@dataclass(frozen=True, kw_only=True, slots=True)
class Logarithmic:
    """`per_octave` bins per doubling over [low, high), one bin below (zero, NaN) and one above."""

    # The lower edge of the first inner bin.
    low: float
    # The upper edge of the last inner bin.
    high: float
    # Bins per doubling: each is 2 ** (1 / per_octave) wide, the median's relative precision.
    per_octave: int

    @property
    def inner(self) -> int:
        """How many bins lie between low and high."""
        return math.ceil(self.per_octave * math.log2(self.high / self.low))

    @property
    def bins(self) -> int:
        """How many bins, the two outer ones included."""
        return self.inner + 2

    def bin(self, value: float) -> int:
        """The bin `value` counts in: 0 below `low` (or NaN), the last at or above `high`."""
        if not value >= self.low:
            return 0
        if value >= self.high:
            return self.bins - 1
        return min(math.floor(self.per_octave * math.log2(value / self.low)), self.inner - 1) + 1

    def middle(self, index: int) -> float:
        """The geometric middle of bin `index`: 0 for the bin below, `high` for the one above."""
        if index <= 0:
            return 0.0
        if index >= self.bins - 1:
            return self.high
        return self.low * 2 ** ((index - 0.5) / self.per_octave)


def one_hot(value: float, scale: Scale) -> tuple[float, ...]:
    """One rank's histogram: a count of one in the bin of `value`."""
    counts = [0.0] * scale.bins
    counts[scale.bin(value)] = 1.0
    return tuple(counts)


def one_hots(values: Sequence[float], scale: Scale) -> list[float]:
    """Several values' one-rank histograms, back to back (one list, not one tuple each: a log
    point builds them for every part it shares)."""
    counts = [0.0] * (len(values) * scale.bins)
    for at, value in enumerate(values):
        counts[at * scale.bins + scale.bin(value)] = 1.0
    return counts


def median(counts: Sequence[float], scale: Scale, *, low: float, high: float) -> float:
    """The lower median of summed `counts`, clamped to the exact [low, high]; NaN for none."""
    total = sum(counts)
    if total <= 0:
        return math.nan
    # Running totals and a bisection: a log point reads several medians of up to ~330 bins.
    index = bisect.bisect_left(list(itertools.accumulate(counts)), math.ceil(total / 2))
    return min(max(scale.middle(min(index, len(counts) - 1)), low), high)
