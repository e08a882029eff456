"""What every rank adds to the log point's all-reduces so that every rank sees the whole job.

A part (the straggler detector, GPU telemetry) hands StepMetrics a Share of fixed size: values
to SUM across ranks (histogram counts, totals) and values to MAX (maxima; minima negated). The
log point concatenates every part's share into its one SUM all-reduce and one MAX all-reduce,
so what a part learns costs O(1) bytes per rank, whatever the world size, and no rank gathers.

Histograms use fixed, log-spaced bins, so counts from every rank add up and every rank reads
the same median from the sum.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from typing import Any, Protocol

# The one definition of a part's numbers; telemetry (a layer below) makes them too.
from trainbox.health.share import Share


class Part(Protocol):
    """Something that shares fixed-size numbers at each log point and turns the whole into
    metrics records."""

    def share(self) -> Share:
        """This rank's numbers for this log window (the same sizes on every rank, every time)."""
        ...

    def records(self, whole: Share, *, step: int) -> list[dict[str, Any]]:
        """Records for metrics.jsonl from the all-reduced `whole` (rank 0 writes them).

        A record of kind "train" adds its fields to the log point's train line. Every rank
        calls it with the same `whole`, so a part may take a collective decision here.
        """
        ...


def split(whole: Share, like: Sequence[Share]) -> list[Share]:
    """Cut the concatenation of shares shaped `like` back into one Share each."""
    out, at_sum, at_max = [], 0, 0
    for part in like:
        sums = whole.sums[at_sum : at_sum + len(part.sums)]
        maxes = whole.maxes[at_max : at_max + len(part.maxes)]
        out.append(Share(sums=sums, maxes=maxes))
        at_sum, at_max = at_sum + len(part.sums), at_max + len(part.maxes)
    return out


# The histogram's bins: BINS_PER_OCTAVE per doubling from LOWEST_S up to HIGHEST_S seconds, one
# bin below (zero included) and one above. A bin is 9 % wide: medians are that exact.
BINS_PER_OCTAVE = 8
LOWEST_S = 1e-6
HIGHEST_S = 1000.0
INNER_BINS = math.ceil(BINS_PER_OCTAVE * math.log2(HIGHEST_S / LOWEST_S))
BINS = INNER_BINS + 2


def bin_of(seconds: float) -> int:
    """The bin a duration falls in: 0 below LOWEST_S, BINS - 1 at or above HIGHEST_S."""
    if not seconds >= LOWEST_S:  # also NaN
        return 0
    if seconds >= HIGHEST_S:
        return BINS - 1
    inner = math.floor(BINS_PER_OCTAVE * math.log2(seconds / LOWEST_S))
    return min(inner, INNER_BINS - 1) + 1


def bin_middle(index: int) -> float:
    """A duration that stands for bin `index`: its geometric middle (the edges outside)."""
    if index <= 0:
        return 0.0
    if index >= BINS - 1:
        return HIGHEST_S
    return LOWEST_S * 2 ** ((index - 0.5) / BINS_PER_OCTAVE)


def one_hot(seconds: float) -> tuple[float, ...]:
    """This rank's histogram: a count of one in the bin of `seconds`."""
    counts = [0.0] * BINS
    counts[bin_of(seconds)] = 1.0
    return tuple(counts)


def median(counts: Sequence[float]) -> float:
    """The median duration of summed histogram counts (the lower middle of an even count)."""
    total = sum(counts)
    if total <= 0:
        return math.nan
    # Running totals and a bisection: a log point reads two medians of ~240 bins each.
    index = bisect.bisect_left(list(itertools.accumulate(counts)), math.ceil(total / 2))
    return bin_middle(min(index, len(counts) - 1))


# A rank and a duration packed into one number, so that one MAX names the rank with the largest
# duration: whole microseconds above, rank + 1 below (0 means no rank). float64 holds it exactly
# up to 1,000 s and 4 M ranks.
RANK_BITS = 22
MAX_US = 2 ** (53 - RANK_BITS) - 1


def pack(seconds: float, rank: int) -> float:
    """(duration, rank) as one number whose maximum is the rank with the longest duration."""
    micros = min(max(round(seconds * 1e6), 0), MAX_US)
    return float(micros * 2**RANK_BITS + rank + 1)


def unpack(packed: float) -> tuple[float, int] | None:
    """(duration in seconds, rank) from pack(), or None for no rank."""
    whole = int(packed)
    rank = whole % 2**RANK_BITS - 1
    if rank < 0:
        return None
    return (whole >> RANK_BITS) / 1e6, rank
